package replication

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/related"
)

// selectedSecret is a Secret in ns labelled labels.
func selectedSecret(ns, name string, labels map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret", "data": map[string]any{"k": "dg=="}}}
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetLabels(labels)
	return u
}

// selectedNames returns, per primary workspace, the kcp names of the
// latest set reported ("conflict" / "unresolved" for those states), and
// answers the reports.
func selectedNames(e *Engine) map[string]string {
	out := map[string]string{}
	for _, m := range reportsQueued(e) {
		r := m.GetRelatedObjectReport()
		if r == nil {
			continue
		}
		e.ReportResult(&ferryv1.ReportResult{ReportId: r.GetReportId()})
		ws := r.GetRelatedTo().GetPrimary().GetCluster()
		switch {
		case r.GetError().GetReason() == ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT:
			out[ws] = "conflict"
		case r.GetUnresolved() != nil:
			out[ws] = "unresolved: " + r.GetUnresolved().GetMessage()
		case r.GetObjects() != nil:
			var names []string
			for _, en := range r.GetObjects().GetEntries() {
				names = append(names, en.GetLocalName()+"->"+en.GetName())
			}
			out[ws] = strings.Join(names, ",")
		default:
			out[ws] = fmt.Sprintf("%T", r.GetState())
		}
	}
	return out
}

// TestLabelSelectedRelatedObjects: a label-selected entry reports every
// matching Secret of the primary's namespace with its rewritten name; a
// Secret labelled later and one unlabelled are noticed from the related
// informer's events (no polling); ferry's own copies of kcp objects are
// never reported; an object two primaries' selectors find is copied for
// neither until only one finds it.
func TestLabelSelectedRelatedObjects(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "certs", Origin: ferryv1alpha1.OriginService, Resource: "secrets", Version: "v1", Kind: "Secret",
		Object: &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
			Selector: &ferryv1alpha1.RelatedResourceObjectSelector{
				LabelSelector: metav1.LabelSelector{MatchLabels: map[string]string{"owner": "{{ .LocalObject.metadata.name }}"}},
				Rewrite:       ferryv1alpha1.RelatedResourceSelectorRewrite{Regex: &ferryv1alpha1.RegexReplacement{Pattern: "^[a-z]+-app-(.+)$", Replacement: "cert-$1"}},
			},
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ns := "acc-sel"
	objs := []*unstructured.Unstructured{
		selectedSecret(ns, "a-app-1", map[string]string{"owner": "a-app"}),
		selectedSecret(ns, "a-app-2", map[string]string{"owner": "a-app"}),
		selectedSecret(ns, "a-app-3", map[string]string{"owner": "a-app"}),
		selectedSecret(ns, "unrelated", map[string]string{"owner": "someone"}),
	}
	// ferry's own copy of a kcp object, labelled like the others.
	own := selectedSecret(ns, "a-app-copy", map[string]string{"owner": "a-app", naming.LabelRelatedTo: "uid-x"})
	e, _, _ := testEngineWith(t, engineSetup{related: []Related{{Reference: refs[0], Local: secretsGVR}}, relatedClusterWide: true},
		objs[0], objs[1], objs[2], objs[3], own)
	ctx := context.Background()
	secrets := e.opts.Dynamic.Resource(secretsGVR).Namespace(ns)
	copies := e.opts.Dynamic.Resource(localGVR).Namespace(ns)
	states := map[string]string{}
	wait := func(want map[string]string) {
		t.Helper()
		waitFor(t, func() (bool, string) {
			maps.Copy(states, selectedNames(e))
			for ws, st := range want {
				if states[ws] != st {
					return false, fmt.Sprintf("states %v, want %v", states, want)
				}
			}
			return true, ""
		})
	}
	if _, err := copies.Create(ctx, primaryIn("ws-a", ns, "a-app", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait(map[string]string{"ws-a": "a-app-1->cert-1,a-app-2->cert-2,a-app-3->cert-3"})

	// A fourth Secret labelled later appears by itself.
	if _, err := secrets.Create(ctx, selectedSecret(ns, "a-app-4", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	four, err := secrets.Get(ctx, "a-app-4", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	four.SetLabels(map[string]string{"owner": "a-app"})
	if _, err := secrets.Update(ctx, four, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait(map[string]string{"ws-a": "a-app-1->cert-1,a-app-2->cert-2,a-app-3->cert-3,a-app-4->cert-4"})

	// One unlabelled leaves the set.
	one, err := secrets.Get(ctx, "a-app-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	one.SetLabels(nil)
	if _, err := secrets.Update(ctx, one, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait(map[string]string{"ws-a": "a-app-2->cert-2,a-app-3->cert-3,a-app-4->cert-4"})

	// Another workspace's primary whose selector finds a-app-2 as well (it
	// is labelled for both): neither gets any of it.
	b := primaryIn("ws-b", ns, "b-app", "")
	if _, err := copies.Create(ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait(map[string]string{"ws-b": ""})
	two, err := secrets.Get(ctx, "a-app-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	two.SetLabels(map[string]string{"owner": "b-app"})
	if _, err := secrets.Update(ctx, two, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Relabelled: it moves from a's set to b's (no sharing).
	wait(map[string]string{"ws-a": "a-app-3->cert-3,a-app-4->cert-4", "ws-b": "a-app-2->cert-2"})
	if !slices.Contains([]string{"", "a-app-2->cert-2"}, states["ws-b"]) {
		t.Fatalf("ws-b: %q", states["ws-b"])
	}
}

// TestLabelSelectedObjectFoundTwiceIsNeverCopied: a Secret both a
// label-selected entry finds and a name reference of another primary
// points at is copied for neither.
func TestLabelSelectedObjectFoundTwiceIsNeverCopied(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "certs", Origin: ferryv1alpha1.OriginService, Resource: "secrets", Version: "v1", Kind: "Secret",
		Object: &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
			Selector: &ferryv1alpha1.RelatedResourceObjectSelector{
				LabelSelector: metav1.LabelSelector{MatchLabels: map[string]string{"tier": "shared"}},
				Rewrite:       ferryv1alpha1.RelatedResourceSelectorRewrite{Template: &ferryv1alpha1.TemplateExpression{Template: "{{ .Value }}"}},
			},
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ns := "acc-sel2"
	e, _, _ := testEngineWith(t, engineSetup{related: []Related{{Reference: refs[0], Local: secretsGVR}}, relatedClusterWide: true},
		selectedSecret(ns, "shared", map[string]string{"tier": "shared"}))
	ctx := context.Background()
	copies := e.opts.Dynamic.Resource(localGVR).Namespace(ns)
	states := map[string]string{}
	wait := func(want map[string]string) {
		t.Helper()
		waitFor(t, func() (bool, string) {
			maps.Copy(states, selectedNames(e))
			for ws, st := range want {
				if states[ws] != st {
					return false, fmt.Sprintf("states %v, want %v", states, want)
				}
			}
			return true, ""
		})
	}
	if _, err := copies.Create(ctx, primaryIn("ws-a", ns, "a-app", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait(map[string]string{"ws-a": "shared->shared"})
	if _, err := copies.Create(ctx, primaryIn("ws-b", ns, "b-app", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait(map[string]string{"ws-a": "conflict", "ws-b": "conflict"})
	if err := copies.Delete(ctx, "b-app", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait(map[string]string{"ws-a": "shared->shared"})
}

// TestRelatedPayloadCarriesStatusOnlyWithSyncStatus: the edge reports a
// service-origin object's status only for an entry with syncStatus.
func TestRelatedPayloadCarriesStatusOnlyWithSyncStatus(t *testing.T) {
	u := selectedSecret("ns", "s", map[string]string{"app": "db", naming.LabelAgent: "x"})
	u.Object["status"] = map[string]any{"phase": "Ready"}
	for _, tc := range []struct {
		syncStatus bool
		want       string
	}{{syncStatus: true, want: "map[phase:Ready]"}, {syncStatus: false, want: "<nil>"}} {
		refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
			Identifier: "db", Origin: ferryv1alpha1.OriginService, Kind: "Secret", SyncStatus: tc.syncStatus,
			Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		got := relatedPayload(&Related{Reference: refs[0], Local: secretsGVR}, u)
		if st := fmt.Sprint(got.Object["status"]); st != tc.want {
			t.Errorf("syncStatus %v: status %s, want %s", tc.syncStatus, st, tc.want)
		}
		if got.GetLabels()[naming.LabelAgent] != "" || got.GetName() != "" {
			t.Errorf("syncStatus %v: bookkeeping or name crossed: %v", tc.syncStatus, got.Object)
		}
	}
}

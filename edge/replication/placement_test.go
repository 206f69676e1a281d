package replication

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/related"
)

func TestPlacementDecide(t *testing.T) {
	cases := []struct {
		name      string
		p         placement
		st        nsState
		owner     string
		wantErr   bool
		wantLabel string
	}{
		{name: "missing: created for the workspace", p: placement{workspace: "a"}, st: nsMissing, wantLabel: "a"},
		{name: "ferry's, same workspace", p: placement{workspace: "a"}, st: nsFerry, owner: "a", wantLabel: "a"},
		{name: "ferry's, another workspace", p: placement{workspace: "a"}, st: nsFerry, owner: "b", wantErr: true},
		{name: "another workspace's even when static", p: placement{workspace: "a", static: []string{"ns"}}, st: nsFerry, owner: "b", wantErr: true},
		{name: "another workspace's even when existing are allowed", p: placement{workspace: "a", allowExisting: true}, st: nsFerry, owner: "b", wantErr: true},
		{name: "existing, not ferry's", p: placement{workspace: "a"}, st: nsExisting, wantErr: true},
		{name: "existing, allowed by the PublishedResource", p: placement{workspace: "a", allowExisting: true}, st: nsExisting},
		{name: "static, missing: created shared", p: placement{workspace: "a", static: []string{"ns"}}, st: nsMissing},
		{name: "static, existing", p: placement{workspace: "a", static: []string{"ns"}}, st: nsExisting},
		{name: "shared ferry namespace not named here", p: placement{workspace: "a"}, st: nsFerry, wantErr: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			label, err := tc.p.decide("ns", tc.st, tc.owner)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v", err, tc.wantErr)
			}
			if err != nil && !errors.Is(err, errForbidden) {
				t.Errorf("refusal does not wrap errForbidden: %v", err)
			}
			if err == nil && label != tc.wantLabel {
				t.Errorf("label %q, want %q", label, tc.wantLabel)
			}
		})
	}
}

// TestMisbehavingBrokerCannotPlaceObjects drives the edge's apply path with
// intents a malicious broker could send: the key's parts come from the
// broker, and the edge must not write outside what its PublishedResource's
// naming rules and ferry's own namespaces allow.
func TestMisbehavingBrokerCannotPlaceObjects(t *testing.T) {
	nsObj := func(name string, labels map[string]string) *corev1.Namespace {
		return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}
	}
	cases := []struct {
		name       string
		cluster    string
		namingNS   string // naming.namespace rule; "" = default
		allow      bool
		wantReason ferryv1.ApplyErrorReason // UNSPECIFIED = applied
		wantNS     string
	}{
		{name: "cluster name kube-system", cluster: "kube-system", wantReason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN},
		{name: "another workspace's namespace through a shared rule", cluster: "c1", namingNS: "tenant-b",
			wantReason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN},
		{name: "a workspace's own namespace", cluster: "c2", wantNS: "c2"},
		{name: "a new workspace gets a new namespace", cluster: "c3", wantNS: "c3"},
		{name: "a static namespace", cluster: "c1", namingNS: "shared", wantNS: "shared"},
		{name: "an existing namespace when allowed", cluster: "c1", namingNS: "{{ .Namespace }}", allow: true, wantNS: "team"},
		{name: "an existing namespace when not allowed", cluster: "c1", namingNS: "{{ .Namespace }}",
			wantReason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			rules, err := naming.Compile(&ferryv1alpha1.ResourceNaming{Namespace: tc.namingNS})
			if err != nil {
				t.Fatal(err)
			}
			e, _, sink := testEngineWith(t, engineSetup{published: func(p *Published) { p.Naming, p.AllowExistingNamespaces = rules, tc.allow }})
			kube := e.opts.Kube.CoreV1().Namespaces()
			for _, ns := range []*corev1.Namespace{
				nsObj("kube-system", nil), nsObj("team", nil),
				nsObj("tenant-b", map[string]string{naming.LabelAgent: "nora", naming.LabelWorkspace: "c9"}),
				nsObj("c2", map[string]string{naming.LabelAgent: "nora", naming.LabelWorkspace: "c2"}),
			} {
				if _, err := kube.Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			key, _ := remoteThing()
			key.Cluster = tc.cluster
			e.Handle(&ferryv1.SyncIntent{Key: key, Version: &ferryv1.ObjectVersion{Sequence: 1}, PublishedResource: "pr",
				Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{Object: []byte(`{"apiVersion":"kcp.example/v1","kind":"Thing","spec":{"a":1}}`)}}})
			runQueue(t, e)
			if len(sink.msgs) != 1 {
				t.Fatalf("want one result, got %v", sink.msgs)
			}
			res := sink.msgs[0].GetIntentResult()
			// Where the edge tried to write (the fake dynamic client cannot
			// server-side-apply a new object, so allowed writes fail there).
			var wrote []string
			for _, a := range e.opts.Dynamic.(*dynamicfake.FakeDynamicClient).Actions() {
				if a.GetResource().Resource == "publishedresources" {
					continue // the PublishedResource's status (its counts)
				}
				if a.GetVerb() == "patch" || a.GetVerb() == "create" || a.GetVerb() == "update" {
					wrote = append(wrote, a.GetNamespace())
				}
			}
			if tc.wantReason != ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_UNSPECIFIED {
				if got := res.GetError().GetReason(); got != tc.wantReason || len(wrote) != 0 {
					t.Fatalf("result %v (writes in %v), want reason %v and no write", res, wrote, tc.wantReason)
				}
				return
			}
			if res.GetError().GetReason() == ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN || len(wrote) != 1 || wrote[0] != tc.wantNS {
				t.Fatalf("result %v, writes in %v; want one write in %s", res, wrote, tc.wantNS)
			}
			if tc.wantNS == "c3" {
				ns, err := kube.Get(context.Background(), "c3", metav1.GetOptions{})
				if err != nil || ns.Labels[naming.LabelWorkspace] != "c3" || ns.Labels[naming.LabelAgent] != "nora" {
					t.Fatalf("namespace c3 not created for its workspace: %v %v", ns.GetLabels(), err)
				}
			}
		})
	}
}

// TestRelatedReferencesStayInTheWorkspace: the consumer writes the spec a
// related reference is evaluated on; pointing it at kube-system or another
// workspace's namespace is refused (origin kcp: nothing written; origin
// service: reported as forbidden, nothing read).
func TestRelatedReferencesStayInTheWorkspace(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "creds", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
		Reference: &ferryv1alpha1.RelatedResourceReference{
			Name:      ferryv1alpha1.ResourceLocator{Path: "spec.secretName"},
			Namespace: &ferryv1alpha1.ResourceLocator{Path: "spec.secretNamespace"},
		},
	}, {
		Identifier: "shared", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
		Reference: &ferryv1alpha1.RelatedResourceReference{
			Name:      ferryv1alpha1.ResourceLocator{Path: "spec.secretName"},
			Namespace: &ferryv1alpha1.ResourceLocator{Path: "metadata.name", Regex: &ferryv1alpha1.RegexReplacement{Replacement: "shared-secrets"}},
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	// Namespaces this agent created for workspaces c1 and c9.
	var created []runtime.Object
	for ns, ws := range map[string]string{"c1-other": "c1", "c9": "c9"} {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace"}}
		u.SetName(ns)
		u.SetLabels(map[string]string{naming.LabelAgent: "nora", naming.LabelWorkspace: ws})
		created = append(created, u)
	}
	e, _, _ := testEngine(t, true, created...)
	cases := []struct {
		ns     string
		ref    int
		wantOK bool
	}{
		{ns: "local-ns", ref: 0, wantOK: true},       // the primary's own namespace
		{ns: "c1-other", ref: 0, wantOK: true},       // another namespace ferry created for the workspace
		{ns: "kube-system", ref: 0},                  // never
		{ns: "c9", ref: 0},                           // another workspace's
		{ns: "shared-secrets", ref: 1, wantOK: true}, // named statically by the service owner
	}
	for _, tc := range cases {
		e.mu.Lock()
		_, err := e.mayRelateLocked("c1", "local-ns", tc.ns, &Related{Reference: refs[tc.ref]})
		e.mu.Unlock()
		if (err == nil) != tc.wantOK || (err != nil && !errors.Is(err, errForbidden)) {
			t.Errorf("%s: err = %v, want ok %v", tc.ns, err, tc.wantOK)
		}
	}
}

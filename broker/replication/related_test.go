package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	k8stesting "k8s.io/client-go/testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/related"
)

func TestSameRelated(t *testing.T) {
	obj := func(labels map[string]any, data string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "Secret",
			"metadata": map[string]any{"name": "s", "labels": labels, "resourceVersion": "5"},
			"data":     map[string]any{"k": data},
		}}
	}
	desired := obj(map[string]any{"ferry.dev/related-to": "u"}, "v")
	tests := []struct {
		name     string
		existing *unstructured.Unstructured
		want     bool
	}{
		{"equal but for kcp's claim label", obj(map[string]any{"ferry.dev/related-to": "u", "claimed.internal.apis.kcp.io/x": "y"}, "v"), true},
		{"data differs", obj(map[string]any{"ferry.dev/related-to": "u"}, "w"), false},
		{"label differs", obj(map[string]any{"ferry.dev/related-to": "u", "extra": "1"}, "v"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sameRelated(tt.existing, desired); got != tt.want {
				t.Errorf("sameRelated = %v, want %v", got, tt.want)
			}
		})
	}
	extra := obj(map[string]any{"ferry.dev/related-to": "u"}, "v")
	extra.Object["type"] = "Opaque"
	if sameRelated(extra, desired) {
		t.Error("a top-level field only the existing copy has was ignored")
	}
}

// TestRelatedCopyOutsideThePrimarysNamespaceHolds: a service-origin copy
// whose kcp-side namespace is not the primary's gets no owner reference
// (kcp's garbage collector deleted such copies, and the broker recreated
// them, 19 times a minute), and a namespace that does not exist yet in the
// workspace is created (it was RelatedNotWritten, never retried).
func TestRelatedCopyOutsideThePrimarysNamespaceHolds(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "tls", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
		Reference: &ferryv1alpha1.RelatedResourceReference{
			Name:      ferryv1alpha1.ResourceLocator{Path: "spec.secretName"},
			Namespace: &ferryv1alpha1.ResourceLocator{Path: "metadata.name", Regex: &ferryv1alpha1.RegexReplacement{Replacement: "certs"}},
		},
	}, {
		Identifier: "same", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
		Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	primary := thing("1", map[string]any{"secretName": "app-cert"}, nil)
	res := thingsResource()
	res.Related = refs
	e := newEnv(t, res, primary,
		&unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": "ns"}}})
	m, client, secretsGVR := e.m, e.kcp, refs[0].Resource
	// The fake does not know namespaces: creating in a missing one fails
	// as kcp does.
	client.PrependReactor("create", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		ns := a.GetNamespace()
		if _, err := client.Tracker().Get(namespacesGVR, "", ns); err != nil {
			return true, nil, apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, ns)
		}
		return false, nil, nil
	})
	ctx := context.Background()
	for _, id := range []string{"tls", "same"} {
		err := m.WriteRelated(ctx, "pr", &ferryv1.RelatedObjectReport{
			RelatedTo: &ferryv1.RelatedTo{Primary: thingKey(), Identifier: id},
			State:     &ferryv1.RelatedObjectReport_Object{Object: []byte(`{"data":{"tls.crt":"Y2VydA=="}}`)},
		})
		if err != nil {
			t.Fatalf("%s: %v", id, err)
		}
	}
	other, err := client.Resource(secretsGVR).Namespace("certs").Get(ctx, "app-cert", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the copy in a namespace that did not exist was not written: %v", err)
	}
	if refs := other.GetOwnerReferences(); len(refs) != 0 {
		t.Errorf("a copy in another namespace than its primary's has owner references %v", refs)
	}
	if other.GetLabels()[naming.LabelRelatedTo] != "u-a" {
		t.Errorf("the copy is not tied to its primary by label: %v", other.GetLabels())
	}
	same, err := client.Resource(secretsGVR).Namespace("ns").Get(ctx, "app-cert", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if refs := same.GetOwnerReferences(); len(refs) != 1 || refs[0].UID != "u-a" {
		t.Errorf("a copy beside its primary: owner references %v, want the primary", refs)
	}
}

// TestRelatedTemplateIsEvaluatedOnTheKCPSide: an entry in api-syncagent's
// spelling (resource, object.template) as the edge sends it (with the kind
// it resolved) is evaluated by the broker on the kcp primary with .Side
// "kcp" and the primary's workspace, and the copy is written as that kind
// of that resource.
func TestRelatedTemplateIsEvaluatedOnTheKCPSide(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "tls", Origin: ferryv1alpha1.OriginService, Resource: "secrets", Version: "v1", Kind: "Secret",
		Object: &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
			Template: &ferryv1alpha1.TemplateExpression{Template: `{{ if eq .Side "kcp" }}{{ .Object.spec.secretName }}-{{ .ClusterName }}{{ else }}local{{ end }}`},
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	primary := thing("1", map[string]any{"secretName": "app-cert"}, nil)
	res := thingsResource()
	res.Related = refs
	e := newEnv(t, res, primary)
	ctx := context.Background()
	err = e.m.WriteRelated(ctx, "pr", &ferryv1.RelatedObjectReport{
		RelatedTo: &ferryv1.RelatedTo{Primary: thingKey(), Identifier: "tls"},
		State:     &ferryv1.RelatedObjectReport_Object{Object: []byte(`{"data":{"tls.crt":"Y2VydA=="}}`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	name := "app-cert-" + thingKey().GetCluster()
	got, err := e.kcp.Resource(schema.GroupVersionResource{Version: "v1", Resource: "secrets"}).Namespace("ns").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the copy is not at the kcp-side name %s: %v", name, err)
	}
	if got.GetKind() != "Secret" {
		t.Errorf("kind = %q, want Secret", got.GetKind())
	}
}

// TestLabelSelectedSetIsWrittenAndPruned: a set a label-selected entry
// found is written into the primary's workspace under the rewritten
// names; an object that leaves the set loses its copy, the others stay;
// names that are invalid or repeated are refused.
func TestLabelSelectedSetIsWrittenAndPruned(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "certs", Origin: ferryv1alpha1.OriginService, Resource: "secrets", Version: "v1", Kind: "Secret",
		Object: &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
			Selector: &ferryv1alpha1.RelatedResourceObjectSelector{
				LabelSelector: metav1.LabelSelector{MatchLabels: map[string]string{"owner": "x"}},
				Rewrite:       ferryv1alpha1.RelatedResourceSelectorRewrite{Template: &ferryv1alpha1.TemplateExpression{Template: "{{ .Value }}"}},
			},
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	primary := thing("1", map[string]any{}, nil)
	res := thingsResource()
	res.Related = refs
	e := newEnv(t, res, primary)
	ctx := context.Background()
	secrets := e.kcp.Resource(schema.GroupVersionResource{Version: "v1", Resource: "secrets"}).Namespace("ns")
	report := func(names ...string) error {
		set := &ferryv1.RelatedObjectSet{}
		for _, n := range names {
			set.Entries = append(set.Entries, &ferryv1.RelatedObjectSetEntry{LocalName: "local-" + n, Name: n, Object: []byte(`{"data":{"k":"` + n + `"}}`)})
		}
		return e.m.WriteRelated(ctx, "pr", &ferryv1.RelatedObjectReport{
			RelatedTo: &ferryv1.RelatedTo{Primary: thingKey(), Identifier: "certs"},
			State:     &ferryv1.RelatedObjectReport_Objects{Objects: set},
		})
	}
	names := func() []string {
		list, err := secrets.List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, s := range list.Items {
			if s.GetLabels()[naming.LabelRelatedTo] != "u-a" || s.GetLabels()[naming.LabelRelatedIdentifier] != "certs" {
				t.Errorf("%s is not labelled as the primary's copy: %v", s.GetName(), s.GetLabels())
			}
			out = append(out, s.GetName())
		}
		slices.Sort(out)
		return out
	}
	if err := report("c1", "c2", "c3"); err != nil {
		t.Fatal(err)
	}
	if got := names(); !slices.Equal(got, []string{"c1", "c2", "c3"}) {
		t.Fatalf("copies %v, want c1 c2 c3", got)
	}
	// The broker deletes from its watch's view of the copies: let it see them.
	waitWatched(t, e, 3)
	if err := report("c2", "c3", "c4"); err != nil {
		t.Fatal(err)
	}
	if got := names(); !slices.Equal(got, []string{"c2", "c3", "c4"}) {
		t.Fatalf("copies %v, want c2 c3 c4", got)
	}
	for _, bad := range [][]string{{"Not_Valid"}, {"c5", "c5"}} {
		if err := report(bad...); err == nil || !errors.Is(err, ErrRefused) {
			t.Errorf("set %v: error %v, want a refusal", bad, err)
		}
	}
	// A report of one object for a label-selected entry is refused.
	err = e.m.WriteRelated(ctx, "pr", &ferryv1.RelatedObjectReport{
		RelatedTo: &ferryv1.RelatedTo{Primary: thingKey(), Identifier: "certs"},
		State:     &ferryv1.RelatedObjectReport_Object{Object: []byte(`{}`)},
	})
	if !errors.Is(err, ErrRefused) {
		t.Errorf("a single object for a selector entry: %v", err)
	}
}

// waitWatched waits until the broker's related watch of secrets holds n
// copies of the test primary.
func waitWatched(t *testing.T, e *env, n int) {
	t.Helper()
	eventually(t, fmt.Sprintf("the watch holds %d copies", n), func() bool {
		e.m.mu.Lock()
		rw := e.m.relWatchers[schema.GroupVersionResource{Version: "v1", Resource: "secrets"}]
		e.m.mu.Unlock()
		return rw != nil && len(copiesOf(rw, "u-a", "certs")) == n
	})
}

// TestRelatedCleanup: when the primary is deleted, a service-origin copy
// goes with it by default; with cleanup: false it stays in the workspace,
// released — no ferry label, no owner reference (kcp's garbage collector
// would delete it with the primary) — and it never had an owner
// reference.
func TestRelatedCleanup(t *testing.T) {
	no := false
	for _, tc := range []struct {
		name    string
		cleanup *bool
		kept    bool
	}{
		{name: "default", kept: false},
		{name: "cleanup false", cleanup: &no, kept: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
				Identifier: "certs", Origin: ferryv1alpha1.OriginService, Kind: "Secret", Cleanup: tc.cleanup,
				Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
			}})
			if err != nil {
				t.Fatal(err)
			}
			res := thingsResource()
			res.Related = refs
			e := newEnv(t, res, thing("1", map[string]any{"secretName": "app-cert"}, nil))
			ctx := context.Background()
			err = e.m.WriteRelated(ctx, "pr", &ferryv1.RelatedObjectReport{
				RelatedTo: &ferryv1.RelatedTo{Primary: thingKey(), Identifier: "certs"},
				State:     &ferryv1.RelatedObjectReport_Object{Object: []byte(`{"data":{"k":"dg=="}}`)},
			})
			if err != nil {
				t.Fatal(err)
			}
			secrets := e.kcp.Resource(schema.GroupVersionResource{Version: "v1", Resource: "secrets"}).Namespace("ns")
			written, err := secrets.Get(ctx, "app-cert", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if owners := len(written.GetOwnerReferences()); owners != map[bool]int{true: 0, false: 1}[tc.kept] {
				t.Errorf("%d owner references", owners)
			}
			// kcp names the workspace on every object; the fake does not.
			written.SetAnnotations(map[string]string{"kcp.io/cluster": thingKey().GetCluster()})
			if _, err := secrets.Update(ctx, written, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
			eventually(t, "the watch holds the copy with its workspace", func() bool {
				e.m.mu.Lock()
				rw := e.m.relWatchers[schema.GroupVersionResource{Version: "v1", Resource: "secrets"}]
				e.m.mu.Unlock()
				return slices.ContainsFunc(copiesOf(rw, "u-a", "certs"), func(c *unstructured.Unstructured) bool { return c.GetAnnotations()["kcp.io/cluster"] != "" })
			})
			if err := e.m.deleteRelatedCopies(ctx, "pr", thingKey()); err != nil {
				t.Fatal(err)
			}
			got, err := secrets.Get(ctx, "app-cert", metav1.GetOptions{})
			switch {
			case !tc.kept && !apierrors.IsNotFound(err):
				t.Fatalf("the copy outlived its primary: %v", err)
			case tc.kept && err != nil:
				t.Fatalf("the copy was deleted: %v", err)
			case tc.kept:
				if l := got.GetLabels(); l[naming.LabelRelatedTo] != "" || l[naming.LabelRelatedIdentifier] != "" {
					t.Errorf("the kept copy still carries ferry's labels: %v", l)
				}
				if len(got.GetOwnerReferences()) != 0 {
					t.Errorf("the kept copy is still owned: %v", got.GetOwnerReferences())
				}
			}
		})
	}
}

// TestRelatedSyncStatus: with syncStatus the status the edge reports is
// written to the copy in kcp, through the status subresource when create
// and update ignore it; without it a status in the report is dropped.
func TestRelatedSyncStatus(t *testing.T) {
	for _, tc := range []struct {
		name       string
		syncStatus bool
		want       any
	}{
		{name: "syncStatus", syncStatus: true, want: map[string]any{"phase": "Ready"}},
		{name: "default", syncStatus: false, want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
				Identifier: "db", Origin: ferryv1alpha1.OriginService, Kind: "Secret", SyncStatus: tc.syncStatus,
				Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
			}})
			if err != nil {
				t.Fatal(err)
			}
			res := thingsResource()
			res.Related = refs
			e := newEnv(t, res, thing("1", map[string]any{"secretName": "app-db"}, nil))
			// A kind with a status subresource: create and update ignore
			// the status.
			statusWrites := 0
			for _, verb := range []string{"create", "update"} {
				e.kcp.PrependReactor(verb, "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
					if a.GetSubresource() == "status" {
						statusWrites++
						return false, nil, nil
					}
					if o, ok := a.(interface{ GetObject() runtime.Object }); ok {
						if u, ok := o.GetObject().(*unstructured.Unstructured); ok {
							delete(u.Object, "status")
						}
					}
					return false, nil, nil
				})
			}
			ctx := context.Background()
			err = e.m.WriteRelated(ctx, "pr", &ferryv1.RelatedObjectReport{
				RelatedTo: &ferryv1.RelatedTo{Primary: thingKey(), Identifier: "db"},
				State:     &ferryv1.RelatedObjectReport_Object{Object: []byte(`{"data":{"k":"dg=="},"status":{"phase":"Ready"}}`)},
			})
			if err != nil {
				t.Fatal(err)
			}
			got, err := e.kcp.Resource(schema.GroupVersionResource{Version: "v1", Resource: "secrets"}).Namespace("ns").Get(ctx, "app-db", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if st := got.Object["status"]; fmt.Sprint(st) != fmt.Sprint(tc.want) {
				t.Errorf("status %v, want %v", st, tc.want)
			}
			if want := map[bool]int{true: 1, false: 0}[tc.syncStatus]; statusWrites != want {
				t.Errorf("%d status writes, want %d", statusWrites, want)
			}
		})
	}
}

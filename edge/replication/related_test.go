package replication

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/objects"
	"github.com/ferry-dev/ferry/pkg/related"
)

var secretsGVR = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}

// primaryIn is a local primary of workspace cluster in namespace ns that
// names the Secret secretName.
func primaryIn(cluster, ns, name, secretName string) *unstructured.Unstructured {
	remote := naming.Remote{ClusterName: cluster, Namespace: "default", Name: "app", UID: "uid-" + cluster + "-" + name}
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "svc.example/v1", "kind": "Thing",
		"spec": map[string]any{"secretName": secretName}}}
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetLabels(objects.MergeStrings(naming.Labels("nora", remote), naming.OwnerLabels(remoteGVR.GroupResource(), "pr")))
	u.SetAnnotations(naming.Annotations(remote))
	return u
}

// relatedStates returns the state of the latest related report per primary
// workspace, and answers the reports.
func relatedStates(e *Engine) map[string]string {
	out := map[string]string{}
	for _, m := range reportsQueued(e) {
		r := m.GetRelatedObjectReport()
		if r == nil {
			continue
		}
		e.ReportResult(&ferryv1.ReportResult{ReportId: r.GetReportId()}) // the broker's answer
		st := "object"
		switch {
		case r.GetError().GetReason() == ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT:
			st = "conflict"
		case r.GetError() != nil:
			st = "error"
		case r.GetGone() != nil:
			st = "gone"
		case r.GetUnresolved() != nil:
			st = "unresolved"
		}
		out[r.GetRelatedTo().GetPrimary().GetCluster()] = st
	}
	return out
}

// TestSharedRelatedObjectIsNeverCopied: the seeds' cert-manager example
// puts every local Certificate into one fixed namespace; two workspaces'
// Certificates naming the same Secret point at one local Secret. It is
// copied for neither (each primary is told why) until only one points at
// it.
func TestSharedRelatedObjectIsNeverCopied(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "tls", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
		Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	secret := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret", "data": map[string]any{"tls.key": "c2VjcmV0"}}}
	secret.SetNamespace("acc-cm")
	secret.SetName("app-cert")
	// acc-cm is not a namespace ferry made: the related cache is
	// cluster-wide.
	e, _, _ := testEngineWith(t, engineSetup{related: []Related{{Reference: refs[0], Local: secretsGVR}}, relatedClusterWide: true}, secret)
	copies := e.opts.Dynamic.Resource(localGVR).Namespace("acc-cm")
	states := map[string]string{}
	waitStates := func(want map[string]string) {
		t.Helper()
		waitFor(t, func() (bool, string) {
			maps.Copy(states, relatedStates(e))
			for ws, st := range want {
				if states[ws] != st {
					return false, fmt.Sprintf("related states %v, want %v", states, want)
				}
			}
			return true, ""
		})
	}
	a := primaryIn("ws-a", "acc-cm", "a-app", "app-cert")
	b := primaryIn("ws-b", "acc-cm", "b-app", "app-cert")
	ctx := context.Background()

	if _, err := copies.Create(ctx, a, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitStates(map[string]string{"ws-a": "object"})

	// A second workspace points at the same Secret: both are told.
	if _, err := copies.Create(ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitStates(map[string]string{"ws-a": "conflict", "ws-b": "conflict"})

	// b gets its own Secret name: a's Secret is copied again, b's is gone.
	b2 := b.DeepCopy()
	b2.Object["spec"] = map[string]any{"secretName": "b-cert"}
	if _, err := copies.Update(ctx, b2, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitStates(map[string]string{"ws-a": "object", "ws-b": "gone"})
}

// TestRelatedCacheHoldsOnlyFerrysNamespaces: the edge used to cache every
// Secret of the service cluster for related objects. It now holds one
// informer per namespace it may read related objects in — the namespaces
// it created and those a PublishedResource names statically — unless the
// service owner opts into a cluster-wide cache.
func TestRelatedCacheHoldsOnlyFerrysNamespaces(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "tls", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
		Reference: &ferryv1alpha1.RelatedResourceReference{
			Name:      ferryv1alpha1.ResourceLocator{Path: "spec.secretName"},
			Namespace: &ferryv1alpha1.ResourceLocator{Path: "metadata.name", Regex: &ferryv1alpha1.RegexReplacement{Replacement: "shared-certs"}},
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, clusterWide := range []bool{false, true} {
		// ws-a is a namespace ferry made for a workspace (as local-ns is);
		// team-x is not.
		ferryNS := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace"}}
		ferryNS.SetName("ws-a")
		ferryNS.SetLabels(map[string]string{naming.LabelAgent: "nora", naming.LabelWorkspace: "a"})
		otherNS := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace"}}
		otherNS.SetName("team-x")
		e, _, _ := testEngineWith(t, engineSetup{related: []Related{{Reference: refs[0], Local: secretsGVR}}, relatedClusterWide: clusterWide},
			ferryNS, otherNS)
		e.mu.Lock()
		var got []string
		for ns := range e.relWatches[secretsGVR].spaces {
			got = append(got, ns)
		}
		e.mu.Unlock()
		slices.Sort(got)
		want := []string{"local-ns", "shared-certs", "ws-a"}
		if clusterWide {
			want = []string{""}
		}
		if !slices.Equal(got, want) {
			t.Errorf("cluster-wide %v: related informers in %q, want %q", clusterWide, got, want)
		}
	}
}

// TestRelatedReferenceFollowsTheCopysIdentity: a related reference is kept
// by the identity of the kcp object the primary copy belongs to. When the
// copy is applied for a new kcp object (same name, new UID: the kcp object
// was recreated and its copy adopted), the reference of the object before
// is dropped; kept, it would count as a second object pointing at the same
// Secret, and the Secret would be refused as shared.
func TestRelatedReferenceFollowsTheCopysIdentity(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "tls", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
		Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	secret := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret", "data": map[string]any{"tls.key": "c2VjcmV0"}}}
	secret.SetNamespace("local-ns")
	secret.SetName("app-cert")
	primary := primaryIn("c1", "local-ns", "a-copy", "app-cert")
	e, _, _ := testEngineWith(t, engineSetup{related: []Related{{Reference: refs[0], Local: secretsGVR}}}, secret, primary)
	latest := func(uid string) string {
		t.Helper()
		var st string
		waitFor(t, func() (bool, string) {
			for _, m := range reportsQueued(e) {
				r := m.GetRelatedObjectReport()
				if r == nil || r.GetRelatedTo().GetPrimary().GetUid() != uid {
					continue
				}
				e.ReportResult(&ferryv1.ReportResult{ReportId: r.GetReportId()})
				st = "object"
				if r.GetError() != nil {
					st = r.GetError().GetReason().String()
				}
			}
			return st != "", "no related report for " + uid
		})
		return st
	}
	if st := latest(primary.GetAnnotations()[naming.AnnotationUID]); st != "object" {
		t.Fatalf("related state %s, want the object", st)
	}

	recreated := primary.DeepCopy()
	recreated.SetAnnotations(objects.MergeStrings(recreated.GetAnnotations(), map[string]string{naming.AnnotationUID: "uid-new"}))
	if _, err := e.opts.Dynamic.Resource(localGVR).Namespace("local-ns").Update(context.Background(), recreated, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if st := latest("uid-new"); st != "object" {
		t.Fatalf("related state %s for the new kcp object, want the object", st)
	}
}

// TestRelatedTemplateIsEvaluatedOnTheServiceSide: an entry in
// api-syncagent's spelling (object.template) is evaluated by the edge on
// the local copy with .Side "service" and the copy's workspace, and the
// object found there is reported.
func TestRelatedTemplateIsEvaluatedOnTheServiceSide(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "tls", Origin: ferryv1alpha1.OriginService, Resource: "secrets", Kind: "Secret",
		Object: &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
			Template: &ferryv1alpha1.TemplateExpression{Template: `{{ if eq .Side "service" }}{{ .ClusterName }}-{{ .Object.spec.secretName }}{{ else }}kcp-name{{ end }}`},
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	secret := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret", "data": map[string]any{"tls.key": "c2VjcmV0"}}}
	secret.SetNamespace("acc-cm")
	secret.SetName("ws-a-app-cert")
	e, _, _ := testEngineWith(t, engineSetup{related: []Related{{Reference: refs[0], Local: secretsGVR}}, relatedClusterWide: true}, secret)
	if _, err := e.opts.Dynamic.Resource(localGVR).Namespace("acc-cm").Create(context.Background(), primaryIn("ws-a", "acc-cm", "a-app", "app-cert"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() (bool, string) {
		for _, m := range reportsQueued(e) {
			if r := m.GetRelatedObjectReport(); r != nil && r.GetObject() != nil {
				return r.GetLocalName() == "ws-a-app-cert", fmt.Sprintf("reported %s/%s", r.GetLocalNamespace(), r.GetLocalName())
			}
		}
		return false, "no object reported"
	})
}

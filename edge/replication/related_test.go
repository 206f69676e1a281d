package replication

import (
	"context"
	"slices"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
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
	u.SetLabels(naming.Labels("nora", remote))
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
		Reference: ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	e, w, _ := testEngine(t, true)
	w.pub.Related = []Related{{Reference: refs[0], Local: secretsGVR}}
	space := &relatedSpace{synced: true, cancel: func() {}, store: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})}
	e.relWatches[secretsGVR] = &relatedWatch{gvr: secretsGVR, spaces: map[string]*relatedSpace{"acc-cm": space}}
	secret := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret", "data": map[string]any{"tls.key": "c2VjcmV0"}}}
	secret.SetNamespace("acc-cm")
	secret.SetName("app-cert")
	if err := space.store.Add(secret); err != nil {
		t.Fatal(err)
	}
	a := primaryIn("ws-a", "acc-cm", "a-app", "app-cert")
	b := primaryIn("ws-b", "acc-cm", "b-app", "app-cert")

	e.mu.Lock()
	e.reportRelatedLocked(w, a)
	e.mu.Unlock()
	if got := relatedStates(e); got["ws-a"] != "object" {
		t.Fatalf("one primary: %v, want the object reported", got)
	}

	// A second workspace points at the same Secret: both are told.
	if err := w.store.Add(a); err != nil {
		t.Fatal(err)
	}
	if err := w.store.Add(b); err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	e.reportRelatedLocked(w, b)
	e.mu.Unlock()
	if got := relatedStates(e); got["ws-a"] != "conflict" || got["ws-b"] != "conflict" {
		t.Fatalf("shared: %v, want a conflict for both", got)
	}

	// b gets its own Secret name: a's Secret is copied again, b's is gone.
	b2 := b.DeepCopy()
	b2.Object["spec"] = map[string]any{"secretName": "b-cert"}
	if err := w.store.Update(b2); err != nil {
		t.Fatal(err)
	}
	e.mu.Lock()
	e.reportRelatedLocked(w, b2)
	e.mu.Unlock()
	if got := relatedStates(e); got["ws-a"] != "object" || got["ws-b"] != "gone" {
		t.Fatalf("after the rename: %v, want a's object and b's gone", got)
	}
}

// TestRelatedCacheHoldsOnlyFerrysNamespaces: the edge used to cache every
// Secret of the service cluster for related objects. It now holds one
// informer per namespace it may read related objects in — the namespaces
// it created and those a PublishedResource names statically — unless the
// service owner opts into a cluster-wide cache.
func TestRelatedCacheHoldsOnlyFerrysNamespaces(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "tls", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
		Reference: ferryv1alpha1.RelatedResourceReference{
			Name:      ferryv1alpha1.ResourceLocator{Path: "spec.secretName"},
			Namespace: &ferryv1alpha1.ResourceLocator{Path: "metadata.name", Regex: &ferryv1alpha1.RegexReplacement{Replacement: "shared-certs"}},
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, clusterWide := range []bool{false, true} {
		e, w, _ := testEngine(t, true)
		e.opts.RelatedClusterWide = clusterWide
		w.pub.Related = []Related{{Reference: refs[0], Local: secretsGVR}}
		e.nsStore = cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
		ferryNS := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace"}}
		ferryNS.SetName("ws-a")
		if err := e.nsStore.Add(ferryNS); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		e.mu.Lock()
		e.ctx = ctx
		e.ensureRelatedWatchesLocked()
		var got []string
		for ns := range e.relWatches[secretsGVR].spaces {
			got = append(got, ns)
		}
		e.mu.Unlock()
		cancel()
		slices.Sort(got)
		want := []string{"shared-certs", "ws-a"}
		if clusterWide {
			want = []string{""}
		}
		if !slices.Equal(got, want) {
			t.Errorf("cluster-wide %v: related informers in %q, want %q", clusterWide, got, want)
		}
	}
}

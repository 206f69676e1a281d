package replication

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/objects"
)

// TestRelatedWaitsForTheAppliedPrimary: a related object is placed where
// the reference on the local primary points. The broker sends it once the
// edge acknowledged the primary, but the edge's informer may still hold
// the primary's previous version (or none yet): the related copy used to
// be written at the place the stale copy named (or refused, and retried by
// the broker with backoff). It now waits, unanswered, until the cache holds
// the version this engine applied, and is placed on that informer event.
func TestRelatedWaitsForTheAppliedPrimary(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cached func(current *unstructured.Unstructured) *unstructured.Unstructured // nil: not in the cache yet
	}{
		{name: "the cache holds the previous version", cached: func(current *unstructured.Unstructured) *unstructured.Unstructured {
			old := current.DeepCopy()
			old.Object["spec"] = map[string]any{"secretName": "old-creds"}
			old.SetAnnotations(objects.MergeStrings(old.GetAnnotations(), map[string]string{naming.AnnotationContentHash: "h1"}))
			return old
		}},
		{name: "the cache does not hold it yet", cached: func(*unstructured.Unstructured) *unstructured.Unstructured { return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, w, sink := testEngine(t, true)
			acceptApplies(e)
			w.pub.Related = []Related{kcpCredsRef(t)}
			newRelatedSpace(t, e)
			current := primaryIn("c1", "local-ns", "a-copy", "creds")
			current.SetLabels(objects.MergeStrings(current.GetLabels(), naming.OwnerLabels(remoteGVR.GroupResource(), "pr")))
			current.SetAnnotations(objects.MergeStrings(current.GetAnnotations(), map[string]string{naming.AnnotationContentHash: "h2"}))
			remote, _ := naming.RemoteFrom(current.GetLabels(), current.GetAnnotations())
			pk := remoteKey(w.pub, remote)
			// This engine applied the primary's current version (h2).
			e.record(keyFor(w.pub.Name, pk), "h2", "", "local-ns", "a-copy", 1)
			old := tc.cached(current)
			if old != nil {
				if err := w.store.Add(old); err != nil {
					t.Fatal(err)
				}
			}
			e.Handle(&ferryv1.SyncIntent{Key: &ferryv1.ObjectKey{Cluster: "c1", Namespace: "default", Name: "creds", Uid: "u-s"}, PublishedResource: "pr",
				RelatedTo: &ferryv1.RelatedTo{Primary: pk, Identifier: "creds"}, Version: &ferryv1.ObjectVersion{Sequence: 1, ResourceVersion: "7"},
				Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{Object: []byte(`{"apiVersion":"v1","kind":"Secret","data":{"password":"aA=="}}`)}}})
			runQueue(t, e)
			if got := patches(t, e); len(got) != 0 {
				t.Fatalf("placed by a stale primary: wrote %s", nsName(got[0].GetNamespace(), got[0].GetName()))
			}
			if len(sink.msgs) != 0 {
				t.Fatalf("answered while the cache is stale: %v", sink.msgs)
			}

			// The informer catches up.
			if old != nil {
				if err := w.store.Update(current); err != nil {
					t.Fatal(err)
				}
			} else if err := w.store.Add(current); err != nil {
				t.Fatal(err)
			}
			e.localChanged(w, old, current)
			runQueue(t, e)
			got := patches(t, e)
			if len(got) != 1 || got[0].GetName() != "creds" || got[0].GetNamespace() != "local-ns" {
				t.Fatalf("after the informer event: writes %v, want local-ns/creds", got)
			}
			var answers []*ferryv1.IntentResult
			for _, m := range sink.msgs {
				if r := m.GetIntentResult(); r != nil {
					answers = append(answers, r)
				}
			}
			if len(answers) != 1 || answers[0].GetError() != nil {
				t.Fatalf("answers %v, want one success", answers)
			}
		})
	}
}

// newRelatedSpace gives e a synced, empty cache of Secrets in local-ns.
func newRelatedSpace(t *testing.T, e *Engine) {
	t.Helper()
	space := &relatedSpace{synced: true, cancel: func() {}, store: newRelatedStore()}
	e.mu.Lock()
	e.relWatches[secretsGVR] = &relatedWatch{gvr: secretsGVR, spaces: map[string]*relatedSpace{"local-ns": space}}
	e.mu.Unlock()
}

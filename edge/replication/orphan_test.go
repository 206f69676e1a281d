package replication

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

// TestOrphanLeavesTheCopy: a delete intent with orphan set (the consumer's
// Orphan, allowed by the PublishedResource) leaves the copy in place with
// no ferry label or annotation but ferry.dev/orphaned-from, and confirms the
// deletion once the copy left the watch; a later delete of the same object
// finds no copy. Without orphan the copy is deleted (today's behaviour).
func TestOrphanLeavesTheCopy(t *testing.T) {
	for _, orphan := range []bool{true, false} {
		t.Run(map[bool]string{true: "orphan", false: "delete"}[orphan], func(t *testing.T) {
			key, _ := remoteThing()
			e, _, sink := testEngine(t, true)
			storeApplies(t, e)
			ctx := context.Background()
			e.Handle(&ferryv1.SyncIntent{Key: key, Version: &ferryv1.ObjectVersion{Sequence: 1}, PublishedResource: "pr",
				Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{ContentHash: "h",
					Object: []byte(`{"apiVersion":"kcp.example/v1","kind":"Thing","metadata":{"name":"a","namespace":"team"},"spec":{"x":"a"}}`)}}})
			runQueue(t, e)
			res := sink.msgs[len(sink.msgs)-1].GetIntentResult()
			ns, name := res.GetLocalNamespace(), res.GetLocalName()
			waitFor(t, func() (bool, string) {
				return e.CopyOf("pr", "c1", "team", "a") != nil, "the cache does not hold the copy"
			})
			_ = reportsQueued(e)

			e.Handle(&ferryv1.SyncIntent{Key: key, Version: &ferryv1.ObjectVersion{Sequence: 2}, PublishedResource: "pr",
				Operation: &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{Orphan: orphan}}})
			runQueue(t, e)
			if err := sink.msgs[len(sink.msgs)-1].GetIntentResult().GetError(); err != nil {
				t.Fatal(err)
			}
			// Confirmed once the copy left the watch.
			var confirmed bool
			waitFor(t, func() (bool, string) {
				for _, m := range reportsQueued(e) {
					if m.GetDeletionConfirmation() != nil {
						confirmed = true
					}
				}
				return confirmed, "no deletion confirmation"
			})
			got, err := e.opts.Dynamic.Resource(localGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
			if !orphan {
				if err == nil {
					t.Fatal("the copy was not deleted")
				}
				return
			}
			if err != nil {
				t.Fatalf("the orphaned copy is gone: %v", err)
			}
			for l := range got.GetLabels() {
				if strings.HasPrefix(l, "ferry.dev/") {
					t.Errorf("orphaned copy keeps label %s", l)
				}
			}
			for a, v := range got.GetAnnotations() {
				if strings.HasPrefix(a, "ferry.dev/") && a != ferryv1alpha1.AnnotationOrphanedFrom {
					t.Errorf("orphaned copy keeps annotation %s", a)
				}
				if a == ferryv1alpha1.AnnotationOrphanedFrom && !strings.Contains(v, "team/a|u-a") {
					t.Errorf("%s = %q, want the kcp object named", a, v)
				}
			}
			if got.Object["spec"] == nil {
				t.Error("the orphaned copy lost its spec")
			}
			// The same delete again (the broker retries): no copy any more,
			// the orphan untouched.
			e.Handle(&ferryv1.SyncIntent{Key: key, Version: &ferryv1.ObjectVersion{Sequence: 3}, PublishedResource: "pr",
				Operation: &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{}}})
			runQueue(t, e)
			if _, err := e.opts.Dynamic.Resource(localGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{}); err != nil {
				t.Errorf("a delete after the orphaning deleted the orphan: %v", err)
			}
		})
	}
}

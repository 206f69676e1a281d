package replication

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	dynamicfake "k8s.io/client-go/dynamic/fake"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// TestDriftOfCopiesThisEngineAppliedAsksTheBroker: the edge keeps no
// content of what it applied, so a copy it applied that someone else
// deletes or changes in fields ferry owns is repaired with the state the
// broker sends again on request — not from memory — and that upsert is
// applied although its hash matches the copy's.
func TestDriftOfCopiesThisEngineAppliedAsksTheBroker(t *testing.T) {
	update := func(t *testing.T, e *Engine, u *unstructured.Unstructured) {
		t.Helper()
		if _, err := e.opts.Dynamic.Resource(localGVR).Namespace(u.GetNamespace()).Update(context.Background(), u, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name  string
		drift func(t *testing.T, e *Engine, copy *unstructured.Unstructured)
		want  string
	}{
		{name: "deleted by someone else", want: "deleted", drift: func(t *testing.T, e *Engine, copy *unstructured.Unstructured) {
			if err := e.opts.Dynamic.Resource(localGVR).Namespace(copy.GetNamespace()).Delete(context.Background(), copy.GetName(), metav1.DeleteOptions{}); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "spec changed by someone else", want: "changed", drift: func(t *testing.T, e *Engine, copy *unstructured.Unstructured) {
			changed := copy.DeepCopy()
			changed.SetGeneration(copy.GetGeneration() + 1)
			update(t, e, changed)
		}},
		{name: "content hash annotation changed by someone else", want: "changed", drift: func(t *testing.T, e *Engine, copy *unstructured.Unstructured) {
			changed := copy.DeepCopy()
			ann := changed.GetAnnotations()
			ann[naming.AnnotationContentHash] = "edited"
			changed.SetAnnotations(ann)
			update(t, e, changed)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, remote := remoteThing()
			copy := localCopy(remote)
			ann := copy.GetAnnotations()
			ann[naming.AnnotationContentHash] = "h1"
			copy.SetAnnotations(ann)
			copy.SetGeneration(1)
			copy.SetUID("local-uid")
			e, _, sink := testEngine(t, true, copy)
			fake := e.opts.Dynamic.(*dynamicfake.FakeDynamicClient)
			upsert := func(seq uint64) {
				e.Handle(&ferryv1.SyncIntent{Key: key, Version: &ferryv1.ObjectVersion{Sequence: seq}, PublishedResource: "pr",
					Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{ContentHash: "h1",
						Object: []byte(`{"apiVersion":"kcp.example/v1","kind":"Thing","metadata":{"name":"a","namespace":"team"},"spec":{"x":"desired"}}`)}}})
				runQueue(t, e)
			}
			patches := func() int {
				n := 0
				for _, a := range fake.Actions() {
					if a.GetVerb() == "patch" {
						n++
					}
				}
				return n
			}
			// The copy holds h1: recorded as this engine's, nothing written.
			upsert(1)
			if len(sink.msgs) != 1 || sink.msgs[0].GetIntentResult().GetError() != nil || patches() != 0 {
				t.Fatalf("want one ack without a write, got %v (%d patches)", sink.msgs, patches())
			}
			_ = reportsQueued(e)

			// The local watch sees the drift and queues a check of the copy.
			tc.drift(t, e, copy)
			waitFor(t, func() (bool, string) { return e.queue.Len() > 0, "no check of the copy queued" })
			runQueue(t, e)
			var asked []string
			for _, m := range reportsQueued(e) {
				if r := m.GetResendRequest(); r != nil {
					asked = append(asked, r.GetReason())
					if r.GetKey().GetUid() != key.GetUid() || r.GetKey().GetName() != key.GetName() {
						t.Errorf("resend asked for %v, want %v", r.GetKey(), key)
					}
				}
			}
			if len(asked) != 1 || asked[0] != tc.want {
				t.Fatalf("resend requests %v, want one %q", asked, tc.want)
			}
			if n := patches(); n != 0 {
				t.Fatalf("the copy was re-applied from memory (%d patches)", n)
			}

			// The broker's answer: the same state, applied over the drift.
			upsert(2)
			if patches() != 1 {
				t.Fatalf("the re-sent state was not applied (answers %v)", sink.msgs)
			}
		})
	}
}

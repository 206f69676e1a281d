package replication

import (
	"context"

	"encoding/json"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// upsertOf returns an upsert intent for key carrying obj and hash.
func upsertOf(key *ferryv1.ObjectKey, seq uint64, hash, obj string) *ferryv1.SyncIntent {
	return &ferryv1.SyncIntent{Key: key, Version: &ferryv1.ObjectVersion{Sequence: seq}, PublishedResource: "pr",
		Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{ContentHash: hash, Object: []byte(obj)}}}
}

const thingA = `{"apiVersion":"kcp.example/v1","kind":"Thing","metadata":{"name":"a","namespace":"team"},"spec":{"x":"1"}}`

// patches returns the bodies of the apply patches the fake client was sent.
func patches(t *testing.T, e *Engine) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, a := range e.opts.Dynamic.(*dynamicfake.FakeDynamicClient).Actions() {
		p, ok := a.(k8stesting.PatchAction)
		if !ok || a.GetResource().Resource == "publishedresources" {
			continue // condition writes are not copies
		}
		u := &unstructured.Unstructured{}
		if err := json.Unmarshal(p.GetPatch(), &u.Object); err != nil {
			t.Fatalf("patch body: %v", err)
		}
		out = append(out, u)
	}
	return out
}

// acceptApplies makes the fake service cluster answer every apply with the
// applied object (the fake client cannot server-side apply unstructured
// objects); the apply being sent, and its body, is what these tests are about.
func acceptApplies(e *Engine) {
	e.opts.Dynamic.(*dynamicfake.FakeDynamicClient).PrependReactor("patch", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		u := &unstructured.Unstructured{}
		if err := json.Unmarshal(a.(k8stesting.PatchAction).GetPatch(), &u.Object); err != nil {
			return true, nil, err
		}
		return true, u, nil
	})
}

func deletes(e *Engine) int {
	n := 0
	for _, a := range e.opts.Dynamic.(*dynamicfake.FakeDynamicClient).Actions() {
		if a.GetVerb() == "delete" {
			n++
		}
	}
	return n
}

// atTarget returns an object at the place the default naming rules give
// remote's copy, labelled and annotated by set.
func atTarget(t *testing.T, remote naming.Remote, set func(u *unstructured.Unstructured)) *unstructured.Unstructured {
	t.Helper()
	rules, err := naming.Compile(nil)
	if err != nil {
		t.Fatal(err)
	}
	ns, name, err := rules.Local(remote, true)
	if err != nil {
		t.Fatal(err)
	}
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "svc.example/v1", "kind": "Thing"}}
	u.SetNamespace(ns)
	u.SetName(name)
	u.SetUID("local-uid")
	set(u)
	return u
}

// TestApplyWritesOnlyItsOwnCopy: the edge writes a copy only where nothing
// exists or where its own copy of the same kcp object is. Anything else at
// the computed name (a service-owned object, another workspace's copy) is a
// final CONFLICT: no write, no delete.
func TestApplyWritesOnlyItsOwnCopy(t *testing.T) {
	key, remote := remoteThing()
	other := naming.Remote{ClusterName: "c2", Namespace: "team", Name: "a", UID: "u-other"}
	for _, tc := range []struct {
		name     string
		present  func(t *testing.T) *unstructured.Unstructured // nil: nothing at the target
		conflict bool
	}{
		{name: "nothing there"},
		{name: "a service-owned object", conflict: true, present: func(t *testing.T) *unstructured.Unstructured {
			return atTarget(t, remote, func(u *unstructured.Unstructured) { u.SetLabels(map[string]string{"app": "db"}) })
		}},
		{name: "another workspace's copy", conflict: true, present: func(t *testing.T) *unstructured.Unstructured {
			return atTarget(t, remote, func(u *unstructured.Unstructured) {
				u.SetLabels(naming.Labels("nora", other))
				u.SetAnnotations(naming.Annotations(other))
			})
		}},
		{name: "its own copy with mangled labels (found by the kcp UID)", present: func(t *testing.T) *unstructured.Unstructured {
			return atTarget(t, remote, func(u *unstructured.Unstructured) {
				u.SetLabels(map[string]string{naming.LabelAgent: "nora"})
				u.SetAnnotations(naming.Annotations(remote))
			})
		}},
		{name: "only the UID annotation of another object", conflict: true, present: func(t *testing.T) *unstructured.Unstructured {
			return atTarget(t, remote, func(u *unstructured.Unstructured) {
				u.SetAnnotations(map[string]string{naming.AnnotationUID: "u-other"})
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var objs []runtime.Object
			if tc.present != nil {
				objs = append(objs, tc.present(t))
			}
			e, _, sink := testEngine(t, true, objs...)
			acceptApplies(e)
			e.Handle(upsertOf(key, 2, "h1", thingA))
			runQueue(t, e)
			if len(sink.msgs) != 1 {
				t.Fatalf("want one answer, got %v", sink.msgs)
			}
			res := sink.msgs[0].GetIntentResult()
			if tc.conflict {
				if res.GetError().GetReason() != ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT || res.GetError().GetRetryable() {
					t.Fatalf("answer %v: want a final CONFLICT", res)
				}
				if n := len(patches(t, e)); n != 0 {
					t.Fatalf("%d writes to an object that is not ferry's copy of this kcp object", n)
				}
			} else if p := patches(t, e); res.GetError() != nil || len(p) != 1 {
				t.Fatalf("answer %v: want the copy applied once", res)
			} else if want := ""; tc.present != nil && string(p[0].GetUID()) != "local-uid" || tc.present == nil && string(p[0].GetUID()) != want {
				// The apply carries the UID of the copy it checked as a
				// precondition (none for a new copy).
				t.Fatalf("apply with metadata.uid %q", p[0].GetUID())
			}
			if deletes(e) != 0 {
				t.Fatal("deleted an object")
			}
		})
	}
}

// TestRecreatedObjectTakesOverItsCopy: a kcp object deleted and recreated
// with the same manifest while its copy stayed (an orphaned copy, or one
// whose deletion never reached the edge) has a new UID; the copy is applied
// again so it carries that UID (status and related objects of a copy with
// the old UID are refused by the broker as gone).
func TestRecreatedObjectTakesOverItsCopy(t *testing.T) {
	key, remote := remoteThing()
	old := localCopy(remote)
	ann := old.GetAnnotations()
	ann[naming.AnnotationUID] = "u-old"
	ann[naming.AnnotationContentHash] = "h1"
	old.SetAnnotations(ann)
	e, _, sink := testEngine(t, true, old)
	acceptApplies(e)
	e.Handle(upsertOf(key, 2, "h1", thingA)) // key.Uid is u-a
	runQueue(t, e)
	if len(sink.msgs) != 1 || sink.msgs[0].GetIntentResult().GetError() != nil {
		t.Fatalf("want one ack, got %v", sink.msgs)
	}
	p := patches(t, e)
	if len(p) != 1 || p[0].GetAnnotations()[naming.AnnotationUID] != "u-a" {
		t.Fatalf("the copy was not applied with the new UID (applies: %v)", p)
	}
}

// TestDeleteOfAnOldUIDKeepsTheNewObjectsCopy: a delete for a kcp object
// that is gone, arriving after the copy was taken over by the object that
// replaced it (same name, new UID), confirms without deleting that copy.
func TestDeleteOfAnOldUIDKeepsTheNewObjectsCopy(t *testing.T) {
	key, remote := remoteThing() // the copy belongs to u-a
	cp := localCopy(remote)
	e, _, sink := testEngine(t, true, cp)
	oldKey := &ferryv1.ObjectKey{Cluster: key.GetCluster(), Resource: key.GetResource(), Namespace: key.GetNamespace(), Name: key.GetName(), Uid: "u-old"}
	e.Handle(&ferryv1.SyncIntent{Key: oldKey, Version: &ferryv1.ObjectVersion{Sequence: 2}, PublishedResource: "pr",
		Operation: &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{}}})
	runQueue(t, e)
	if len(sink.msgs) != 1 || sink.msgs[0].GetIntentResult().GetError() != nil {
		t.Fatalf("want one ack, got %v", sink.msgs)
	}
	if deletes(e) != 0 {
		t.Fatal("the copy of the object that replaced the deleted one was deleted")
	}
	got := reportsQueued(e)
	if len(got) != 1 || got[0].GetDeletionConfirmation().GetKey().GetUid() != "u-old" {
		t.Fatalf("want the old UID's deletion confirmed, got %v", got)
	}
}

// TestConsumerCannotSetFerryMetadata: ferry.dev/* labels and annotations a
// kcp consumer puts on an object are ferry's bookkeeping on the copy; they
// never cross from kcp (a consumer could otherwise point the edge's admin
// lookup, or related-object handling, at another workspace).
func TestConsumerCannotSetFerryMetadata(t *testing.T) {
	key, _ := remoteThing()
	e, _, sink := testEngine(t, true)
	acceptApplies(e)
	obj := `{"apiVersion":"kcp.example/v1","kind":"Thing","metadata":{"name":"a","namespace":"team",` +
		`"labels":{"ferry.dev/related-to":"u-x","app":"web"},` +
		`"annotations":{"ferry.dev/remote-workspace-path":"root:someone-else","note":"kept"}},"spec":{"x":"1"}}`
	e.Handle(upsertOf(key, 2, "h1", obj))
	runQueue(t, e)
	if len(sink.msgs) != 1 || sink.msgs[0].GetIntentResult().GetError() != nil {
		t.Fatalf("want one ack, got %v", sink.msgs)
	}
	p := patches(t, e)
	if len(p) != 1 {
		t.Fatalf("want one apply, got %d", len(p))
	}
	for k := range p[0].GetLabels() {
		if k == naming.LabelRelatedTo {
			t.Errorf("consumer label %s reached the copy", k)
		}
	}
	if got := p[0].GetAnnotations()[naming.AnnotationWorkspacePath]; strings.Contains(got, "someone-else") {
		t.Errorf("consumer annotation %s=%s reached the copy", naming.AnnotationWorkspacePath, got)
	}
	if p[0].GetLabels()["app"] != "web" || p[0].GetAnnotations()["note"] != "kept" {
		t.Errorf("the consumer's own metadata was lost: %v %v", p[0].GetLabels(), p[0].GetAnnotations())
	}
}

// TestConflictsAreCountedOnThePublishedResource: objects refused because
// their local name is taken are counted in the Synced condition of their
// PublishedResource (the service owner sees them without reading Events in
// every workspace); the count drops when the conflict is gone.
func TestConflictsAreCountedOnThePublishedResource(t *testing.T) {
	key, remote := remoteThing()
	taken := atTarget(t, remote, func(u *unstructured.Unstructured) { u.SetLabels(map[string]string{"app": "db"}) })
	e, _, _ := testEngine(t, true, taken)
	acceptApplies(e)
	conditionMessages := func() []string {
		var out []string
		for _, a := range e.opts.Dynamic.(*dynamicfake.FakeDynamicClient).Actions() {
			p, ok := a.(k8stesting.PatchAction)
			if !ok || a.GetResource().Resource != "publishedresources" {
				continue
			}
			out = append(out, string(p.GetPatch()))
		}
		return out
	}
	e.Handle(upsertOf(key, 2, "h1", thingA))
	runQueue(t, e)
	got := conditionMessages()
	if len(got) == 0 || !strings.Contains(got[len(got)-1], "1 object is refused") {
		t.Fatalf("Synced condition writes %v: want the conflict counted", got)
	}
	if n, _ := conflictsWritten(t, e); n != 1 {
		t.Fatalf("status.objects.conflicting = %d, want 1", n)
	}
	// The service owner removes the object: the copy is made, the count goes.
	if err := e.opts.Dynamic.Resource(localGVR).Namespace(taken.GetNamespace()).Delete(context.Background(), taken.GetName(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.Handle(upsertOf(key, 3, "h1", thingA))
	runQueue(t, e)
	got = conditionMessages()
	if last := got[len(got)-1]; strings.Contains(last, "refused") {
		t.Fatalf("the conflict is still counted after it was resolved: %s", last)
	}
	if n, written := conflictsWritten(t, e); !written || n != 0 {
		t.Fatalf("status.objects.conflicting = %d (written %v) after the conflict was resolved, want 0", n, written)
	}
}

// TestDeleteNeedsTheCopysUID: a delete intent deletes a copy only when the
// copy's annotations carry exactly the intent's kcp UID; a copy without it
// (tampered, or of unknown origin) is left alone.
func TestDeleteNeedsTheCopysUID(t *testing.T) {
	key, remote := remoteThing()
	cp := localCopy(remote)
	ann := cp.GetAnnotations()
	delete(ann, naming.AnnotationUID)
	cp.SetAnnotations(ann)
	e, _, sink := testEngine(t, true, cp)
	e.Handle(&ferryv1.SyncIntent{Key: key, Version: &ferryv1.ObjectVersion{Sequence: 2}, PublishedResource: "pr",
		Operation: &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{}}})
	runQueue(t, e)
	if len(sink.msgs) != 1 {
		t.Fatalf("want one answer, got %v", sink.msgs)
	}
	if deletes(e) != 0 {
		t.Fatal("a copy that does not carry the kcp object's UID was deleted")
	}
}

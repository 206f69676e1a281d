package replication

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ktypes "k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/objects"
	"github.com/ferry-dev/ferry/pkg/related"
)

// otherRemoteGVR is a second kcp resource published onto the same local CRD
// (another PublishedResource, or an earlier one deleted with Orphan).
var otherRemoteGVR = schema.GroupVersionResource{Group: "kcp.example", Version: "v1", Resource: "others"}

// copyFor returns a local copy of the kcp object named name in workspace c1,
// made for the kcp resource gr by PublishedResource pr; a zero gr makes a
// copy of an earlier version of ferry (no kcp resource recorded).
func copyFor(name string, gr schema.GroupResource, pr string) *unstructured.Unstructured {
	remote := naming.Remote{ClusterName: "c1", Namespace: "team", Name: name, UID: "u-" + name}
	u := localCopy(remote)
	u.SetName(name + "-copy")
	u.SetUID(ktypes.UID("local-" + name))
	l := naming.Labels("nora", remote)
	if gr != (schema.GroupResource{}) {
		l = objects.MergeStrings(l, naming.OwnerLabels(gr, pr))
	}
	u.SetLabels(l)
	ann := u.GetAnnotations()
	ann[naming.AnnotationContentHash] = "h-" + name
	u.SetAnnotations(ann)
	return u
}

// liveEngine returns a running engine over a fake service cluster holding
// objs, so registering a PublishedResource starts its real watch (label
// selectors included).
func liveEngine(t *testing.T, objs ...runtime.Object) *Engine {
	t.Helper()
	return liveEngineWith(t, engineSetup{}, objs...)
}

func publish(t *testing.T, e *Engine, name string, remote schema.GroupVersionResource) *localWatch {
	t.Helper()
	rules, err := naming.Compile(nil)
	if err != nil {
		t.Fatal(err)
	}
	e.SetPublished(&Published{Name: name, Remote: remote, Local: localGVR, LocalKind: "Thing", Namespaced: true, Naming: rules})
	e.mu.Lock()
	w := e.watches[name]
	e.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		e.mu.Lock()
		synced := w.synced
		e.mu.Unlock()
		if synced {
			return w
		}
		if time.Now().After(deadline) {
			t.Fatalf("the local watch of %s did not sync", name)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// inventoryOf returns the entries of pr's inventory sent on a new stream.
func inventoryOf(t *testing.T, e *Engine, pr string) map[string]*ferryv1.InventoryEntry {
	t.Helper()
	e.Attach(&recordingSink{})
	out := map[string]*ferryv1.InventoryEntry{}
	complete := false
	for {
		m, ok := e.Next()
		if !ok {
			break
		}
		inv := m.GetInventory()
		if inv == nil || inv.GetPublishedResource() != pr {
			continue
		}
		for _, entry := range inv.GetEntries() {
			out[entry.GetLocalName()] = entry
		}
		complete = complete || inv.GetComplete()
	}
	if !complete {
		t.Fatalf("no complete inventory of %s", pr)
	}
	return out
}

// TestInventoryListsOnlyCopiesOfItsResource: a PublishedResource's
// inventory lists only the copies of its own kcp resource. Copies of
// another kcp resource on the same local CRD (another PublishedResource's)
// were listed under this resource's key, and the broker deleted each as
// gone. A copy an earlier PublishedResource of the same kcp resource
// orphaned is picked up again, reported unapplied so the broker re-sends it
// and it is relabelled; a copy of an earlier version of ferry is not
// reported while it is not adopted (here: two PublishedResources publish
// its local resource).
func TestInventoryListsOnlyCopiesOfItsResource(t *testing.T) {
	e := liveEngine(t,
		copyFor("mine", remoteGVR.GroupResource(), "pr"),
		copyFor("theirs", otherRemoteGVR.GroupResource(), "other"),
		copyFor("orphan", remoteGVR.GroupResource(), "deleted-pr"),
		copyFor("legacy", schema.GroupResource{}, ""),
	)
	publish(t, e, "pr", remoteGVR)
	publish(t, e, "other", otherRemoteGVR)

	got := inventoryOf(t, e, "pr")
	if len(got) != 2 || got["mine-copy"] == nil || got["orphan-copy"] == nil {
		t.Fatalf("inventory of pr lists %v, want mine-copy and orphan-copy", keysOf(got))
	}
	if h := got["mine-copy"].GetAppliedHash(); h != "h-mine" {
		t.Errorf("mine-copy reported with hash %q, want h-mine", h)
	}
	if h := got["orphan-copy"].GetAppliedHash(); h != "" {
		t.Errorf("an orphan of another PublishedResource was reported applied (%q): it would never be relabelled", h)
	}
	other := inventoryOf(t, e, "other")
	if len(other) != 1 || other["theirs-copy"] == nil {
		t.Fatalf("inventory of other lists %v, want theirs-copy", keysOf(other))
	}
	if r := other["theirs-copy"].GetKey().GetResource(); r.GetResource() != "others" {
		t.Errorf("theirs-copy reported as a copy of %v", r)
	}
}

func keysOf(m map[string]*ferryv1.InventoryEntry) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestDeleteCopiesDeletesOnlyItsResourcesCopies: deletionPolicy Delete
// deletes the copies of the PublishedResource's kcp resource only: not the
// copies of another kcp resource on the same CRD, and not copies of an
// earlier version of ferry that were never adopted (whose kcp resource
// nothing records).
func TestDeleteCopiesDeletesOnlyItsResourcesCopies(t *testing.T) {
	mine, theirs, legacy := copyFor("mine", remoteGVR.GroupResource(), "pr"),
		copyFor("theirs", otherRemoteGVR.GroupResource(), "other"), copyFor("legacy", schema.GroupResource{}, "")
	e, _, _ := testEngine(t, true, mine, theirs, legacy)
	remaining, err := e.DeleteCopies(context.Background(), remoteGVR.GroupResource(), localGVR, nil)
	if err != nil {
		t.Fatal(err)
	}
	if remaining != 1 {
		t.Errorf("remaining %d, want 1 (mine-copy, deleting)", remaining)
	}
	for _, u := range []*unstructured.Unstructured{theirs, legacy} {
		if _, err := e.opts.Dynamic.Resource(localGVR).Namespace(u.GetNamespace()).Get(context.Background(), u.GetName(), getOpts); err != nil {
			t.Errorf("%s was deleted: %v", u.GetName(), err)
		}
	}
	if _, err := e.opts.Dynamic.Resource(localGVR).Namespace(mine.GetNamespace()).Get(context.Background(), mine.GetName(), getOpts); err == nil {
		t.Error("mine-copy was not deleted")
	}
}

// TestApplySetsTheIdentityLabels: a copy carries the kcp resource and the
// PublishedResource it was applied for.
func TestApplySetsTheIdentityLabels(t *testing.T) {
	key, _ := remoteThing()
	e, _, sink := testEngine(t, true)
	acceptApplies(e)
	e.Handle(upsertOf(key, 2, "h1", thingA))
	runQueue(t, e)
	if len(sink.msgs) != 1 || sink.msgs[0].GetIntentResult().GetError() != nil {
		t.Fatalf("want one ack, got %v", sink.msgs)
	}
	p := patches(t, e)
	if len(p) != 1 {
		t.Fatalf("want one apply, got %d", len(p))
	}
	l := p[0].GetLabels()
	if l[naming.LabelRemoteResource] != "things.kcp.example" || l[naming.LabelPublishedResource] != "pr" {
		t.Fatalf("copy labels %v: want %s=things.kcp.example and %s=pr", l, naming.LabelRemoteResource, naming.LabelPublishedResource)
	}
}

// TestApplyRelabelsAnOrphanedCopy: an unchanged copy (same content hash,
// UID and shape) that another PublishedResource of the same kcp resource
// applied, or that an earlier version made, is applied again so that it
// carries the current labels; a copy already labelled is not written.
func TestApplyRelabelsAnOrphanedCopy(t *testing.T) {
	for _, tc := range []struct {
		name  string
		pr    string
		gr    schema.GroupResource
		write bool
	}{
		{name: "labelled by this PublishedResource", pr: "pr", gr: remoteGVR.GroupResource()},
		{name: "orphaned by an earlier PublishedResource", pr: "deleted-pr", gr: remoteGVR.GroupResource(), write: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, _ := remoteThing()
			cp := copyFor("a", tc.gr, tc.pr)
			ann := cp.GetAnnotations()
			ann[naming.AnnotationContentHash] = "h1"
			cp.SetAnnotations(ann)
			e, _, sink := testEngine(t, true, cp)
			acceptApplies(e)
			e.Handle(upsertOf(key, 2, "h1", thingA))
			runQueue(t, e)
			if len(sink.msgs) != 1 || sink.msgs[0].GetIntentResult().GetError() != nil {
				t.Fatalf("want one ack, got %v", sink.msgs)
			}
			p := patches(t, e)
			if !tc.write {
				if len(p) != 0 {
					t.Fatalf("an unchanged copy was written %d times", len(p))
				}
				return
			}
			if len(p) != 1 || p[0].GetLabels()[naming.LabelPublishedResource] != "pr" {
				t.Fatalf("the copy was not relabelled (applies: %v)", p)
			}
		})
	}
}

// TestApplyRefusesTheCopyOfAnotherResource: at the place the naming rules
// give a copy sits the copy of the object of the same workspace, namespace
// and name of another kcp resource on the same CRD: it is not this object's
// copy, so it is a final CONFLICT, never overwritten.
func TestApplyRefusesTheCopyOfAnotherResource(t *testing.T) {
	key, remote := remoteThing()
	there := atTarget(t, remote, func(u *unstructured.Unstructured) {
		l := naming.Labels("nora", remote)
		for k, v := range naming.OwnerLabels(otherRemoteGVR.GroupResource(), "other") {
			l[k] = v
		}
		u.SetLabels(l)
		ann := naming.Annotations(remote)
		ann[naming.AnnotationUID] = "u-other"
		u.SetAnnotations(ann)
	})
	e, _, sink := testEngine(t, true, there)
	acceptApplies(e)
	e.Handle(upsertOf(key, 2, "h1", thingA))
	runQueue(t, e)
	if len(sink.msgs) != 1 {
		t.Fatalf("want one answer, got %v", sink.msgs)
	}
	res := sink.msgs[0].GetIntentResult()
	if res.GetError().GetReason() != ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT || res.GetError().GetRetryable() {
		t.Fatalf("answer %v: want a final CONFLICT", res)
	}
	if n := len(patches(t, e)); n != 0 {
		t.Fatalf("%d writes to another kcp resource's copy", n)
	}
}

// TestLegacyCopies: a copy an earlier version of ferry made (no kcp
// resource recorded) is adopted only when an upsert for exactly its kcp
// object (its UID) is applied: in place, with the identity labels. It is
// never reported, and a delete intent never deletes it (nothing proves
// which kcp resource it belongs to), even when it is the only
// PublishedResource of its CRD.
func TestLegacyCopies(t *testing.T) {
	key, _ := remoteThing() // workspace c1, team/a, UID u-a
	legacyOf := func(uid string) *unstructured.Unstructured {
		u := copyFor("a", schema.GroupResource{}, "")
		u.SetNamespace("elsewhere") // not where today's naming rules put it
		ann := u.GetAnnotations()
		ann[naming.AnnotationUID] = uid
		u.SetAnnotations(ann)
		return u
	}
	t.Run("an upsert of its object adopts it in place", func(t *testing.T) {
		legacy := legacyOf("u-a")
		e, w, sink := testEngine(t, true, legacy)
		acceptApplies(e)
		e.Handle(upsertOf(key, 2, "h1", thingA))
		runQueue(t, e)
		res := sink.msgs[0].GetIntentResult()
		if res.GetError() != nil || res.GetLocalNamespace() != "elsewhere" || res.GetLocalName() != "a-copy" {
			t.Fatalf("answer %v: want the copy applied where it is", res)
		}
		p := patches(t, e)
		if len(p) != 1 || !labelledFor(p[0], w.pub) || p[0].GetNamespace() != "elsewhere" {
			t.Fatalf("the legacy copy was not adopted in place (applies: %v)", p)
		}
	})
	t.Run("an upsert of another object of its name does not adopt it", func(t *testing.T) {
		legacy := legacyOf("u-earlier")
		e, _, sink := testEngine(t, true, legacy)
		acceptApplies(e)
		e.Handle(upsertOf(key, 2, "h1", thingA))
		runQueue(t, e)
		if res := sink.msgs[0].GetIntentResult(); res.GetLocalNamespace() == "elsewhere" {
			t.Fatalf("answer %v: a legacy copy of another UID was adopted", res)
		}
		for _, p := range patches(t, e) {
			if p.GetNamespace() == "elsewhere" {
				t.Fatal("a legacy copy of another UID was written")
			}
		}
	})
	t.Run("where the new object's copy goes, with another UID, it is a CONFLICT", func(t *testing.T) {
		_, remote := remoteThing()
		legacy := atTarget(t, remote, func(u *unstructured.Unstructured) {
			u.SetLabels(naming.Labels("nora", remote))
			ann := naming.Annotations(remote)
			ann[naming.AnnotationUID] = "u-earlier"
			u.SetAnnotations(ann)
		})
		e, _, sink := testEngine(t, true, legacy)
		acceptApplies(e)
		e.Handle(upsertOf(key, 2, "h1", thingA))
		runQueue(t, e)
		res := sink.msgs[0].GetIntentResult()
		if res.GetError().GetReason() != ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT || len(patches(t, e)) != 0 {
			t.Fatalf("answer %v: want a CONFLICT and no write", res)
		}
	})
	t.Run("a delete leaves it", func(t *testing.T) {
		legacy := legacyOf("u-a")
		e, _, sink := testEngine(t, true, legacy)
		e.Handle(&ferryv1.SyncIntent{Key: key, Version: &ferryv1.ObjectVersion{Sequence: 2}, PublishedResource: "pr",
			Operation: &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{}}})
		runQueue(t, e)
		if len(sink.msgs) != 1 || sink.msgs[0].GetIntentResult().GetError() != nil {
			t.Fatalf("want one ack, got %v", sink.msgs)
		}
		if deletes(e) != 0 {
			t.Fatal("a copy made by an earlier version was deleted")
		}
	})
	t.Run("never reported, also with one PublishedResource", func(t *testing.T) {
		e := liveEngine(t, copyFor("legacy", schema.GroupResource{}, ""), copyFor("mine", remoteGVR.GroupResource(), "pr"))
		publish(t, e, "pr", remoteGVR)
		if got := inventoryOf(t, e, "pr"); len(got) != 1 || got["mine-copy"] == nil {
			t.Fatalf("inventory lists %v, want mine-copy only", keysOf(got))
		}
	})
}

// TestDeleteCopiesDeletesOnlyRelatedCopiesOfItsCopies: deletionPolicy
// Delete deletes a kcp-origin related copy only when its primary is one of
// the PublishedResource's copies: the related copies of another kcp
// resource's objects (same related[] identifier, same kind) stay.
func TestDeleteCopiesDeletesOnlyRelatedCopiesOfItsCopies(t *testing.T) {
	secretGVR := schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	secret := func(name, primaryUID string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret"}}
		u.SetNamespace("local-ns")
		u.SetName(name)
		u.SetLabels(map[string]string{naming.LabelAgent: "nora", naming.LabelRelatedTo: primaryUID, naming.LabelRelatedIdentifier: "creds"})
		return u
	}
	mine, theirs := copyFor("mine", remoteGVR.GroupResource(), "pr"), copyFor("theirs", otherRemoteGVR.GroupResource(), "other")
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{localGVR: "ThingList", secretGVR: "SecretList"},
		mine, theirs, secret("creds-mine", "u-mine"), secret("creds-theirs", "u-theirs"))
	e := NewEngine(Options{Agent: "nora", Dynamic: dyn, Kube: kubefake.NewClientset(), Wake: func() {}, Log: logr.Discard()})
	ref := Related{Reference: &related.Reference{Identifier: "creds", Origin: ferryv1alpha1.OriginKCP}, Local: secretGVR}
	if _, err := e.DeleteCopies(context.Background(), remoteGVR.GroupResource(), localGVR, []Related{ref}); err != nil {
		t.Fatal(err)
	}
	if _, err := dyn.Resource(secretGVR).Namespace("local-ns").Get(context.Background(), "creds-theirs", getOpts); err != nil {
		t.Errorf("the related copy of another resource's copy was deleted: %v", err)
	}
	if _, err := dyn.Resource(secretGVR).Namespace("local-ns").Get(context.Background(), "creds-mine", getOpts); err == nil {
		t.Error("the related copy of its own copy was not deleted")
	}
}

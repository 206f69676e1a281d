package replication

import (
	"context"
	"errors"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// withFinalizers sets u's finalizers.
func withFinalizers(u *unstructured.Unstructured, f ...string) *unstructured.Unstructured {
	u.SetFinalizers(f)
	return u
}

// TestAdoptedFinalizerSwap: once the edge acks an upsert saying it adopted
// api-syncagent's copy, the broker replaces api-syncagent's finalizer on
// the kcp object with its own in one patch (never leaving the object
// unguarded); without that word, for another UID, or for an agent the
// protocol does not name, api-syncagent's finalizer stays. Other
// finalizers are kept.
func TestAdoptedFinalizerSwap(t *testing.T) {
	spec := map[string]any{"size": int64(1)}
	upsert := func(uid string) *ferryv1.SyncIntent {
		k := thingKey()
		k.Uid = uid
		return &ferryv1.SyncIntent{Key: k, PublishedResource: "pr", Version: &ferryv1.ObjectVersion{Sequence: 1},
			Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{ContentHash: "h"}}}
	}
	for _, tc := range []struct {
		name   string
		obj    *unstructured.Unstructured
		intent *ferryv1.SyncIntent
		from   ferryv1.AdoptedFrom
		// release: the edge then confirms the copy's deletion.
		release bool
		want    []string
	}{
		{name: "both finalizers: api-syncagent's goes", obj: withFinalizers(thing("1", spec, nil), SyncAgentFinalizer, "ferry.dev/nora", "svc.example/keep"),
			intent: upsert("u-a"), from: ferryv1.AdoptedFrom_ADOPTED_FROM_API_SYNCAGENT, want: []string{"ferry.dev/nora", "svc.example/keep"}},
		{name: "only api-syncagent's: swapped in one patch", obj: withFinalizers(thing("1", spec, nil), SyncAgentFinalizer),
			intent: upsert("u-a"), from: ferryv1.AdoptedFrom_ADOPTED_FROM_API_SYNCAGENT, want: []string{"ferry.dev/nora"}},
		{name: "an ack that adopted nothing: api-syncagent's stays", obj: withFinalizers(thing("1", spec, nil), SyncAgentFinalizer, "ferry.dev/nora"),
			intent: upsert("u-a"), want: []string{SyncAgentFinalizer, "ferry.dev/nora"}},
		{name: "an ack for another UID (an older object of the name): api-syncagent's stays",
			obj:    withFinalizers(thing("1", spec, nil), SyncAgentFinalizer, "ferry.dev/nora"),
			intent: upsert("u-old"), from: ferryv1.AdoptedFrom_ADOPTED_FROM_API_SYNCAGENT, want: []string{SyncAgentFinalizer, "ferry.dev/nora"}},
		{name: "an unknown agent: nothing removed", obj: withFinalizers(thing("1", spec, nil), SyncAgentFinalizer, "ferry.dev/nora"),
			intent: upsert("u-a"), from: ferryv1.AdoptedFrom(42), want: []string{SyncAgentFinalizer, "ferry.dev/nora"}},
		{name: "deleted in kcp before the swap: the deletion confirmation releases both",
			obj:    deleting(withFinalizers(thing("1", spec, nil), SyncAgentFinalizer, "ferry.dev/nora", "svc.example/keep")),
			intent: upsert("u-a"), from: ferryv1.AdoptedFrom_ADOPTED_FROM_API_SYNCAGENT, release: true, want: []string{"svc.example/keep"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, thingsResource(), tc.obj)
			e.m.Adopted("pr", tc.intent, tc.from)
			if tc.release {
				if err := e.m.Release(context.Background(), "pr", thingKey()); err != nil {
					t.Fatal(err)
				}
			} else {
				drainFinalizers(t, e.m)
			}
			got, err := e.kcp.Resource(thingsGVR).Namespace("ns").Get(context.Background(), "a", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			f := got.GetFinalizers()
			slices.Sort(f)
			want := slices.Clone(tc.want)
			slices.Sort(want)
			if !slices.Equal(f, want) {
				t.Fatalf("finalizers %v, want %v", f, want)
			}
		})
	}
}

// TestAdoptedFinalizerSwapFromInventory: an adoption whose ack was lost
// with a stream is repeated by the edge's inventory (an unchanged object
// is not sent again, so no new ack would come): the swap is done then.
func TestAdoptedFinalizerSwapFromInventory(t *testing.T) {
	for _, tc := range []struct {
		name string
		from ferryv1.AdoptedFrom
		want []string
	}{
		{name: "listed as adopted from api-syncagent", from: ferryv1.AdoptedFrom_ADOPTED_FROM_API_SYNCAGENT, want: []string{"ferry.dev/nora"}},
		{name: "listed without adoption", want: []string{SyncAgentFinalizer, "ferry.dev/nora"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, thingsResource(), withFinalizers(thing("1", map[string]any{"size": int64(1)}, nil), SyncAgentFinalizer, "ferry.dev/nora"))
			e.m.Inventory(&ferryv1.Inventory{PublishedResource: "pr", Complete: true, Entries: []*ferryv1.InventoryEntry{
				{Key: thingKey(), AppliedHash: "h", PublishedResource: "pr", AdoptedFrom: tc.from},
			}})
			drainFinalizers(t, e.m)
			got, err := e.kcp.Resource(thingsGVR).Namespace("ns").Get(context.Background(), "a", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if f := got.GetFinalizers(); !slices.Equal(f, tc.want) {
				t.Fatalf("finalizers %v, want %v", f, tc.want)
			}
		})
	}
}

// TestDeletedBeforeAdoption: a kcp object deleted while its copy was still
// api-syncagent's (not adopted yet; only api-syncagent's finalizer on it)
// is asked to be deleted when the PublishedResource adopts api-syncagent's
// copies, and the edge's confirmation releases api-syncagent's finalizer,
// so nothing of api-syncagent blocks the deletion. Without spec.adopt, or
// for an object that merely left the filters, ferry leaves it alone.
func TestDeletedBeforeAdoption(t *testing.T) {
	spec := map[string]any{"size": int64(1)}
	for _, tc := range []struct {
		name   string
		obj    *unstructured.Unstructured
		adopts bool
		// want: the intent ("delete" or ""), and the finalizers after the
		// edge's confirmation (nil: the confirmation is refused).
		want       string
		finalizers []string
	}{
		{name: "deleted, adopting: its copy deleted, the finalizer released", adopts: true,
			obj: deleting(withFinalizers(thing("1", spec, nil), SyncAgentFinalizer, "svc.example/keep")), want: "delete", finalizers: []string{"svc.example/keep"}},
		{name: "deleted, not adopting: left to api-syncagent",
			obj: deleting(withFinalizers(thing("1", spec, nil), SyncAgentFinalizer))},
		{name: "out of the filters, adopting: left alone", adopts: true,
			obj: withLabels(withFinalizers(thing("1", spec, nil), SyncAgentFinalizer), map[string]string{"team": "b"})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := thingsResource()
			res.Selector = labels.SelectorFromSet(labels.Set{"team": "a"})
			if tc.adopts {
				res.AdoptFinalizer = SyncAgentFinalizer
			}
			e := newEnv(t, res, tc.obj)
			drain(t, e.m)
			in := e.intents.Next()
			got := ""
			switch {
			case in.GetDelete() != nil:
				got = "delete"
			case in.GetUpsert() != nil:
				got = "upsert"
			}
			if got != tc.want {
				t.Fatalf("intent %q, want %q", got, tc.want)
			}
			err := e.m.Release(context.Background(), "pr", thingKey())
			if refused := errors.Is(err, ErrNotDeleting); refused != (tc.finalizers == nil) {
				t.Fatalf("confirmation refused = %v (%v), want %v", refused, err, tc.finalizers == nil)
			}
			obj, err := e.kcp.Resource(thingsGVR).Namespace("ns").Get(context.Background(), "a", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			want := tc.finalizers
			if want == nil {
				want = tc.obj.GetFinalizers()
			}
			if f := obj.GetFinalizers(); !slices.Equal(f, want) {
				t.Fatalf("finalizers %v, want %v", f, want)
			}
		})
	}
}

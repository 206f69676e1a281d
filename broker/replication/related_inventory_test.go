package replication

import (
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/objects"
	"github.com/ferry-dev/ferry/pkg/related"
)

// kcpSecret is the Secret creds of workspace c, namespace ns.
func kcpSecret(password string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret",
		"metadata": map[string]any{"name": "creds", "namespace": "ns", "uid": "u-s", "resourceVersion": "7",
			"annotations": map[string]any{"kcp.io/cluster": "c"}},
		"data": map[string]any{"password": password}}}
}

// sentIntents takes every intent from the outbox, answering each, and
// counts the primaries' and the related objects' ones.
func sentIntents(intents *Intents) (primaries, relatedUpserts, relatedDeletes int) {
	for in := intents.Next(); in != nil; in = intents.Next() {
		switch {
		case in.GetRelatedTo() == nil:
			primaries++
		case in.GetUpsert() != nil:
			relatedUpserts++
		default:
			relatedDeletes++
		}
		intents.Done(in.GetKey(), in.GetRelatedTo(), in.GetVersion())
	}
	return primaries, relatedUpserts, relatedDeletes
}

// TestReconnectSendsOnlyRelatedObjectsTheEdgeLacks: kcp-origin related
// objects used to be sent again, in full, on every reconnect (what was
// sent was forgotten with the stream). The edge's inventory now lists the
// related copies it holds with their content hash; the broker sends only
// those that differ, and none when nothing changed.
func TestReconnectSendsOnlyRelatedObjectsTheEdgeLacks(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "creds", Origin: ferryv1alpha1.OriginKCP, Kind: "Secret",
		Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	held := func(s *unstructured.Unstructured) []*ferryv1.RelatedInventoryEntry {
		return []*ferryv1.RelatedInventoryEntry{{RelatedTo: &ferryv1.RelatedTo{Primary: thingKey(), Identifier: "creds"},
			Key: &ferryv1.ObjectKey{Cluster: "c", Namespace: "ns", Name: "creds", Uid: string(s.GetUID())}, AppliedHash: objects.RelatedHash(s)}}
	}
	for _, tc := range []struct {
		name string
		// before is the Secret in kcp when the edge applies it (nil: none),
		// after when the stream is back.
		before, after *unstructured.Unstructured
		// unanswered: the first stream ended before the edge's answer.
		unanswered bool
		related    []*ferryv1.RelatedInventoryEntry
		complete   bool
		// upserts and deletes are the related intents sent after the
		// reconnect.
		upserts, deletes int
	}{
		{name: "nothing changed", before: kcpSecret("aA=="), after: kcpSecret("aA=="), related: held(kcpSecret("aA==")), complete: true},
		{name: "nothing changed, the answer was lost with the stream", before: kcpSecret("aA=="), after: kcpSecret("aA=="), unanswered: true,
			related: held(kcpSecret("aA==")), complete: true},
		{name: "nothing in kcp, nothing on the edge", complete: true},
		{name: "an edge that lists no related copies (older version)", before: kcpSecret("aA=="), after: kcpSecret("aA=="), upserts: 1},
		{name: "changed in kcp meanwhile", before: kcpSecret("aA=="), after: kcpSecret("bB=="), related: held(kcpSecret("aA==")), complete: true, upserts: 1},
		{name: "deleted in kcp meanwhile", before: kcpSecret("aA=="), related: held(kcpSecret("aA==")), complete: true, deletes: 1},
		{name: "edited on the edge (no hash)", before: kcpSecret("aA=="), after: kcpSecret("aA=="), complete: true, upserts: 1,
			related: []*ferryv1.RelatedInventoryEntry{{RelatedTo: &ferryv1.RelatedTo{Primary: thingKey(), Identifier: "creds"},
				Key: &ferryv1.ObjectKey{Cluster: "c", Namespace: "ns", Name: "creds", Uid: "u-s"}}}},
		{name: "the edge's copy is an older primary's", before: kcpSecret("aA=="), after: kcpSecret("aA=="), complete: true, upserts: 1,
			related: []*ferryv1.RelatedInventoryEntry{{RelatedTo: &ferryv1.RelatedTo{Primary: &ferryv1.ObjectKey{Cluster: "c", Namespace: "ns", Name: "a", Uid: "u-old"},
				Identifier: "creds"}, Key: &ferryv1.ObjectKey{Cluster: "c", Namespace: "ns", Name: "creds", Uid: "u-s"}, AppliedHash: objects.RelatedHash(kcpSecret("aA=="))}}},
		{name: "created in kcp meanwhile", after: kcpSecret("aA=="), complete: true, upserts: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			primary := thing("1", map[string]any{"secretName": "creds"}, nil)
			res := thingsResource()
			res.Related = refs
			objs := []*unstructured.Unstructured{primary}
			if tc.before != nil {
				objs = append(objs, tc.before)
			}
			e := newEnv(t, res, objs...)
			m, intents := e.m, e.intents
			edgeApplied(t, m, primary)
			drain(t, m)
			if tc.unanswered {
				if in := intents.Next(); in == nil || in.GetRelatedTo() == nil {
					t.Fatalf("first stream: %v, want the related intent", in)
				}
			} else if _, up, del := sentIntents(intents); up+del != 1 {
				t.Fatalf("first stream: %d related intents, want 1", up+del)
			}

			// The stream ends; kcp changes meanwhile (or not), seen by the
			// related watch.
			m.Detach()
			switch {
			case tc.after != nil && !reflect.DeepEqual(tc.before, tc.after):
				e.relatedChanged(secretsGVR, tc.after)
			case tc.after == nil && tc.before != nil:
				e.relatedGone(secretsGVR, tc.before)
			}
			m.Attach()
			m.Inventory(&ferryv1.Inventory{PublishedResource: "pr", Complete: true, RelatedComplete: tc.complete, RelatedEntries: tc.related,
				Entries: []*ferryv1.InventoryEntry{{Key: thingKey(), PublishedResource: "pr", AppliedHash: hashOf(t, primary)}}})
			drain(t, m)
			primaries, upserts, deletes := sentIntents(intents)
			if primaries != 0 || upserts != tc.upserts || deletes != tc.deletes {
				t.Fatalf("after the reconnect: %d primaries, %d related upserts, %d related deletes sent; want 0, %d, %d",
					primaries, upserts, deletes, tc.upserts, tc.deletes)
			}
		})
	}
}

// TestRelatedSentTransitions walks relatedSent through sequences of
// events: what is sent, what the edge's inventory says it holds, and the
// edge asking again.
func TestRelatedSentTransitions(t *testing.T) {
	it := item{pr: "pr", key: "c|ns/a", related: "creds"}
	stateA, stateB := relatedState("c", "ns", "creds", "u-s", "ha"), relatedState("c", "ns", "creds", "u-s", "hb")
	holds := func(hash, primaryUID string) []*ferryv1.RelatedInventoryEntry {
		return []*ferryv1.RelatedInventoryEntry{{RelatedTo: &ferryv1.RelatedTo{Primary: &ferryv1.ObjectKey{Cluster: "c", Namespace: "ns", Name: "a", Uid: primaryUID},
			Identifier: "creds"}, Key: &ferryv1.ObjectKey{Cluster: "c", Namespace: "ns", Name: "creds", Uid: "u-s"}, AppliedHash: hash}}
	}
	type step struct {
		do         func(r *relatedSent)
		state      string // next(it, "u-a", state) when do is nil
		send, drop bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{name: "sent once per state", steps: []step{{state: stateA, send: true}, {state: stateA}, {state: stateB, send: true}, {state: relatedDeleted, send: true}, {state: relatedDeleted}}},
		{name: "a new stream sends again without an inventory", steps: []step{{state: stateA, send: true}, {do: (*relatedSent).streamAttached}, {state: stateA, send: true}}},
		{name: "the inventory holds it: nothing sent, a stale intent dropped", steps: []step{
			{do: func(r *relatedSent) { r.inventoried("pr", holds("ha", "u-a"), true) }}, {state: stateA, drop: true}, {state: stateA}, {state: stateB, send: true}}},
		{name: "the inventory holds another state", steps: []step{
			{do: func(r *relatedSent) { r.inventoried("pr", holds("ha", "u-a"), true) }}, {state: stateB, send: true}}},
		{name: "the inventory holds an older primary's copy", steps: []step{
			{do: func(r *relatedSent) { r.inventoried("pr", holds("ha", "u-old"), true) }}, {state: stateA, send: true}}},
		{name: "the inventory holds an edited copy", steps: []step{
			{do: func(r *relatedSent) { r.inventoried("pr", holds("", "u-a"), true) }}, {state: stateA, send: true}}},
		{name: "a complete inventory without it: no delete", steps: []step{
			{do: func(r *relatedSent) { r.inventoried("pr", nil, true) }}, {state: relatedDeleted, drop: true}}},
		{name: "an inventory without related entries tells nothing", steps: []step{
			{do: func(r *relatedSent) { r.inventoried("pr", nil, false) }}, {state: relatedDeleted, send: true}}},
		{name: "asked again: sent although the edge held it", steps: []step{
			{do: func(r *relatedSent) { r.inventoried("pr", holds("ha", "u-a"), true) }}, {do: func(r *relatedSent) { r.again(it) }}, {state: stateA, send: true}}},
		{name: "an inventory on a running stream replaces what was sent", steps: []step{
			{state: stateA, send: true}, {do: func(r *relatedSent) { r.inventoried("pr", holds("hb", "u-a"), true) }}, {state: stateA, send: true}}},
		{name: "forgotten with its resource", steps: []step{
			{do: func(r *relatedSent) { r.inventoried("pr", holds("ha", "u-a"), true) }}, {do: func(r *relatedSent) { r.forgetResource("pr") }}, {state: stateA, send: true}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRelatedSent()
			for i, s := range tc.steps {
				if s.do != nil {
					s.do(r)
					continue
				}
				if send, drop := r.next(it, "u-a", s.state); send != s.send || drop != s.drop {
					t.Fatalf("step %d (%s): send %v drop %v, want %v %v", i, s.state, send, drop, s.send, s.drop)
				}
			}
		})
	}
}

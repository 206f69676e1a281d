package replication

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/objects"
)

func thing(rv string, spec, status map[string]any) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "g/v1", "kind": "Thing",
		"metadata": map[string]any{
			"name": "a", "namespace": "ns", "uid": "u-a", "resourceVersion": rv,
			"annotations": map[string]any{"kcp.io/cluster": "c"},
			"finalizers":  []any{"ferry.dev/nora"},
		},
		"spec": spec,
	}}
	if status != nil {
		u.Object["status"] = status
	}
	return u
}

func hashOf(t *testing.T, u *unstructured.Unstructured) string {
	data, err := json.Marshal(objects.DesiredState(u).Object)
	if err != nil {
		t.Fatal(err)
	}
	return ContentHash(&ferryv1.UpsertIntent{Object: data})
}

// edgeApplied tells m that the edge applied obj's desired state (its ack).
func edgeApplied(t *testing.T, m *Manager, obj *unstructured.Unstructured) {
	t.Helper()
	m.Applied("pr", &ferryv1.SyncIntent{Key: objectKey(obj, thingsGVR), PublishedResource: "pr",
		Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{ContentHash: hashOf(t, obj)}}})
}

// TestProcessSendsOnlyChangedDesiredState is the status ping-pong: a status
// write in kcp changes the object's resourceVersion but not its desired
// state, and must not send the object to the edge again.
func TestProcessSendsOnlyChangedDesiredState(t *testing.T) {
	spec := map[string]any{"size": int64(1)}
	applied := thing("10", spec, nil)
	cases := []struct {
		name     string
		current  *unstructured.Unstructured
		wantSent bool
	}{
		{"unchanged", thing("10", spec, nil), false},
		{"status written in kcp (new resourceVersion)", thing("11", spec, map[string]any{"ready": true}), false},
		{"kcp-internal annotation changed", func() *unstructured.Unstructured {
			u := thing("12", spec, nil)
			u.SetAnnotations(map[string]string{"kcp.io/cluster": "c", "internal.apis.kcp.io/x": "y"})
			return u
		}(), false},
		{"spec changed", thing("13", map[string]any{"size": int64(2)}, nil), true},
		{"label changed", func() *unstructured.Unstructured {
			u := thing("14", spec, nil)
			u.SetLabels(map[string]string{"team": "a"})
			return u
		}(), true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, intents := testManager(t, tc.current) // listed: queued
			edgeApplied(t, m, applied)
			drain(t, m)
			in := intents.Next()
			if sent := in != nil; sent != tc.wantSent {
				t.Fatalf("intent sent = %v, want %v (%v)", sent, tc.wantSent, in)
			}
			if in != nil && in.GetUpsert().GetContentHash() != hashOf(t, tc.current) {
				t.Fatal("intent does not carry the hash of its desired state")
			}
		})
	}
}

// TestProcessQueuesAStateOnce: repeated events for the same state (e.g.
// the broker's own finalizer patch) queue one intent, not one per event.
func TestProcessQueuesAStateOnce(t *testing.T) {
	e := newEnv(t, thingsResource(), thing("10", map[string]any{"size": int64(1)}, nil))
	m, intents := e.m, e.intents
	drain(t, m)
	for _, rv := range []string{"11", "12"} {
		e.changed(thing(rv, map[string]any{"size": int64(1)}, nil))
		drain(t, m)
	}
	first := intents.Next()
	if first == nil {
		t.Fatal("no intent")
	}
	intents.Done(first.GetKey(), nil, first.GetVersion())
	if in := intents.Next(); in != nil {
		t.Fatalf("the same state was queued twice: %v", in)
	}
}

// TestInventoryReplacesAppliedHashes: after a reconnect the edge's
// inventory is the truth; an object the edge no longer has is sent again.
func TestInventoryReplacesAppliedHashes(t *testing.T) {
	obj := thing("10", map[string]any{"size": int64(1)}, nil)
	m, intents := testManager(t, obj)
	edgeApplied(t, m, obj)
	m.Inventory(&ferryv1.Inventory{PublishedResource: "pr", Complete: true}) // the copy is gone locally
	drain(t, m)
	if intents.Next() == nil {
		t.Fatal("an object missing from the inventory was not sent")
	}

	m2, intents2 := testManager(t, obj)
	key := thingKey()
	m2.Inventory(&ferryv1.Inventory{PublishedResource: "pr", Complete: true,
		Entries: []*ferryv1.InventoryEntry{{Key: key, AppliedHash: hashOf(t, obj)}}})
	drain(t, m2)
	if in := intents2.Next(); in != nil {
		t.Fatalf("an object the inventory shows applied was sent again: %v", in)
	}
}

// TestResendSendsAnAppliedStateAgain: the edge's copy drifted and it does
// not hold the desired state; the broker sends it although its hash says
// the edge applied it, once.
func TestResendSendsAnAppliedStateAgain(t *testing.T) {
	obj := thing("10", map[string]any{"size": int64(1)}, nil)
	e := newEnv(t, thingsResource(), obj)
	m, intents := e.m, e.intents
	edgeApplied(t, m, obj)
	drain(t, m)
	if in := intents.Next(); in != nil {
		t.Fatalf("an applied state was sent: %v", in)
	}
	m.Resend("pr", thingKey())
	drain(t, m)
	in := intents.Next()
	if in == nil || in.GetUpsert().GetContentHash() != hashOf(t, obj) {
		t.Fatalf("want the desired state sent again, got %v", in)
	}
	intents.Done(in.GetKey(), nil, in.GetVersion())
	e.changed(thing("11", map[string]any{"size": int64(1)}, map[string]any{"ready": true})) // a status write
	drain(t, m)
	if again := intents.Next(); again != nil {
		t.Fatalf("the state was sent twice: %v", again)
	}
}

// TestWriteStatusOnACacheMiss: after a broker restart the edge re-sends
// its reports while the watches are still catching up; a report for an
// object the cache does not hold yet is retried (not listed yet), not
// dropped as if the object were gone. Once the watch has listed, the cache
// holds every object the edge can know of, so a miss (or another UID) is
// final, and kcp is not read to tell (issue 18, build 7: before, every
// miss cost a GET).
func TestWriteStatusOnACacheMiss(t *testing.T) {
	key := &ferryv1.ObjectKey{Cluster: "c", Resource: &ferryv1.GroupVersionResource{Group: "g", Version: "v1", Resource: "things"},
		Namespace: "ns", Name: "a", Uid: "u-a"}
	inKCP := thing("10", map[string]any{"size": int64(1)}, nil)
	replaced := thing("11", nil, nil)
	replaced.SetUID("u-other")
	for _, tc := range []struct {
		name  string
		inKCP *unstructured.Unstructured // nil: none
		// listed: the watch has listed (else its list hangs).
		listed bool
		gone   bool
	}{
		{name: "in kcp, the watch has not listed yet (retried)", inKCP: inKCP},
		{name: "listed, not in kcp: gone", listed: true, gone: true},
		{name: "listed, replaced by another object of the same name", listed: true, gone: true, inKCP: replaced},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var objs []*unstructured.Unstructured
			if tc.inKCP != nil {
				objs = append(objs, tc.inKCP)
			}
			k := newFakeKCP(objs...)
			if !tc.listed {
				k.holdLists(t, thingsGVR)
			}
			res := thingsResource()
			res.HasStatus = true
			e := startEnv(t, k, res)
			if tc.listed {
				e.waitListed()
			}
			written, err := e.m.WriteStatus(context.Background(), "pr", key, []byte(`{"ready":true}`))
			if written || err == nil || errors.Is(err, ErrGone) != tc.gone {
				t.Fatalf("written %v, err %v; want gone %v", written, err, tc.gone)
			}
			if got := k.reqs.take(); len(got) != 0 {
				t.Fatalf("kcp requests %v, want none", got)
			}
		})
	}
}

// TestObjectGoneWithoutConfirmedDeletion: an object that leaves kcp while
// the edge may hold its copy gets a delete intent, even though the edge
// never confirmed a deletion. kcp can delete an object whose finalizer was
// added concurrently with the delete (kubernetes/kubernetes#77988); before,
// such a copy was left behind for good.
func TestObjectGoneWithoutConfirmedDeletion(t *testing.T) {
	key := thingKey()
	obj := thing("10", map[string]any{"size": int64(1)}, nil)
	cases := []struct {
		name string
		// before runs with the object in kcp and in the cache (queued by
		// the initial list); the object then vanishes from kcp (a watch
		// delete) and is processed.
		before     func(t *testing.T, e *env)
		wantDelete bool
	}{
		{"upsert sent, the object vanished (finalizer lost in kcp)", func(t *testing.T, e *env) {
			drain(t, e.m)
			in := e.intents.Next()
			if in.GetUpsert() == nil {
				t.Fatalf("want an upsert first, got %v", in)
			}
			e.intents.Done(in.GetKey(), nil, in.GetVersion())
		}, true},
		{"the edge's inventory lists a copy of an object deleted while the broker was away", func(t *testing.T, e *env) {
			e.m.Inventory(&ferryv1.Inventory{PublishedResource: "pr", Complete: true,
				Entries: []*ferryv1.InventoryEntry{{Key: key, AppliedHash: "h"}}})
		}, true},
		{"deletion confirmed and released", func(t *testing.T, e *env) {
			drain(t, e.m)
			in := e.intents.Next()
			e.intents.Done(in.GetKey(), nil, in.GetVersion())
			e.gone(obj)
			if err := e.m.Release(context.Background(), "pr", key); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"never sent (no finalizer yet)", func(t *testing.T, e *env) {}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, thingsResource(), obj)
			tc.before(t, e)
			if v, _ := e.m.Lookup("pr", "c", "ns", "a"); v.Cached {
				e.gone(obj)
			}
			drain(t, e.m)
			in := e.intents.Next()
			if got := in.GetDelete() != nil; got != tc.wantDelete {
				t.Fatalf("delete intent = %v, want %v (next intent %v)", got, tc.wantDelete, in)
			}
			if tc.wantDelete && in.GetKey().GetUid() != "u-a" {
				t.Errorf("delete intent for %v, want uid u-a", in.GetKey())
			}
		})
	}
}

// TestInventoryBeforeListIsComparedOnceListed: a restarted broker gets the
// edge's inventory before it has listed kcp. The inventory is compared once
// the cache is listed, so unchanged objects are not sent again (before,
// every object was: 1,000 intents after a broker restart at 10 x 100).
func TestInventoryBeforeListIsComparedOnceListed(t *testing.T) {
	obj := thing("10", map[string]any{"size": int64(1)}, nil)
	k := newFakeKCP(obj)
	release := k.holdLists(t, thingsGVR) // the watch lists after the edge's inventory
	e := startEnv(t, k, thingsResource(), func(o *Options) { o.InventoryGate = time.Hour })
	m, intents := e.m, e.intents
	m.Attach()
	m.Inventory(&ferryv1.Inventory{PublishedResource: "pr", Complete: true,
		Entries: []*ferryv1.InventoryEntry{{Key: thingKey(), AppliedHash: hashOf(t, obj)}}})
	if !awaitingInventory(m) {
		t.Fatal("the gate opened before the cache was listed")
	}
	release()
	e.waitListed()
	if awaitingInventory(m) {
		t.Fatal("the gate did not open once the cache was listed")
	}
	drain(t, m)
	if in := intents.Next(); in != nil {
		t.Fatalf("an unchanged object was sent again: %v", in)
	}
}

// awaitingInventory tells whether pr's intents are held for the edge's
// inventory.
func awaitingInventory(m *Manager) bool {
	for _, s := range m.ResourceStats() {
		if s.PublishedResource == "pr" {
			return s.AwaitingInventory
		}
	}
	return false
}

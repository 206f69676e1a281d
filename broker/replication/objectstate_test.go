package replication

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// named is thing() called name (uid "u-<name>").
func named(name string, spec map[string]any) *unstructured.Unstructured {
	u := thing("1", spec, nil)
	u.SetName(name)
	u.SetUID(types.UID("u-" + name))
	return u
}

func keyOf(name, uid string) *ferryv1.ObjectKey {
	return &ferryv1.ObjectKey{Cluster: "c", Resource: &ferryv1.GroupVersionResource{Group: "g", Version: "v1", Resource: "things"},
		Namespace: "ns", Name: name, Uid: uid}
}

func TestLookup(t *testing.T) {
	spec := map[string]any{"size": int64(1)}
	deleting := named("deleting", spec)
	deleting.SetDeletionTimestamp(&metav1.Time{Time: time.Unix(1, 0)})
	unfinalized := named("fresh", spec)
	unfinalized.SetFinalizers(nil)
	outOfScope := named("blue", spec)
	outOfScope.SetLabels(map[string]string{"team": "red"})
	synced := named("synced", spec)

	selector, err := labels.Parse("team!=red")
	if err != nil {
		t.Fatal(err)
	}
	res := thingsResource()
	res.Selector = selector
	m := newEnv(t, res, synced, deleting, unfinalized, outOfScope).m
	edgeApplied(t, m, synced)
	m.Rejected("pr", keyOf("fresh", "u-fresh"), "")
	// The edge's inventory (a first chunk) lists a copy of a gone object
	// and one of an older object named like synced.
	m.Inventory(&ferryv1.Inventory{PublishedResource: "pr", Entries: []*ferryv1.InventoryEntry{
		{Key: keyOf("gone", "u-gone")}, {Key: keyOf("synced", "u-older")},
	}})

	cases := []struct {
		name    string
		pr, obj string
		want    ObjectView
		wantOK  bool
		hasHash bool
	}{
		{name: "synced object", pr: "pr", obj: "synced", wantOK: true, hasHash: true,
			want: ObjectView{Cached: true, Finalizer: true, InScope: true, AppliedHash: hashOf(t, synced), ResourceVersion: "1"}},
		{name: "being deleted: no desired state", pr: "pr", obj: "deleting", wantOK: true,
			want: ObjectView{Cached: true, Finalizer: true, InScope: true, ResourceVersion: "1"}},
		{name: "no finalizer yet (sent without waiting for it), refused before", pr: "pr", obj: "fresh", wantOK: true, hasHash: true,
			want: ObjectView{Cached: true, InScope: true, Held: true, ResourceVersion: "1"}},
		{name: "out of the filters", pr: "pr", obj: "blue", wantOK: true,
			want: ObjectView{Cached: true, Finalizer: true, ResourceVersion: "1"}},
		{name: "gone from kcp, copy at the edge", pr: "pr", obj: "gone", wantOK: true,
			want: ObjectView{}},
		{name: "unknown object", pr: "pr", obj: "nope"},
		{name: "unknown published resource", pr: "other", obj: "synced"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, ok := m.Lookup(tc.pr, "c", "ns", tc.obj)
			if ok != tc.wantOK {
				t.Fatalf("found = %v, want %v", ok, tc.wantOK)
			}
			if !ok {
				return
			}
			if v.Key.GetName() != tc.obj || v.PublishedResource != "pr" || v.GVR.Resource != "things" {
				t.Errorf("key %v, resource %v", v.Key, v.ResourceRef)
			}
			if (v.DesiredHash != "") != tc.hasHash {
				t.Errorf("desired hash %q, want one: %v", v.DesiredHash, tc.hasHash)
			}
			if tc.hasHash && v.DesiredHash != hashOf(t, map[string]*unstructured.Unstructured{"synced": synced, "fresh": unfinalized}[tc.obj]) {
				t.Errorf("desired hash %q is not the hash process sends", v.DesiredHash)
			}
			got := ObjectView{Cached: v.Cached, Finalizer: v.Finalizer, InScope: v.InScope, Held: v.Held, AppliedHash: v.AppliedHash,
				ResourceVersion: v.ResourceVersion}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
	if v, _ := m.Lookup("pr", "c", "ns", "deleting"); v.DeletionTimestamp == nil {
		t.Error("deletion timestamp missing")
	}
}

func TestMatchResourcesAndStats(t *testing.T) {
	e := startEnv(t, newFakeKCP(named("a", nil), named("b", nil)), thingsResource(), func(o *Options) { o.InventoryGate = time.Hour })
	e.waitListed()
	m := e.m
	edgeApplied(t, m, named("a", nil))
	for _, tc := range []struct {
		group, resource string
		want            int
	}{
		{"", "things", 1}, {"g", "things", 1}, {"other", "things", 0}, {"", "widgets", 0},
	} {
		if got := len(m.MatchResources(tc.group, tc.resource)); got != tc.want {
			t.Errorf("MatchResources(%q, %q) = %d, want %d", tc.group, tc.resource, got, tc.want)
		}
	}
	m.Attach() // the edge's inventory is awaited
	stats := m.ResourceStats()
	if len(stats) != 1 {
		t.Fatalf("stats %v", stats)
	}
	if s := stats[0]; s.Objects != 2 || s.Applied != 1 || !s.Listed || !s.AwaitingInventory || s.PublishedResource != "pr" {
		t.Errorf("stats %+v", s)
	}
}

func TestIntentsLookup(t *testing.T) {
	o := NewIntents(7, 10, nil)
	key := keyOf("a", "u-a")
	o.Put(&ferryv1.SyncIntent{Key: key, PublishedResource: "pr", Version: &ferryv1.ObjectVersion{ResourceVersion: "1"}})
	if p, f := o.Lookup(key); p == nil || f != nil || p.Seq != 1 || p.Queued.IsZero() {
		t.Fatalf("after put: pending %+v in flight %+v", p, f)
	}
	sent := o.Next()
	o.Put(&ferryv1.SyncIntent{Key: key, PublishedResource: "pr", Version: &ferryv1.ObjectVersion{ResourceVersion: "2"}})
	p, f := o.Lookup(key)
	if p == nil || f == nil || f.Seq != sent.GetVersion().GetSequence() || p.Intent.GetVersion().GetResourceVersion() != "2" {
		t.Fatalf("held newer intent: pending %+v in flight %+v", p, f)
	}
	if o.Epoch() != 7 {
		t.Errorf("epoch %d", o.Epoch())
	}
}

// drainWorkers processes the queue the way the workers do (processNext).
func drainWorkers(t *testing.T, m *Manager) {
	t.Helper()
	for rounds := 0; m.queue.Len() > 0; rounds++ {
		if rounds > 20 {
			t.Fatal("the queue does not drain")
		}
		m.processNext(context.Background())
	}
}

func TestResync(t *testing.T) {
	spec := map[string]any{"size": int64(1)}
	held, lost := named("held", spec), named("lost", spec)
	cases := []struct {
		name string
		// inventory is what the edge reports (nil: nothing arrives).
		inventory   []*ferryv1.InventoryEntry
		detach      bool
		wantErr     error
		wantEntries int
		wantQueued  int
	}{
		{name: "lost copy and a copy of a gone object are sent", wantQueued: 2, wantEntries: 2,
			inventory: []*ferryv1.InventoryEntry{
				{Key: keyOf("held", "u-held"), AppliedHash: hashOf(t, held)},
				{Key: keyOf("gone", "u-gone"), AppliedHash: "x"},
			}},
		{name: "the edge holds everything", wantQueued: 0, wantEntries: 2,
			inventory: []*ferryv1.InventoryEntry{
				{Key: keyOf("held", "u-held"), AppliedHash: hashOf(t, held)},
				{Key: keyOf("lost", "u-lost"), AppliedHash: hashOf(t, lost)},
			}},
		{name: "a copy in an older state is sent", wantQueued: 1, wantEntries: 2,
			inventory: []*ferryv1.InventoryEntry{
				{Key: keyOf("held", "u-held"), AppliedHash: hashOf(t, held)},
				{Key: keyOf("lost", "u-lost"), AppliedHash: "old"},
			}},
		{name: "the stream ends first", detach: true, wantErr: ErrResyncAborted},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m, intents := testManager(t, held, lost)
			m.Attach()
			// What the broker believed before: the edge holds both.
			edgeApplied(t, m, held)
			edgeApplied(t, m, lost)
			drain(t, m) // listed: queued; nothing is sent

			done := make(chan ResyncStatus, 1)
			r, started, err := m.StartResync(nil, func(st ResyncStatus) { done <- st })
			if err != nil || !started {
				t.Fatalf("start: %v, started %v", err, started)
			}
			if again, started, _ := m.StartResync([]string{"pr"}, nil); again != r || started {
				t.Fatal("a second resync does not join the running one")
			}
			if !awaitingInventory(m) {
				t.Fatal("the resource's intents are not held for the inventory")
			}
			if tc.detach {
				m.Detach()
			} else {
				m.Inventory(&ferryv1.Inventory{PublishedResource: "pr", Entries: tc.inventory[:1]})
				m.Inventory(&ferryv1.Inventory{PublishedResource: "pr", Entries: tc.inventory[1:], Complete: true})
				drainWorkers(t, m)
			}
			var st ResyncStatus
			select {
			case st = <-done:
			case <-time.After(5 * time.Second):
				t.Fatalf("the resync did not complete: %+v", m.ResyncStatus(r))
			}
			if !errors.Is(st.Err, tc.wantErr) {
				t.Fatalf("error %v, want %v", st.Err, tc.wantErr)
			}
			if tc.wantErr != nil {
				if !st.Completed.IsZero() {
					t.Error("a failed resync has a completion time")
				}
				return
			}
			if st.Completed.IsZero() || st.InventoryEntries != tc.wantEntries || st.QueuedIntents != tc.wantQueued {
				t.Errorf("status %+v, want %d entries and %d queued intents", st, tc.wantEntries, tc.wantQueued)
			}
			n := 0
			for intents.Next() != nil {
				n++
			}
			if n != tc.wantQueued {
				t.Errorf("%d intents in the outbox, want %d", n, tc.wantQueued)
			}
			if last, ok := m.LastResync(); !ok || last.Completed.IsZero() {
				t.Errorf("last resync %+v", last)
			}
		})
	}
}

func TestResyncRefusals(t *testing.T) {
	m, _ := testManager(t)
	if _, _, err := m.StartResync(nil, nil); err == nil {
		t.Error("a resync without a stream started")
	}
	m.Attach()
	if _, _, err := m.StartResync([]string{"pr", "nope"}, nil); !errors.Is(err, ErrUnknownResource) {
		t.Errorf("unknown resource: %v", err)
	}
	empty := NewManager(Options{EdgeName: "nora", Outbox: NewIntents(1, 1, nil)})
	empty.Attach()
	if _, _, err := empty.StartResync(nil, nil); err == nil {
		t.Error("a resync of an edge without resources started")
	}
}

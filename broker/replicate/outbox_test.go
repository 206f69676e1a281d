package replicate

import (
	"fmt"
	"testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

func key(name string) *ferryv1.ObjectKey {
	return &ferryv1.ObjectKey{Cluster: "c", Resource: &ferryv1.GroupVersionResource{Group: "g", Version: "v1", Resource: "things"}, Namespace: "ns", Name: name, Uid: "u-" + name}
}

func upsert(name string, seq uint64, rv string) *ferryv1.SyncIntent {
	return &ferryv1.SyncIntent{Key: key(name), Version: &ferryv1.ObjectVersion{BrokerEpoch: 1, Sequence: seq, ResourceVersion: rv},
		Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{Object: []byte(`{"rv":"` + rv + `"}`)}}}
}

func del(name string, seq uint64) *ferryv1.SyncIntent {
	return &ferryv1.SyncIntent{Key: key(name), Version: &ferryv1.ObjectVersion{BrokerEpoch: 1, Sequence: seq},
		Operation: &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{}}}
}

func TestOutboxCoalescingAndWindow(t *testing.T) {
	wakes := 0
	o := NewOutbox(2, func() { wakes++ })

	o.Put(upsert("a", 1, "10"))
	o.Put(upsert("b", 2, "20"))
	o.Put(upsert("a", 3, "11")) // latest wins, keeps a's place
	o.Put(upsert("c", 4, "30"))
	if p, f := o.Len(); p != 3 || f != 0 {
		t.Fatalf("pending %d inflight %d, want 3 0", p, f)
	}
	first, second := o.Next(), o.Next()
	if first.GetVersion().GetSequence() != 3 || second.GetKey().GetName() != "b" {
		t.Fatalf("order: got %v then %v", first.GetVersion(), second.GetKey())
	}
	if o.Next() != nil {
		t.Fatal("window of 2 exceeded")
	}
	// A stale result is ignored and keeps the window full.
	if o.Done(key("a"), nil, &ferryv1.ObjectVersion{BrokerEpoch: 1, Sequence: 1}) != nil {
		t.Fatal("a result for an older intent was accepted")
	}
	if o.Next() != nil {
		t.Fatal("window opened by a stale result")
	}
	if o.Done(key("a"), nil, first.GetVersion()) == nil {
		t.Fatal("the matching result was not accepted")
	}
	if n := o.Next(); n.GetKey().GetName() != "c" {
		t.Fatalf("after an ack the next intent is c, got %v", n.GetKey())
	}
	if wakes == 0 {
		t.Error("wake never called")
	}
}

func TestOutboxDeleteSupersedes(t *testing.T) {
	o := NewOutbox(10, func() {})
	o.Put(upsert("a", 1, "10"))
	o.Put(del("a", 2))
	o.Put(upsert("a", 3, "12")) // a deleting object cannot come back
	n := o.Next()
	if n.GetDelete() == nil || o.Next() != nil {
		t.Fatalf("want exactly the delete, got %v", n)
	}
	o.Put(upsert("a", 4, "13")) // still deleting (in flight)
	if o.Next() != nil {
		t.Fatal("an upsert overtook an in-flight delete")
	}
}

func TestOutboxSkipsUnchangedResend(t *testing.T) {
	o := NewOutbox(10, func() {})
	o.Put(upsert("a", 1, "10"))
	o.Next()
	o.Put(upsert("a", 2, "10")) // same content (informer resync)
	if o.Next() != nil {
		t.Fatal("unchanged content queued again while in flight")
	}
	o.Forget(key("a"))
	if p, f := o.Len(); p != 0 || f != 0 {
		t.Fatalf("Forget left %d pending %d inflight", p, f)
	}
}

// BenchmarkOutboxCycle measures one object's trip through the outbox: an
// update arrives, is sent and acknowledged.
func BenchmarkOutboxCycle(b *testing.B) {
	o := NewOutbox(256, func() {})
	intents := make([]*ferryv1.SyncIntent, 1024)
	for i := range intents {
		intents[i] = upsert(fmt.Sprintf("obj-%d", i), uint64(i+1), "1")
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		in := intents[i%len(intents)]
		o.Put(in)
		n := o.Next()
		o.Done(n.GetKey(), nil, n.GetVersion())
	}
}

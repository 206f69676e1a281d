package replication

import (
	"testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

func key(name string) *ferryv1.ObjectKey {
	return &ferryv1.ObjectKey{Cluster: "c", Resource: &ferryv1.GroupVersionResource{Group: "g", Version: "v1", Resource: "things"}, Namespace: "ns", Name: name, Uid: "u-" + name}
}

func upsert(name, hash string) *ferryv1.SyncIntent {
	return &ferryv1.SyncIntent{Key: key(name), Version: &ferryv1.ObjectVersion{ResourceVersion: "rv"},
		Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{Object: []byte(`{}`), ContentHash: hash}}}
}

func del(name string) *ferryv1.SyncIntent {
	return &ferryv1.SyncIntent{Key: key(name), Operation: &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{}}}
}

// TestIntentsCreateDeleteRace is the quick create → delete: the delete must
// not reach the edge while the upsert it follows is unanswered.
func TestIntentsCreateDeleteRace(t *testing.T) {
	o := NewIntents(7, 10, nil)
	o.Put(upsert("a", "h1"))
	up := o.Next()
	if up.GetUpsert() == nil || up.GetVersion().GetBrokerEpoch() != 7 {
		t.Fatalf("first intent %v", up)
	}
	o.Put(del("a"))
	if in := o.Next(); in != nil {
		t.Fatalf("delete sent while the upsert is in flight: %v", in)
	}
	if o.Done(key("a"), nil, up.GetVersion()) == nil {
		t.Fatal("answer to the upsert not matched")
	}
	d := o.Next()
	if d.GetDelete() == nil {
		t.Fatalf("want the delete after the upsert's answer, got %v", d)
	}
	if o.Done(key("a"), nil, up.GetVersion()) != nil {
		t.Fatal("a second answer to the upsert matched the delete")
	}
}

func TestIntentsOtherEpochIsStale(t *testing.T) {
	o := NewIntents(7, 10, nil)
	o.Put(upsert("a", "h1"))
	in := o.Next()
	if o.Done(key("a"), nil, &ferryv1.ObjectVersion{BrokerEpoch: 8, Sequence: in.GetVersion().GetSequence()}) != nil {
		t.Fatal("answer of another epoch matched")
	}
}

func TestIntentsRelatedSlots(t *testing.T) {
	o := NewIntents(1, 10, nil)
	rel := func(name string, del bool) *ferryv1.SyncIntent {
		in := &ferryv1.SyncIntent{
			Key:       &ferryv1.ObjectKey{Cluster: "c", Resource: &ferryv1.GroupVersionResource{Version: "v1", Resource: "secrets"}, Namespace: "ns", Name: name},
			RelatedTo: &ferryv1.RelatedTo{Primary: key("p"), Identifier: "creds"},
		}
		if del {
			in.Operation = &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{}}
		} else {
			in.Operation = &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{Object: []byte(`{}`)}}
		}
		return in
	}
	// One slot per primary and entry, whatever object it points at.
	o.Put(rel("old", true))
	o.Put(rel("new", false))
	in := o.Next()
	if in.GetKey().GetName() != "new" || in.GetUpsert() == nil || o.Next() != nil {
		t.Fatalf("want only the latest related intent, got %v", in)
	}
	// Primary and related intents of one object are separate slots.
	o.Put(upsert("p", "h"))
	if o.Next() == nil {
		t.Fatal("primary intent held behind a related one")
	}
}

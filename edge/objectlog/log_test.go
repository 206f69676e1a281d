package objectlog

import (
	"testing"
	"time"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

func testKey(name string) *ferryv1.ObjectKey {
	return &ferryv1.ObjectKey{Cluster: "c1", Resource: &ferryv1.GroupVersionResource{Group: "kcp.example", Version: "v1", Resource: "things"},
		Namespace: "team", Name: name, Uid: "u-" + name}
}

// TestLog: the log keeps the last intent handled per object (related
// intents only count), times it with its clock, and forgets an object once
// a delete of it succeeded.
func TestLog(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	l := New(func() time.Time { return at })
	upsert := func(name, hash string) *ferryv1.SyncIntent {
		return &ferryv1.SyncIntent{Key: testKey(name), Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{ContentHash: hash, WorkspacePath: "root:team"}}}
	}
	del := &ferryv1.SyncIntent{Key: testKey("a"), Operation: &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{}}}
	failed := &ferryv1.IntentResult{Error: &ferryv1.ApplyError{Message: "no"}}

	l.IntentDone(upsert("a", "h1"), &ferryv1.IntentResult{})
	l.IntentDone(upsert("b", "h2"), failed)
	related := upsert("c", "h3")
	related.RelatedTo = &ferryv1.RelatedTo{Primary: testKey("a"), Identifier: "secret"}
	l.IntentDone(related, &ferryv1.IntentResult{})
	if h, ok := l.last(keyID(testKey("a"))); !ok || h.hash != "h1" || !h.at.Equal(at) || h.err != nil {
		t.Errorf("a: %+v %v", h, ok)
	}
	if h, ok := l.lastByPath("root:team", "kcp.example", "things", "team", "b"); !ok || h.err.GetMessage() != "no" {
		t.Errorf("b by workspace path: %+v %v", h, ok)
	}
	if _, ok := l.last(keyID(testKey("c"))); ok {
		t.Error("a related intent was kept")
	}
	l.IntentDone(del, failed)
	if h, ok := l.last(keyID(testKey("a"))); !ok || h.upsert {
		t.Errorf("a failed delete: %+v %v", h, ok)
	}
	l.IntentDone(del, &ferryv1.IntentResult{})
	if _, ok := l.last(keyID(testKey("a"))); ok {
		t.Error("a deleted object is kept")
	}
	if applied, failedN := l.Counts(); applied != 3 || failedN != 2 {
		t.Errorf("counts: %d applied, %d failed", applied, failedN)
	}
}

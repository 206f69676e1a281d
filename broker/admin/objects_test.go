package admin

import (
	"fmt"
	"strings"
	"testing"
	"time"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/replication"
	"github.com/ferry-dev/ferry/pkg/protocol"
)

func testKey(uid string) *ferryv1.ObjectKey {
	return &ferryv1.ObjectKey{Cluster: "c", Resource: &ferryv1.GroupVersionResource{Group: "g", Version: "v1", Resource: "things"},
		Namespace: "ns", Name: "a", Uid: uid}
}

func upsert(hash, rv string) *ferryv1.SyncIntent {
	return &ferryv1.SyncIntent{Key: testKey("u1"), PublishedResource: "pr", Version: &ferryv1.ObjectVersion{ResourceVersion: rv},
		Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{ContentHash: hash}}}
}

func TestObjectRecords(t *testing.T) {
	version := &ferryv1.ObjectVersion{BrokerEpoch: 1, Sequence: 4, ResourceVersion: "10"}
	ack := &ferryv1.IntentResult{Key: testKey("u1"), Version: version, LocalNamespace: "local", LocalName: "a-copy"}
	rejected := &ferryv1.ApplyError{Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_REJECTED, Message: "denied by policy"}
	nack := &ferryv1.IntentResult{Key: testKey("u1"), Version: version, Error: rejected}
	del := &ferryv1.SyncIntent{Key: testKey("u1"), PublishedResource: "pr", Operation: &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{}}}
	refusal := &ferryv1.ReportResult{Error: &ferryv1.ApplyError{Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_INVALID, Message: "refused"}}

	type check struct {
		found                 bool
		errSource, errMessage string
		appliedHash, source   string
		local                 string
	}
	cases := []struct {
		name  string
		steps func(r *Objects)
		want  check
	}{
		{"ack records the applied state and the copy", func(r *Objects) { r.IntentAnswered(upsert("h1", "10"), ack, time.Time{}) },
			check{found: true, appliedHash: "h1", source: appliedFromAck, local: "local/a-copy"}},
		{"a nack is the last error, the copy stays", func(r *Objects) {
			r.IntentAnswered(upsert("h1", "10"), ack, time.Time{})
			r.IntentAnswered(upsert("h2", "11"), nack, time.Time{})
		}, check{found: true, errSource: errorSourceIntent, errMessage: "denied by policy", appliedHash: "h1", source: appliedFromAck, local: "local/a-copy"}},
		{"an ack clears the error", func(r *Objects) {
			r.IntentAnswered(upsert("h2", "11"), nack, time.Time{})
			r.IntentAnswered(upsert("h3", "12"), ack, time.Time{})
		}, check{found: true, appliedHash: "h3", source: appliedFromAck, local: "local/a-copy"}},
		{"a deleted copy is no copy", func(r *Objects) {
			r.IntentAnswered(upsert("h1", "10"), ack, time.Time{})
			r.IntentAnswered(del, &ferryv1.IntentResult{Key: testKey("u1")}, time.Time{})
		}, check{found: true}},
		{"inventory", func(r *Objects) {
			r.InventoryReceived(&ferryv1.Inventory{PublishedResource: "pr", Entries: []*ferryv1.InventoryEntry{
				{Key: testKey("u1"), AppliedHash: "h9", AppliedResourceVersion: "9", LocalName: "copy"},
				{AppliedHash: "no key: ignored"},
			}})
		}, check{found: true, appliedHash: "h9", source: appliedFromInventory, local: "copy"}},
		{"a refused report is the last error until a report succeeds", func(r *Objects) {
			r.ReportAnswered(protocol.ReportKindStatus, testKey("u1"), refusal)
		}, check{found: true, errSource: errorSourceReport, errMessage: "refused"}},
		{"a successful report clears a report error", func(r *Objects) {
			r.ReportAnswered(protocol.ReportKindStatus, testKey("u1"), refusal)
			r.ReportAnswered(protocol.ReportKindStatus, testKey("u1"), &ferryv1.ReportResult{})
		}, check{found: true}},
		{"a successful report keeps an intent error", func(r *Objects) {
			r.IntentAnswered(upsert("h2", "11"), nack, time.Time{})
			r.ReportAnswered(protocol.ReportKindStatus, testKey("u1"), &ferryv1.ReportResult{})
		}, check{found: true, errSource: errorSourceIntent, errMessage: "denied by policy"}},
		{"a confirmed deletion forgets the object", func(r *Objects) {
			r.IntentAnswered(upsert("h1", "10"), ack, time.Time{})
			r.ReportAnswered(protocol.ReportKindDeletion, testKey("u1"), &ferryv1.ReportResult{})
		}, check{}},
		{"too large", func(r *Objects) {
			r.IntentTooLarge(upsert("h1", "10"), &ferryv1.ApplyError{Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_TOO_LARGE, Message: "big"})
		}, check{found: true, errSource: errorSourceTooLarge, errMessage: "big"}},
		{"related intents are not recorded", func(r *Objects) {
			in := upsert("h1", "10")
			in.RelatedTo = &ferryv1.RelatedTo{Primary: testKey("u1"), Identifier: "secret"}
			r.IntentAnswered(in, ack, time.Time{})
		}, check{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := NewObjects(nil, nil)
			tc.steps(r)
			rec, found := r.get(testKey("u1"))
			local := ""
			if rec.local != nil {
				local = nsName(rec.local.GetNamespace(), rec.local.GetName())
			}
			got := check{found: found, errSource: rec.lastErr.GetSource(), errMessage: rec.lastErr.GetError().GetMessage(),
				appliedHash: rec.applied.GetContentHash(), source: rec.applied.GetSource(), local: local}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			if _, other := r.get(testKey("u2")); other {
				t.Error("a record for another UID")
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	rejected := &ferryv1.ObjectError{Source: errorSourceIntent, Error: &ferryv1.ApplyError{
		Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_REJECTED, Message: "denied by policy"}}
	live := replication.ObjectView{Cached: true, Finalizer: true, InScope: true, DesiredHash: "h"}
	cases := []struct {
		name string
		v    replication.ObjectView
		s    *ferryv1.GetObjectStateResponse
		want []string
	}{
		{"synced", live, &ferryv1.GetObjectStateResponse{EdgeConnected: true,
			Applied: &ferryv1.AppliedState{ContentHash: "h", Current: true}, LocalCopy: &ferryv1.LocalCopy{Namespace: "l", Name: "a"}},
			[]string{"synced", "l/a"}},
		{"refused for good", live, &ferryv1.GetObjectStateResponse{EdgeConnected: true, LastError: rejected,
			Intent: &ferryv1.IntentState{Phase: ferryv1.IntentPhase_INTENT_PHASE_NACKED, Held: true}},
			[]string{"rejected", "denied by policy", "final"}},
		{"in flight while disconnected", live, &ferryv1.GetObjectStateResponse{
			Intent: &ferryv1.IntentState{Phase: ferryv1.IntentPhase_INTENT_PHASE_IN_FLIGHT, Operation: "upsert", Version: &ferryv1.ObjectVersion{Sequence: 3}}},
			[]string{"not connected", "upsert intent 3 sent"}},
		{"no finalizer", replication.ObjectView{Cached: true, InScope: true}, &ferryv1.GetObjectStateResponse{EdgeConnected: true},
			[]string{"finalizer"}},
		{"gone", replication.ObjectView{}, &ferryv1.GetObjectStateResponse{EdgeConnected: true},
			[]string{"gone from kcp"}},
		{"waiting for the inventory", live, &ferryv1.GetObjectStateResponse{EdgeConnected: true,
			Intent: &ferryv1.IntentState{Phase: ferryv1.IntentPhase_INTENT_PHASE_NONE, AwaitingInventory: true}},
			[]string{"inventory"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := summarize(tc.v, tc.s)
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("summary %q lacks %q", got, w)
				}
			}
		})
	}
}

// TestObjectsHoldOnlyKnownObjects: a report the broker refuses makes an
// admin record only for an object the broker syncs; keys an edge makes up
// would otherwise grow the records without bound (nothing removes them).
func TestObjectsHoldOnlyKnownObjects(t *testing.T) {
	r := NewObjects(func(k *ferryv1.ObjectKey) bool { return k.GetUid() == "u1" }, nil)
	r.InventoryReceived(&ferryv1.Inventory{PublishedResource: "pr", Complete: true,
		Entries: []*ferryv1.InventoryEntry{{Key: testKey("u1"), AppliedHash: "h1"}}})
	refusal := &ferryv1.ReportResult{Error: &ferryv1.ApplyError{Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_INVALID, Message: "refused"}}
	for i := range 1000 {
		r.ReportAnswered(protocol.ReportKindStatus, testKey(fmt.Sprintf("other-%d", i)), refusal)
	}
	if n := r.Len(); n != 1 {
		t.Fatalf("%d records, want 1 (the known object)", n)
	}
	if rec, ok := r.get(testKey("u1")); !ok || rec.applied.GetContentHash() != "h1" {
		t.Fatalf("the known object's record: %v %v", ok, rec.applied)
	}
}

// TestObjectsClock: the records' times come from the clock they were
// made with.
func TestObjectsClock(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	r := NewObjects(nil, func() time.Time { return at })
	r.IntentAnswered(upsert("h1", "10"), &ferryv1.IntentResult{Key: testKey("u1"), LocalName: "a"}, time.Time{})
	rec, _ := r.get(testKey("u1"))
	if !rec.answeredAt.Equal(at) || !rec.applied.GetReportedAt().AsTime().Equal(at) || !rec.local.GetReportedAt().AsTime().Equal(at) {
		t.Errorf("answered %v applied %v local %v, want %v", rec.answeredAt, rec.applied.GetReportedAt().AsTime(), rec.local.GetReportedAt().AsTime(), at)
	}
	r.ReportAnswered(protocol.ReportKindStatus, testKey("u1"), &ferryv1.ReportResult{Error: &ferryv1.ApplyError{Message: "no"}})
	if rec, _ := r.get(testKey("u1")); !rec.lastErr.GetAt().AsTime().Equal(at) {
		t.Errorf("error at %v, want %v", rec.lastErr.GetAt().AsTime(), at)
	}
}

package engine

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/replication"
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
		steps func(r *objectRecords)
		want  check
	}{
		{"ack records the applied state and the copy", func(r *objectRecords) { r.answered(upsert("h1", "10"), ack) },
			check{found: true, appliedHash: "h1", source: appliedFromAck, local: "local/a-copy"}},
		{"a nack is the last error, the copy stays", func(r *objectRecords) {
			r.answered(upsert("h1", "10"), ack)
			r.answered(upsert("h2", "11"), nack)
		}, check{found: true, errSource: errorSourceIntent, errMessage: "denied by policy", appliedHash: "h1", source: appliedFromAck, local: "local/a-copy"}},
		{"an ack clears the error", func(r *objectRecords) {
			r.answered(upsert("h2", "11"), nack)
			r.answered(upsert("h3", "12"), ack)
		}, check{found: true, appliedHash: "h3", source: appliedFromAck, local: "local/a-copy"}},
		{"a deleted copy is no copy", func(r *objectRecords) {
			r.answered(upsert("h1", "10"), ack)
			r.answered(del, &ferryv1.IntentResult{Key: testKey("u1")})
		}, check{found: true}},
		{"inventory", func(r *objectRecords) {
			r.inventory(&ferryv1.Inventory{PublishedResource: "pr", Entries: []*ferryv1.InventoryEntry{
				{Key: testKey("u1"), AppliedHash: "h9", AppliedResourceVersion: "9", LocalName: "copy"},
				{AppliedHash: "no key: ignored"},
			}})
		}, check{found: true, appliedHash: "h9", source: appliedFromInventory, local: "copy"}},
		{"a refused report is the last error until a report succeeds", func(r *objectRecords) {
			r.reported(testKey("u1"), false, refusal)
		}, check{found: true, errSource: errorSourceReport, errMessage: "refused"}},
		{"a successful report clears a report error", func(r *objectRecords) {
			r.reported(testKey("u1"), false, refusal)
			r.reported(testKey("u1"), false, &ferryv1.ReportResult{})
		}, check{found: true}},
		{"a successful report keeps an intent error", func(r *objectRecords) {
			r.answered(upsert("h2", "11"), nack)
			r.reported(testKey("u1"), false, &ferryv1.ReportResult{})
		}, check{found: true, errSource: errorSourceIntent, errMessage: "denied by policy"}},
		{"a confirmed deletion forgets the object", func(r *objectRecords) {
			r.answered(upsert("h1", "10"), ack)
			r.reported(testKey("u1"), true, &ferryv1.ReportResult{})
		}, check{}},
		{"too large", func(r *objectRecords) {
			r.failed(testKey("u1"), errorSourceTooLarge, &ferryv1.ApplyError{Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_TOO_LARGE, Message: "big"})
		}, check{found: true, errSource: errorSourceTooLarge, errMessage: "big"}},
		{"related intents are not recorded", func(r *objectRecords) {
			in := upsert("h1", "10")
			in.RelatedTo = &ferryv1.RelatedTo{Primary: testKey("u1"), Identifier: "secret"}
			r.answered(in, ack)
		}, check{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var r objectRecords
			tc.steps(&r)
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

// recordingSink keeps what the engine sends on the control lane.
type recordingSink struct {
	mu   sync.Mutex
	msgs []*ferryv1.ConnectResponse
}

func (s *recordingSink) Control(m *ferryv1.ConnectResponse) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.msgs = append(s.msgs, m)
	return nil
}

func (s *recordingSink) inventoryRequests() []*ferryv1.InventoryRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*ferryv1.InventoryRequest
	for _, m := range s.msgs {
		if r := m.GetInventoryRequest(); r != nil {
			out = append(out, r)
		}
	}
	return out
}

var testGVR = schema.GroupVersionResource{Group: "g", Version: "v1", Resource: "things"}

func testEngine(t *testing.T) *Engine {
	t.Helper()
	return testEngineWith(t, nil)
}

// testEngineWith is testEngine with reports written by writer (nil: the
// engine's manager).
func testEngineWith(t *testing.T, writer reportWriter) *Engine {
	t.Helper()
	e := newEngine(Options{Export: config.APIExportRef{Workspace: "root:org", Name: "g"}, EdgeName: "nora", KCP: &rest.Config{},
		Epoch: 1, Window: 8, Log: logr.Discard()}, writer)
	e.mgr.Ensure(replication.Resource{PublishedResource: "pr", GVR: testGVR})
	return e
}

func TestEngineObjectStateOfACopy(t *testing.T) {
	e := testEngine(t)
	if _, ok := e.ObjectState("pr", "c", "ns", "a"); ok {
		t.Fatal("an unknown object was found")
	}
	detach := e.Attach(&recordingSink{})
	defer detach()
	// The edge's inventory lists a copy of an object the broker has not
	// listed (its cache is empty): the object is known through the copy.
	if err := e.Handle(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_Inventory{Inventory: &ferryv1.Inventory{
		PublishedResource: "pr", Complete: true,
		Entries: []*ferryv1.InventoryEntry{{Key: testKey("u1"), AppliedHash: "h1", AppliedResourceVersion: "7", LocalNamespace: "local", LocalName: "a-x"}},
	}}}); err != nil {
		t.Fatal(err)
	}
	got, ok := e.ObjectState("pr", "c", "ns", "a")
	switch {
	case !ok:
		t.Fatal("the object is not found")
	case got.GetKey().GetUid() != "u1" || got.GetKcp() != nil || !got.GetEdgeConnected():
		t.Errorf("key %v kcp %v connected %v", got.GetKey(), got.GetKcp(), got.GetEdgeConnected())
	case got.GetApplied().GetContentHash() != "h1" || got.GetApplied().GetSource() != appliedFromInventory || got.GetApplied().GetResourceVersion() != "7":
		t.Errorf("applied %v", got.GetApplied())
	case got.GetLocalCopy().GetNamespace() != "local" || got.GetLocalCopy().GetName() != "a-x":
		t.Errorf("local copy %v", got.GetLocalCopy())
	case got.GetIntent().GetPhase() != ferryv1.IntentPhase_INTENT_PHASE_NONE:
		t.Errorf("intent %v", got.GetIntent())
	case got.GetExport().GetName() != "g" || got.GetPublishedResource() != "pr":
		t.Errorf("export %v pr %q", got.GetExport(), got.GetPublishedResource())
	}
}

func TestEngineResync(t *testing.T) {
	e := testEngine(t)
	ctx := context.Background()
	if _, err := e.Resync(ctx, "s0", nil, 0); !errors.Is(err, ErrNotAttached) {
		t.Fatalf("without a stream: %v", err)
	}
	sink := &recordingSink{}
	detach := e.Attach(sink)
	if _, err := e.Resync(ctx, "s1", []string{"nope"}, 0); !errors.Is(err, replication.ErrUnknownResource) {
		t.Fatalf("unknown resource: %v", err)
	}
	st, err := e.Resync(ctx, "s1", []string{"pr"}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if st.GetSessionId() != "s1" || st.GetCompletedAt() != nil || st.GetRequestedAt() == nil || len(st.GetPublishedResources()) != 1 {
		t.Errorf("status %v", st)
	}
	// A second call joins the running resync: no second request.
	if _, err := e.Resync(ctx, "s1", nil, 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	if reqs := sink.inventoryRequests(); len(reqs) != 1 || reqs[0].GetPublishedResources()[0] != "pr" {
		t.Fatalf("inventory requests %v", reqs)
	}
	status := e.Status()
	if status.GetLastResync().GetSessionId() != "s1" || len(status.GetResources()) != 1 || !status.GetResources()[0].GetAwaitingInventory() {
		t.Errorf("engine status %v", status)
	}
	detach()
	if st := e.Status().GetLastResync(); st.GetError() == "" || st.GetCompletedAt() != nil {
		t.Errorf("a resync whose stream ended: %v", st)
	}
}

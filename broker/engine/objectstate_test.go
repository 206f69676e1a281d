package engine

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/admin"
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

// TestEngineObjectStateOfACopy: the admin records learn the edge's
// inventory as the engine's Observer, and the object view reads the
// engine's state and the records.
func TestEngineObjectStateOfACopy(t *testing.T) {
	objects := admin.NewObjects(nil, nil)
	e := newEngine(Options{Export: config.APIExportRef{Workspace: "root:org", Name: "g"}, EdgeName: "nora", KCP: &rest.Config{},
		Epoch: 1, Window: 8, Log: logr.Discard(), Observer: objects}, nil)
	e.mgr.Ensure(replication.Resource{PublishedResource: "pr", GVR: testGVR})
	if _, ok := objects.ObjectState(e, "pr", "c", "ns", "a"); ok {
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
	got, ok := objects.ObjectState(e, "pr", "c", "ns", "a")
	switch {
	case !ok:
		t.Fatal("the object is not found")
	case got.GetKey().GetUid() != "u1" || got.GetKcp() != nil || !got.GetEdgeConnected():
		t.Errorf("key %v kcp %v connected %v", got.GetKey(), got.GetKcp(), got.GetEdgeConnected())
	case got.GetApplied().GetContentHash() != "h1" || got.GetApplied().GetSource() != "inventory" || got.GetApplied().GetResourceVersion() != "7":
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

package engine

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/admin"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/pkg/metrics"
)

// The admin records and the metrics are the engine's Observers.
var (
	_ Observer = (*admin.Objects)(nil)
	_ Observer = (*metrics.Export)(nil)
)

// recordingObserver notes the engine's transitions, in order.
type recordingObserver struct {
	mu     sync.Mutex
	events []string
}

func (o *recordingObserver) note(format string, args ...any) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.events = append(o.events, fmt.Sprintf(format, args...))
}

func (o *recordingObserver) got() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.events)
}

func (o *recordingObserver) Attached() { o.note("attached") }
func (o *recordingObserver) IntentSent(in *ferryv1.SyncIntent) {
	o.note("sent %s", in.GetUpsert().GetContentHash())
}
func (o *recordingObserver) IntentAnswered(in *ferryv1.SyncIntent, res *ferryv1.IntentResult, _ time.Time) {
	o.note("answered %s error=%q", in.GetUpsert().GetContentHash(), res.GetError().GetMessage())
}
func (o *recordingObserver) IntentTooLarge(in *ferryv1.SyncIntent, failure *ferryv1.ApplyError) {
	o.note("too large %s %s", in.GetUpsert().GetContentHash(), failure.GetReason())
}
func (o *recordingObserver) InventoryReceived(inv *ferryv1.Inventory) {
	o.note("inventory %s %d", inv.GetPublishedResource(), len(inv.GetEntries()))
}
func (o *recordingObserver) ReportReceived(kind string) { o.note("report %s", kind) }
func (o *recordingObserver) ReportAnswered(kind string, key *ferryv1.ObjectKey, res *ferryv1.ReportResult) {
	o.note("report answered %s %s error=%q", kind, key.GetUid(), res.GetError().GetMessage())
}
func (o *recordingObserver) Resynced(time.Time, int) { o.note("resynced") }
func (o *recordingObserver) ResyncObject(bool)       { o.note("resync object") }

// TestEngineObserver: the engine tells its Observers (every one of them)
// its transitions: an attach, intents sent, answered (a stale answer is
// not), refused for size, and the edge's inventory.
func TestEngineObserver(t *testing.T) {
	first, second := &recordingObserver{}, &recordingObserver{}
	e := newEngine(Options{Export: config.APIExportRef{Workspace: "root:org", Name: "g"}, EdgeName: "nora", KCP: &rest.Config{},
		Epoch: 1, Window: 8, Log: logr.Discard(), Observer: Observers(first, nil, second)}, nil)
	detach := e.Attach(&recordingSink{})
	defer detach()
	e.intents.Put(upsert("h1", "5"))
	m, ok := e.NextIntent()
	if !ok {
		t.Fatal("no intent to send")
	}
	in := m.GetIntent()
	answer := func(seq uint64) {
		if err := e.Handle(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_IntentResult{IntentResult: &ferryv1.IntentResult{
			Key: in.GetKey(), Version: &ferryv1.ObjectVersion{BrokerEpoch: 1, Sequence: seq},
		}}}); err != nil {
			t.Fatal(err)
		}
	}
	answer(in.GetVersion().GetSequence())
	answer(in.GetVersion().GetSequence()) // stale: answered already
	e.TooLarge(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Intent{Intent: upsert("h2", "6")}}, 10, 5)
	if err := e.Handle(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_Inventory{Inventory: &ferryv1.Inventory{
		PublishedResource: "pr", Entries: []*ferryv1.InventoryEntry{{Key: testKey("u1")}},
	}}}); err != nil {
		t.Fatal(err)
	}
	want := []string{"attached", "sent h1", `answered h1 error=""`, "too large h2 APPLY_ERROR_REASON_TOO_LARGE", "inventory pr 1"}
	for _, o := range []*recordingObserver{first, second} {
		if got := o.got(); !slices.Equal(got, want) {
			t.Errorf("events %q, want %q", got, want)
		}
	}
}

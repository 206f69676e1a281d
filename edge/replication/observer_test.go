package replication

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/edge/objectlog"
	"github.com/ferry-dev/ferry/pkg/metrics"
)

// The admin API's records and the metrics are the engine's Observers.
var (
	_ Observer = (*objectlog.Log)(nil)
	_ Observer = (*metrics.Edge)(nil)
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

func (o *recordingObserver) IntentReceived(in *ferryv1.SyncIntent) {
	o.note("received %d", in.GetVersion().GetSequence())
}
func (o *recordingObserver) IntentDone(in *ferryv1.SyncIntent, res *ferryv1.IntentResult) {
	o.note("done %d error=%q", in.GetVersion().GetSequence(), res.GetError().GetMessage())
}
func (o *recordingObserver) ReportQueued(*ferryv1.ConnectRequest) { o.note("report queued") }
func (o *recordingObserver) ReportAnswered(*ferryv1.ReportResult, time.Time) {
	o.note("report answered")
}

// TestEngineObserver: the engine tells its Observers (every one of them)
// the intents it receives and answers; the admin log learns from it what
// the object view shows.
func TestEngineObserver(t *testing.T) {
	key, _ := remoteThing()
	log, rec := objectlog.New(nil), &recordingObserver{}
	e, _, _ := testEngineWith(t, engineSetup{observer: Observers(log, nil, rec)})
	acceptApplies(e)
	e.Handle(upsertOf(key, 3, "h1", thingA))
	runQueue(t, e)
	rec.mu.Lock()
	got := slices.Clone(rec.events)
	rec.mu.Unlock()
	if want := []string{"received 3", `done 3 error=""`}; !slices.Equal(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
	st, err := log.ObjectState(e, &ferryv1.EdgeAdminServiceGetObjectStateRequest{Workspace: "c1", Resource: "things", Namespace: "team", Name: "a"})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetLastIntent().GetVersion().GetSequence() != 3 || st.GetLastIntent().GetContentHash() != "h1" || st.GetLastError() != nil {
		t.Errorf("last intent %v, error %v", st.GetLastIntent(), st.GetLastError())
	}
	if applied, failed := log.Counts(); applied != 1 || failed != 0 {
		t.Errorf("counts: %d applied, %d failed", applied, failed)
	}
}

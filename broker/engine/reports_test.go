package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/workqueue"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/replication"
)

// TestPermanent: kcp errors retrying cannot fix are answered once with a
// final error; the others are retried.
func TestPermanent(t *testing.T) {
	gr := schema.GroupResource{Group: "g", Resource: "things"}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{apierrors.NewNotFound(gr, "a"), true},
		{apierrors.NewInvalid(schema.GroupKind{Group: "g", Kind: "Thing"}, "a", nil), true},
		{apierrors.NewForbidden(gr, "a", errors.New("no")), true},
		{apierrors.NewConflict(gr, "a", errors.New("precondition failed")), false},
		{fmt.Errorf("wrapped: %w", replication.ErrGone), true},
		{fmt.Errorf("wrapped: %w", replication.ErrNotDeleting), true},
		{apierrors.NewServiceUnavailable("kcp is down"), false},
		{apierrors.NewTooManyRequests("slow down", 1), false},
		{apierrors.NewTimeoutError("timeout", 1), false},
		{errors.New("connection refused"), false},
	} {
		if got := Permanent(tc.err); got != tc.want {
			t.Errorf("Permanent(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestSupersededReportIsAnsweredAtOnce: only the latest report per object
// and kind is applied; the older one is answered at once so the edge's
// outbox frees its slot, and each report is answered once.
func TestSupersededReportIsAnsweredAtOnce(t *testing.T) {
	var answers []*ferryv1.ReportResult
	w := newReportWorker(reportWorkerOptions{send: func(_ uint64, m *ferryv1.ConnectResponse) { answers = append(answers, m.GetReportResult()) }, log: logr.Discard()})
	key := &ferryv1.ObjectKey{Cluster: "c", Namespace: "ns", Name: "a", Uid: "u"}
	w.add(reportTask{id: 1, key: key, status: &ferryv1.StatusReport{ReportId: 1}})
	w.add(reportTask{id: 2, key: key, status: &ferryv1.StatusReport{ReportId: 2}})
	w.add(reportTask{id: 2, key: key, status: &ferryv1.StatusReport{ReportId: 2}}) // re-sent after a reconnect
	w.add(reportTask{id: 3, key: key, deletion: true})                             // another kind: not superseding
	if len(answers) != 1 || answers[0].GetReportId() != 1 || answers[0].GetError() != nil {
		t.Fatalf("want report 1 answered (no error) and nothing else, got %v", answers)
	}
	if n := w.queue.Len(); n != 2 {
		t.Fatalf("want 2 keys queued (status, deletion), got %d", n)
	}
}

// fakeWriter is a kcp writer for reports: WriteStatus fails with
// UNAVAILABLE while fail says so, and records the statuses it wrote.
type fakeWriter struct {
	mu sync.Mutex
	// fail tells whether a status write for name fails (kcp down).
	fail func(name string) bool
	// before runs at the start of every status write.
	before  func()
	written []string // the statuses written
}

func (f *fakeWriter) PublishedResourceFor(*ferryv1.ObjectKey) (string, bool) { return "pr", true }

func (f *fakeWriter) WriteStatus(_ context.Context, _ string, key *ferryv1.ObjectKey, status []byte) (bool, error) {
	if f.before != nil {
		f.before()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil && f.fail(key.GetName()) {
		return false, apierrors.NewServiceUnavailable("kcp is down")
	}
	f.written = append(f.written, string(status))
	return true, nil
}

func (f *fakeWriter) RecordStatusFailure(context.Context, string, *ferryv1.ObjectKey, *ferryv1.ApplyError) error {
	return nil
}

func (f *fakeWriter) RecordFailure(context.Context, string, *ferryv1.ObjectKey, *ferryv1.ApplyError, bool) error {
	return nil
}

func (f *fakeWriter) Release(context.Context, string, *ferryv1.ObjectKey) error { return nil }

func (f *fakeWriter) Resend(string, *ferryv1.ObjectKey) {}

func (f *fakeWriter) ResendRelated(string, *ferryv1.RelatedTo) {}

func (f *fakeWriter) WriteRelated(context.Context, string, *ferryv1.RelatedObjectReport) error {
	return nil
}

func (f *fakeWriter) writtenStatuses() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.written)
}

// recordingLimiter records the delays the report worker's own rate limiter
// asks for and hands the queue hold instead (0: at once; long: the item
// waits until something else re-queues it).
type recordingLimiter struct {
	workqueue.TypedRateLimiter[string]
	hold time.Duration

	mu     sync.Mutex
	delays []time.Duration
}

func (l *recordingLimiter) When(k string) time.Duration {
	d := l.TypedRateLimiter.When(k)
	l.mu.Lock()
	l.delays = append(l.delays, d)
	l.mu.Unlock()
	return l.hold
}

// answerLog collects the worker's answers.
type answerLog struct {
	mu      sync.Mutex
	answers []*ferryv1.ReportResult
}

func (a *answerLog) send(_ uint64, m *ferryv1.ConnectResponse) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.answers = append(a.answers, m.GetReportResult())
}

func (a *answerLog) ids() []uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	var ids []uint64
	for _, r := range a.answers {
		if r.GetError() != nil {
			ids = append(ids, 1000+r.GetReportId()) // visible in failures
			continue
		}
		ids = append(ids, r.GetReportId())
	}
	return ids
}

func statusTask(id uint64, name, status string) reportTask {
	key := &ferryv1.ObjectKey{Cluster: "c", Namespace: "ns", Name: name, Uid: "u-" + name}
	return reportTask{id: id, key: key, status: &ferryv1.StatusReport{ReportId: id, Key: key, Status: []byte(status)}}
}

// processReady applies one report that is ready now; it fails the test
// instead of waiting when none is.
func processReady(t *testing.T, w *reportWorker) {
	t.Helper()
	if w.queue.Len() == 0 {
		t.Fatal("no report is ready to be applied")
	}
	w.processNext(t.Context())
}

func testWorker(writer reportWriter, answers *answerLog, hold time.Duration) (*reportWorker, *recordingLimiter) {
	rl := &recordingLimiter{TypedRateLimiter: reportRateLimiter(), hold: hold}
	return newReportWorker(reportWorkerOptions{writer: writer, send: answers.send, log: logr.Discard(), limiter: rl}), rl
}

// TestReportRetriesBackOffAFewSecondsAtMost: a report retried through a
// long kcp outage waits a few seconds at most between attempts (issue 18,
// item 7: the controller default backed off to 1,000 s), and is answered
// once, when it is written.
func TestReportRetriesBackOffAFewSecondsAtMost(t *testing.T) {
	const failures = 40
	attempts := 0
	writer := &fakeWriter{fail: func(string) bool { attempts++; return attempts <= failures }}
	var answers answerLog
	w, rl := testWorker(writer, &answers, 0)
	w.add(statusTask(1, "a", `{"phase":"Ready"}`))
	for range failures + 1 {
		processReady(t, w)
	}
	if got := answers.ids(); !slices.Equal(got, []uint64{1}) {
		t.Fatalf("want report 1 answered once without error, got %v", got)
	}
	if len(rl.delays) != failures {
		t.Fatalf("want %d retries, got %d", failures, len(rl.delays))
	}
	if longest := slices.Max(rl.delays); longest > maxReportBackoff {
		t.Fatalf("a retry waited %s; reports must be retried within %s", longest, maxReportBackoff)
	}
	if w.queue.NumRequeues(reportKey(statusTask(1, "a", ""))) != 0 {
		t.Fatal("the written report's backoff was not forgotten")
	}
}

// TestReportRetriesRestartWhenKCPAnswers: reports waiting for a retry after
// kcp failures are retried at once as soon as a kcp write succeeds again,
// not when their backoff ends.
func TestReportRetriesRestartWhenKCPAnswers(t *testing.T) {
	down := true
	writer := &fakeWriter{fail: func(name string) bool { return down && name == "a" }}
	var answers answerLog
	w, _ := testWorker(writer, &answers, time.Hour) // retries wait "forever" unless restarted
	w.add(statusTask(1, "a", "a1"))
	processReady(t, w) // fails: waits
	if w.queue.Len() != 0 {
		t.Fatal("a failed report was retried at once")
	}
	down = false
	w.add(statusTask(2, "b", "b1"))
	processReady(t, w) // written: kcp answers again
	processReady(t, w) // report 1, retried at once
	if got := writer.writtenStatuses(); !slices.Equal(got, []string{"b1", "a1"}) {
		t.Fatalf("want b1 then a1 written, got %v", got)
	}
	if got := answers.ids(); !slices.Equal(got, []uint64{2, 1}) {
		t.Fatalf("want reports 2 and 1 answered, got %v", got)
	}
}

// TestNewerReportReplacesTheRetriedOne: a newer report for an object whose
// older report waits for a retry replaces it: the older one is answered at
// once (superseded), the newer one is applied at once, not after the older
// one's backoff.
func TestNewerReportReplacesTheRetriedOne(t *testing.T) {
	down := true
	writer := &fakeWriter{fail: func(string) bool { return down }}
	var answers answerLog
	w, _ := testWorker(writer, &answers, time.Hour)
	w.add(statusTask(1, "a", "old"))
	processReady(t, w) // fails: waits
	down = false
	w.add(statusTask(2, "a", "new"))
	if got := answers.ids(); !slices.Equal(got, []uint64{1}) {
		t.Fatalf("want the superseded report 1 answered at once, got %v", got)
	}
	processReady(t, w)
	if got := writer.writtenStatuses(); !slices.Equal(got, []string{"new"}) {
		t.Fatalf("want only the newer status written, got %v", got)
	}
	if got := answers.ids(); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("want reports 1 and 2 answered once each, got %v", got)
	}
}

// TestReportSupersededWhileBeingAppliedIsAnswered: a newer report arriving
// while the older one is being written, which then fails, replaces it; the
// older one is still answered (every report is answered once).
func TestReportSupersededWhileBeingAppliedIsAnswered(t *testing.T) {
	var w *reportWorker
	calls := 0
	writer := &fakeWriter{fail: func(string) bool { return calls == 1 }}
	writer.before = func() {
		calls++
		if calls == 1 {
			w.add(statusTask(2, "a", "new")) // arrives during the write of report 1
		}
	}
	var answers answerLog
	w, _ = testWorker(writer, &answers, time.Hour)
	w.add(statusTask(1, "a", "old"))
	processReady(t, w) // report 1 fails while report 2 arrives
	processReady(t, w) // report 2, at once
	if got := writer.writtenStatuses(); !slices.Equal(got, []string{"new"}) {
		t.Fatalf("want the newer status written, got %v", got)
	}
	if got := answers.ids(); !slices.Equal(got, []uint64{1, 2}) {
		t.Fatalf("want reports 1 and 2 answered once each, got %v", got)
	}
}

// TestReportAnsweredOnlyOnItsStream: a report received on one stream and
// applied after the edge reconnected is not answered on the new stream: the
// new stream's report ids start again and the answer would ack another
// report (issue 18, item 6).
func TestReportAnsweredOnlyOnItsStream(t *testing.T) {
	writer := &fakeWriter{}
	e := testEngineWith(t, writer)
	old := &recordingSink{}
	detach := e.Attach(old)
	status := &ferryv1.StatusReport{ReportId: 1, Key: testKey("u1"), Status: []byte(`{}`)}
	if err := e.Handle(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_StatusReport{StatusReport: status}}); err != nil {
		t.Fatal(err)
	}
	detach()
	current := &recordingSink{}
	defer e.Attach(current)()
	processReady(t, e.reports)
	if got := writer.writtenStatuses(); len(got) != 1 {
		t.Fatalf("want the status written, got %v", got)
	}
	for _, m := range current.msgs {
		if r := m.GetReportResult(); r != nil {
			t.Fatalf("report %d of the old stream answered on the new one", r.GetReportId())
		}
	}
}

// TestReportAnswersCarryTheReportsEpoch: answers echo the epoch of the
// edge outbox that sent the report (ids are unique within an epoch only),
// also when a report is superseded by one of the same id from another
// epoch.
func TestReportAnswersCarryTheReportsEpoch(t *testing.T) {
	writer := &fakeWriter{}
	var answers answerLog
	w, _ := testWorker(writer, &answers, 0)
	earlier, current := statusTask(1, "a", "old"), statusTask(1, "a", "new")
	earlier.epoch, current.epoch = 7, 8
	w.add(earlier)
	w.add(current)
	processReady(t, w)
	answers.mu.Lock()
	defer answers.mu.Unlock()
	var got [][2]uint64
	for _, a := range answers.answers {
		got = append(got, [2]uint64{a.GetReportEpoch(), a.GetReportId()})
	}
	if want := [][2]uint64{{7, 1}, {8, 1}}; !slices.Equal(got, want) {
		t.Fatalf("want answers (epoch, id) %v, got %v", want, got)
	}
}

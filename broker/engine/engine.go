// Package engine is the broker's long-lived sync engine for one APIExport.
// It owns everything that must outlive an edge's stream: the virtual
// workspace watches and caches (replication.Manager), the outbox of intents,
// the writers of reports into kcp and the publishing of PublishedResources.
//
// A stream attaches to the engine and detaches from it. On attach,
// unanswered intents are queued again and every resource waits for the
// edge's inventory, which is compared with the caches in memory; a reconnect
// costs no list in kcp, no re-publish of an unchanged schema and no write of
// an unchanged status.
//
// The engine's invariants:
//   - at most one stream is attached (the server's registry guarantees it);
//   - every intent is answered or re-sent on the next stream;
//   - every report is answered once it is written, found unnecessary or
//     failed for good; transient kcp failures are retried here, not by the
//     edge.
package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferry-dev/ferry/pkg/logging"
	"github.com/ferry-dev/ferry/pkg/protocol"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/kcp"
	"github.com/ferry-dev/ferry/broker/replication"
	"github.com/ferry-dev/ferry/pkg/link"
	"github.com/ferry-dev/ferry/pkg/metrics"
)

// VirtualWorkspaceWatcher reports an APIExport's virtual workspace URLs
// (every endpoint, one per kcp shard; sorted, without duplicates) on every
// change until ctx ends (blocking). Implemented by *kcp.Resolver.
type VirtualWorkspaceWatcher interface {
	WatchVirtualWorkspace(ctx context.Context, ref config.APIExportRef, onChange func(kcp.VirtualWorkspace))
}

// Sink is the attached stream's control lane (link.Loop.Control): it never
// blocks and fails only when the stream is overrun.
type Sink interface {
	Control(*ferryv1.ConnectResponse) error
}

// Options configure an Engine. All fields but Observer are required.
type Options struct {
	// Export is the APIExport the engine serves.
	Export config.APIExportRef
	// LogicalCluster is the export's workspace's logical cluster name.
	LogicalCluster string
	// EdgeName is the edge's name in the broker's configuration; the
	// finalizer is "ferry.dev/<name>".
	EdgeName string
	// AllowRelated tells whether the edge may name a resource in
	// spec.related[] (the broker's configuration); nil allows the defaults.
	AllowRelated func(schema.GroupResource) bool
	// KCP is the broker's kcp rest config.
	KCP *rest.Config
	// Publisher applies Publish messages to kcp.
	Publisher PublishApplier
	// Watcher follows the export's virtual workspace URL.
	Watcher VirtualWorkspaceWatcher
	// Epoch is the broker epoch stamped on intent versions.
	Epoch uint64
	// Window is how many intents may await the edge's answer.
	Window int
	// InventoryGate bounds the wait for the edge's inventory after attach.
	InventoryGate time.Duration
	// Log receives logs.
	Log logr.Logger
	// Observer learns the engine's transitions (the admin API's records,
	// metrics: see Observers); nil observes nothing.
	Observer Observer
}

// Engine is one APIExport's sync engine. Create with New, then Run.
type Engine struct {
	opts      Options
	intents   *replication.Intents
	mgr       *replication.Manager
	reports   *reportWorker
	publisher *publishWorker
	bulkReady <-chan struct{}
	started   time.Time
	// observer is Options.Observer; never nil.
	observer Observer

	attachments atomic.Uint64
	nacks       nackCounter

	mu   sync.Mutex
	sink Sink
	// attached numbers sink's attachment (the count of attachments then).
	attached uint64
	vwURLs   []string
	// vwKnown tells whether the watch reported the URLs at least once.
	vwKnown bool
	// vwExists tells whether the export's endpoint slice exists (so the
	// export does), as last reported.
	vwExists bool

	// resyncSession is the admin session the last resync was asked on.
	resyncSession string
}

// New returns an engine; nothing runs before Run.
func New(o Options) *Engine { return newEngine(o, nil) }

// newEngine is New with the writer of the edge's reports into kcp; nil is
// the engine's replication manager (tests pass a fake).
func newEngine(o Options, reports reportWriter) *Engine {
	wake, ready := link.NewWake()
	e := &Engine{opts: o, bulkReady: ready, started: time.Now(), observer: Observers(o.Observer)}
	e.intents = replication.NewIntents(o.Epoch, o.Window, wake)
	e.mgr = replication.NewManager(replication.Options{
		KCP: o.KCP, EdgeName: o.EdgeName, Outbox: e.intents, Log: o.Log.WithName("replicate"), InventoryGate: o.InventoryGate,
		// Nil without an Observer: the manager then tracks no resync
		// outcomes at all.
		Metrics: o.Observer,
		// The edge learns at once that a shard cannot be reached (or can
		// again).
		EndpointsChanged: e.sendExportStatus,
	})
	if reports == nil {
		reports = e.mgr
	}
	e.reports = newReportWorker(reportWorkerOptions{writer: reports, send: e.controlOn, log: o.Log.WithName("reports"),
		observer: e.observer})
	e.publisher = newPublishWorker(o.Publisher, o.Export, e.publishResult, o.Log.WithName("publish"), e.mgr, o.AllowRelated)
	return e
}

// objectWorkers process kcp objects into intents (mostly local work: the
// intents go to the outbox, finalizers to their own queue).
const objectWorkers = 4

// finalizerWorkers add ferry's finalizer to new kcp objects, each a request
// kcp's virtual workspace forwards as a GET and a PUT. They run beside the
// intents (nothing waits for them), but until an object's finalizer lands
// a deletion in kcp does not wait for the edge: with 4 workers, in a
// 50 x 100 bench on a loaded machine, about 30 % of the finalizer writes
// landed only after the status phase, minutes after the objects' creation.
const finalizerWorkers = 16

// reportWorkers write the edge's reports into kcp: statuses and, on
// delete, the finalizer releases that end a deletion. Each is one request
// that kcp's virtual workspace forwards as a GET and a PUT, so a worker
// spends most of its time waiting on kcp; with few workers the releases
// queue behind the consumer's own deletes and the kcp objects stay
// Terminating long after their local copies are gone.
const reportWorkers = 16

// Run runs the engine until ctx ends and returns when all its goroutines
// have stopped.
func (e *Engine) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { e.mgr.Run(ctx, objectWorkers, finalizerWorkers) })
	wg.Go(func() { e.reports.run(ctx, reportWorkers) })
	wg.Go(func() { e.publisher.run(ctx) })
	wg.Go(func() { e.opts.Watcher.WatchVirtualWorkspace(ctx, e.opts.Export, e.virtualWorkspaceChanged) })
	wg.Wait()
}

func (e *Engine) virtualWorkspaceChanged(vw kcp.VirtualWorkspace) {
	e.mgr.SetVirtualWorkspace(vw.URLs)
	e.mu.Lock()
	e.vwURLs, e.vwKnown, e.vwExists = vw.URLs, true, vw.Exists
	e.mu.Unlock()
	e.sendExportStatus()
}

// sendExportStatus sends the export's status to the attached edge.
func (e *Engine) sendExportStatus() {
	e.control(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_ExportStatus{ExportStatus: e.exportStatus()}})
}

// VirtualWorkspaceURLs are the export's virtual workspace endpoints as last
// seen, and whether they were seen at all.
func (e *Engine) VirtualWorkspaceURLs() ([]string, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.vwURLs, e.vwKnown
}

// ExportState is the export's state as the engine's watch of its endpoint
// slice knows it, current without a read of kcp; false before the watch
// has seen the slice, and once it is gone (the export may be deleted).
func (e *Engine) ExportState() (kcp.ExportState, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.vwKnown || !e.vwExists {
		return kcp.ExportState{}, false
	}
	return kcp.ExportState{LogicalCluster: e.opts.LogicalCluster, VirtualWorkspaceURLs: e.vwURLs}, true
}

// Endpoints is the state of every current virtual workspace endpoint.
func (e *Engine) Endpoints() []replication.EndpointState { return e.mgr.Endpoints() }

func (e *Engine) exportStatus() *ferryv1.ExportStatus {
	urls, _ := e.VirtualWorkspaceURLs()
	return ExportStatus(e.opts.Export, e.opts.LogicalCluster, urls, e.Endpoints())
}

// EdgeName is the configured edge name the engine's finalizers carry.
func (e *Engine) EdgeName() string { return e.opts.EdgeName }

// Attach makes sink the engine's stream. The caller detaches (calling the
// returned function) after the stream's loops have stopped.
func (e *Engine) Attach(sink Sink) (detach func()) {
	e.mu.Lock()
	e.sink = sink
	e.attached = e.attachments.Add(1)
	e.mu.Unlock()
	e.observer.Attached()
	e.mgr.Attach()
	var once sync.Once
	return func() {
		once.Do(func() {
			e.mu.Lock()
			if e.sink == sink {
				e.sink = nil
			}
			e.mu.Unlock()
			e.mgr.Detach()
		})
	}
}

// control sends m on the attached stream's control lane; without a stream
// it is dropped (the edge re-sends what is unanswered on the next stream).
func (e *Engine) control(m *ferryv1.ConnectResponse) {
	e.mu.Lock()
	sink := e.sink
	e.mu.Unlock()
	e.sendControl(sink, m)
}

// controlOn sends m on the control lane of attachment only (an answer to a
// message of that stream); dropped when another stream, or none, is
// attached: the edge re-sends what is unanswered on the next stream.
func (e *Engine) controlOn(attachment uint64, m *ferryv1.ConnectResponse) {
	e.mu.Lock()
	sink := e.sink
	if e.attached != attachment {
		sink = nil
	}
	e.mu.Unlock()
	e.sendControl(sink, m)
}

// attachment is the number of the attached stream (Attach): the one whose
// messages Handle takes, as streams never overlap.
func (e *Engine) attachment() uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.attached
}

func (e *Engine) sendControl(sink Sink, m *ferryv1.ConnectResponse) {
	if sink == nil {
		return
	}
	if err := sink.Control(m); err != nil {
		e.opts.Log.Error(err, "cannot queue a message for the edge; the stream ends")
	}
}

func (e *Engine) publishResult(r *ferryv1.PublishResult) {
	e.control(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_PublishResult{PublishResult: r}})
}

// BulkReady is signalled when NextIntent may have something.
func (e *Engine) BulkReady() <-chan struct{} { return e.bulkReady }

// NextIntent returns the next intent to send within the window.
func (e *Engine) NextIntent() (*ferryv1.ConnectResponse, bool) {
	in := e.intents.Next()
	if in == nil {
		return nil, false
	}
	e.observer.IntentSent(in)
	if log := e.opts.Log.V(4); log.Enabled() {
		log.Info("sending intent", logging.KeyObject, replication.KeyString(in.GetKey()), "operation", protocol.OperationName(in),
			"sequence", in.GetVersion().GetSequence(), "resourceVersion", in.GetVersion().GetResourceVersion())
	}
	return &ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Intent{Intent: in}}, true
}

// TooLarge takes an intent the edge would refuse for its size: it counts
// as failed for its object, visibly (a Warning Event on the kcp object).
func (e *Engine) TooLarge(m *ferryv1.ConnectResponse, size, limit int) {
	in := m.GetIntent()
	if in == nil {
		return
	}
	e.intents.Done(in.GetKey(), in.GetRelatedTo(), in.GetVersion())
	primary := in.GetKey()
	if rt := in.GetRelatedTo(); rt != nil {
		primary = rt.GetPrimary()
	}
	e.opts.Log.Info("object not synced: larger than the edge accepts", logging.KeyObject, replication.KeyString(in.GetKey()), "bytes", size, "limit", limit)
	failure := &ferryv1.ApplyError{Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_TOO_LARGE, Message: tooLargeMessage(size, limit)}
	e.reports.add(reportTask{pr: in.GetPublishedResource(), key: primary, failure: failure})
	e.observer.IntentTooLarge(in, failure)
}

// Status describes the engine for the admin API.
func (e *Engine) Status() *ferryv1.EngineStatus {
	st := e.intents.Stats()
	s := &ferryv1.EngineStatus{
		StartedAt:       timestamppb.New(e.started),
		Attachments:     e.attachments.Load(),
		KcpLists:        e.mgr.Lists(),
		OutboxPending:   uint32(st.Pending),
		OutboxInFlight:  uint32(st.InFlight),
		Objects:         uint32(e.mgr.Objects()),
		RefusedMessages: e.mgr.Refused(),
	}
	e.adminStatus(s)
	return s
}

// MetricsState describes the engine for the metrics collector.
func (e *Engine) MetricsState() *metrics.EngineState {
	st := e.intents.Stats()
	endpoints := map[string]bool{}
	for _, ep := range e.Endpoints() {
		endpoints[ep.URL] = ep.Reachable
	}
	return &metrics.EngineState{
		Pending: st.Pending, InFlight: st.InFlight, OldestInFlight: st.OldestInFlight,
		Objects: e.mgr.ObjectsByResource(), Refused: e.mgr.Refused(), Endpoints: endpoints,
	}
}

// Size is the wire size of a message to the edge.
func Size(m *ferryv1.ConnectResponse) int { return proto.Size(m) }

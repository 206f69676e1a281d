// Package edgeload simulates many ferry edges against one real broker, to
// measure what a broker replica pays per connected edge (`make
// bench-edges`). Each simulated edge has its own client certificate (its
// identity) and its own APIExport, and runs ferry's own edge stream client
// (edge/stream: the mTLS dial, the handshake, heartbeats both ways, the
// reconnect backoff with full jitter) behind a handler that holds no
// objects. A few edges also publish a small CRD and answer the broker's
// intents with results and status reports (traffic.go), as ferry-edge does
// after applying them. It is not a test of the protocol: the protocol is
// the real one.
package edgeload

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/edge/stream"
	"github.com/ferry-dev/ferry/pkg/backoff"
	"github.com/ferry-dev/ferry/pkg/link"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// EdgeOptions configure one simulated edge.
type EdgeOptions struct {
	// Name is the agent name (a DNS label).
	Name string
	// BrokerAddress is host:port of the broker.
	BrokerAddress string
	// TLS is the edge's client TLS configuration (its own certificate).
	TLS *tlsconfig.ClientConfig
	// HeartbeatInterval is the edge's proposal.
	HeartbeatInterval time.Duration
	// BackoffInitial and BackoffMax pace reconnects, as ferry-edge's
	// --reconnect-initial-delay and --reconnect-max-delay do.
	BackoffInitial, BackoffMax time.Duration
	// MaxMessageBytes is the largest message the edge accepts.
	MaxMessageBytes uint32
	// Log receives the stream client's logs.
	Log logr.Logger
	// Publish, when set, makes the edge a traffic edge: it publishes
	// this (WidgetPublish) on every stream and answers intents for it.
	Publish *ferryv1.Publish
}

// Edge is one simulated edge. Its stream client runs in incarnations: Drop
// ends the current one (closing its connection, as a crashed or restarted
// edge process does) and starts the next at once.
type Edge struct {
	opts EdgeOptions

	// handler is the stream.Handler: the edge holds no objects; without
	// Publish it sends nothing but what the stream client sends itself
	// (hello, heartbeats) and takes every broker message.
	handler *handler

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}

	// dials counts TCP dials (stream attempts) since the start.
	dials atomic.Int64
}

// NewEdge returns an edge that is not running yet.
func NewEdge(o EdgeOptions) *Edge {
	return &Edge{opts: o, handler: newHandler(o.Publish)}
}

// Name is the edge's agent name.
func (e *Edge) Name() string { return e.opts.Name }

// Start runs a new incarnation of the edge's stream client under ctx.
func (e *Edge) Start(ctx context.Context) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	e.cancel, e.done = cancel, done
	client := stream.New(stream.Options{
		BrokerAddress:     e.opts.BrokerAddress,
		TLS:               e.opts.TLS,
		Dial:              e.dial,
		AgentName:         e.opts.Name,
		HeartbeatInterval: e.opts.HeartbeatInterval,
		MaxMessageBytes:   e.opts.MaxMessageBytes,
		Backoff:           &backoff.Exponential{Initial: e.opts.BackoffInitial, Max: e.opts.BackoffMax},
		StableAfter:       30 * time.Second,
		Handler:           e.handler,
		Log:               e.opts.Log,
	})
	go func() {
		defer close(done)
		_ = client.Run(ctx) // nil once ctx ends
	}()
}

// Stop ends the current incarnation and waits until its stream is gone.
func (e *Edge) Stop() {
	e.mu.Lock()
	cancel, done := e.cancel, e.done
	e.cancel, e.done = nil, nil
	e.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

func (e *Edge) dial(ctx context.Context, addr string) (net.Conn, error) {
	e.dials.Add(1)
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

// Dials is the number of connection attempts so far.
func (e *Edge) Dials() int64 { return e.dials.Load() }

// Connected tells whether a stream the broker accepted is running.
func (e *Edge) Connected() bool { return e.handler.attached.Load() }

// AcceptedAt is when the broker last accepted the edge's handshake (zero
// before the first).
func (e *Edge) AcceptedAt() time.Time {
	if n := e.handler.acceptedAt.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// Accepted counts the handshakes the broker accepted.
func (e *Edge) Accepted() int64 { return e.handler.accepted.Load() }

// Received counts the broker's messages other than hellos and heartbeats.
func (e *Edge) Received() int64 { return e.handler.received.Load() }

// IsTrafficEdge tells whether the edge publishes and answers intents.
func (e *Edge) IsTrafficEdge() bool { return e.handler.traffic != nil }

// Published is closed once the broker published the traffic edge's CRD
// (nil for an edge without traffic: never).
func (e *Edge) Published() <-chan struct{} {
	if e.handler.traffic == nil {
		return nil
	}
	return e.handler.traffic.published
}

// PublishResult is the broker's latest answer to the traffic edge's
// Publish (nil before the first, or without traffic).
func (e *Edge) PublishResult() *ferryv1.PublishResult {
	if e.handler.traffic == nil {
		return nil
	}
	return e.handler.traffic.latestResult()
}

// TrafficCounts are the traffic edge's intent and report counts so far
// (zero without traffic).
func (e *Edge) TrafficCounts() TrafficCounts {
	if e.handler.traffic == nil {
		return TrafficCounts{}
	}
	return e.handler.traffic.countsNow()
}

// TakeRoundTrips returns the intent round trips (the generator's kcp write
// to the edge receiving the intent) measured since the last call.
func (e *Edge) TakeRoundTrips() []time.Duration {
	if e.handler.traffic == nil {
		return nil
	}
	return e.handler.traffic.takeRoundTrips()
}

// PendingReports counts the traffic edge's reports the broker has not
// answered yet.
func (e *Edge) PendingReports() int {
	if e.handler.traffic == nil {
		return 0
	}
	return e.handler.traffic.pendingReports()
}

// handler implements stream.Handler for an edge without objects.
type handler struct {
	attached   atomic.Bool
	accepted   atomic.Int64
	acceptedAt atomic.Int64
	received   atomic.Int64
	// ready is signalled when traffic has bulk messages; without traffic
	// never.
	ready <-chan struct{}
	// traffic is nil for an edge that publishes nothing.
	traffic *traffic
}

var _ stream.Handler = (*handler)(nil)

func newHandler(publish *ferryv1.Publish) *handler {
	wake, ready := link.NewWake()
	h := &handler{ready: ready}
	if publish != nil {
		h.traffic = newTraffic(publish, wake)
	}
	return h
}

func (h *handler) Attach(_ *ferryv1.BrokerHello, control stream.Sink) {
	if h.traffic != nil {
		h.traffic.attach(control)
	}
	h.accepted.Add(1)
	h.acceptedAt.Store(time.Now().UnixNano())
	h.attached.Store(true)
}

func (h *handler) Detach() {
	if h.traffic != nil {
		h.traffic.detach()
	}
	h.attached.Store(false)
}

func (h *handler) Ready() <-chan struct{} { return h.ready }

func (h *handler) Next() (*ferryv1.ConnectRequest, bool) {
	if h.traffic == nil {
		return nil, false
	}
	return h.traffic.next()
}

// Handle takes ExportStatus and anything else the broker sends; an edge
// without traffic is sent nothing that needs an answer, a traffic edge
// answers intents and takes the answers to its publish and reports.
func (h *handler) Handle(msg *ferryv1.ConnectResponse) error {
	h.received.Add(1)
	if h.traffic == nil {
		return nil
	}
	switch m := msg.GetMessage().(type) {
	case *ferryv1.ConnectResponse_PublishResult:
		h.traffic.publishResult(m.PublishResult)
	case *ferryv1.ConnectResponse_Intent:
		h.traffic.intent(m.Intent)
	case *ferryv1.ConnectResponse_ReportResult:
		h.traffic.reportResult(m.ReportResult)
	case *ferryv1.ConnectResponse_InventoryRequest:
		h.traffic.inventoryRequest(m.InventoryRequest)
	}
	return nil
}

func (h *handler) TooLarge(*ferryv1.ConnectRequest, int, int) {}

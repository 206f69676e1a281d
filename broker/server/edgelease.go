package server

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/edgelease"
	"github.com/ferry-dev/ferry/broker/session"
	"github.com/ferry-dev/ferry/pkg/logging"
	"github.com/ferry-dev/ferry/pkg/protocol"
)

// EdgeLeaseOptions configure the Lease per configured edge identity that
// the broker keeps in the workspace of the edge's APIExport (package
// edgelease, docs/edge-status.md).
type EdgeLeaseOptions struct {
	// Namespace holds the Leases; empty writes no Leases.
	Namespace string
	// RenewInterval is the shortest interval between two renewals of a
	// connected edge's Lease: it is renewed every heartbeat interval, but
	// no more often than this. Default 10s.
	RenewInterval time.Duration
	// Clients writes the Leases; nil uses Options.KCP.
	Clients edgelease.Clients
}

// DefaultEdgeLeaseRenewInterval bounds the Lease writes per connected edge
// to one per 10 s.
const DefaultEdgeLeaseRenewInterval = 10 * time.Second

// minEdgeLeaseFlush is the least time a shutting-down broker gives the
// last Lease writes, even when its streams took the whole shutdown timeout
// to end.
const minEdgeLeaseFlush = time.Second

// edgeLeases tells kcp about the broker's edges: Connected (renewed on a
// period) while a stream lives, Disconnected when it ends, through an
// edgelease.Writer that never blocks the stream. A nil *edgeLeases writes
// nothing.
type edgeLeases struct {
	cfg             *config.Config
	writer          *edgelease.Writer
	renewInterval   time.Duration
	namespace       string
	shutdownTimeout time.Duration
	log             logr.Logger
	// counts are per configured identity, since the broker started; the
	// map is fixed at construction.
	counts map[string]*edgeCounts
}

// edgeCounts are an edge's error counts the engine does not keep.
type edgeCounts struct {
	mu        sync.Mutex
	nacks     uint64
	lastError string
}

func (c *edgeCounts) nacked(ae *ferryv1.ApplyError) {
	text := strings.TrimPrefix(ae.GetReason().String(), "APPLY_ERROR_REASON_") + ": " + ae.GetMessage()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nacks++
	c.lastError = text
}

func (c *edgeCounts) get() (nacks uint64, lastError string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nacks, c.lastError
}

// newEdgeLeases returns nil when Leases are off or their kcp clients
// cannot be built (logged).
func newEdgeLeases(o Options) *edgeLeases {
	lo := o.EdgeLeases
	if lo.Namespace == "" || o.Config == nil {
		return nil
	}
	log := o.Log.WithName("edgelease")
	clients := lo.Clients
	if clients == nil {
		if o.KCP == nil {
			return nil
		}
		var err error
		if clients, err = edgelease.NewClients(o.KCP); err != nil {
			log.Error(err, "edge Leases are off")
			return nil
		}
	}
	renew := lo.RenewInterval
	if renew <= 0 {
		renew = DefaultEdgeLeaseRenewInterval
	}
	l := &edgeLeases{
		cfg:             o.Config,
		writer:          edgelease.NewWriter(edgelease.Options{Clients: clients, Namespace: lo.Namespace, Log: log}),
		renewInterval:   renew,
		namespace:       lo.Namespace,
		shutdownTimeout: o.ShutdownTimeout,
		log:             log,
		counts:          map[string]*edgeCounts{},
	}
	for _, e := range o.Config.Edges {
		l.counts[e.Identity] = &edgeCounts{}
	}
	return l
}

// start runs the writer and marks every configured edge not connected
// (creating missing Leases, ending expired ones). The returned stop, called
// once the edges' streams have ended, gives the last writes (Disconnected)
// until the shutdown timeout has passed since ctx ended, then stops the
// writer.
func (l *edgeLeases) start(ctx context.Context) (stop func()) {
	if l == nil {
		return func() {}
	}
	var shutdownAt atomic.Pointer[time.Time]
	unregister := context.AfterFunc(ctx, func() {
		now := time.Now()
		shutdownAt.Store(&now)
	})
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.writer.Run(runCtx)
	}()
	for _, e := range l.cfg.Edges {
		l.writer.Set(edgelease.Status{Edge: e, State: edgelease.Disconnected, Initial: true, Reason: edgelease.ReasonNotConnected})
	}
	l.log.Info("keeping a Lease per configured edge in its APIExport's workspace", "namespace", l.namespace,
		"edges", len(l.cfg.Edges), "renewInterval", l.renewInterval.String())
	return func() {
		unregister()
		deadline := time.Now().Add(minEdgeLeaseFlush)
		if at := shutdownAt.Load(); at != nil && at.Add(l.shutdownTimeout).After(deadline) {
			deadline = at.Add(l.shutdownTimeout)
		}
		flushCtx, cancelFlush := context.WithDeadline(context.WithoutCancel(ctx), deadline)
		if err := l.writer.Flush(flushCtx); err != nil {
			l.log.Error(err, "shutting down without marking every edge Disconnected in kcp; their Leases expire instead")
		}
		cancelFlush()
		cancel()
		<-done
	}
}

// engineStatus is the part of the engine a Lease shows.
type engineStatus interface {
	Status() *ferryv1.EngineStatus
}

// edgeLeaseSession keeps one stream's Lease: Connected and renewed until
// disconnected is called. A nil *edgeLeaseSession does nothing.
type edgeLeaseSession struct {
	leases   *edgeLeases
	sess     *session.Session
	edge     config.Edge
	engine   engineStatus
	counts   *edgeCounts
	duration time.Duration
	stop     chan struct{}
	done     chan struct{}
}

// connected marks sess's edge Connected and renews its Lease every
// heartbeat interval, but at most every renewInterval. The Lease's
// duration is three such periods: with the default heartbeat (10 s) that
// is the broker's own silence limit; with a shorter heartbeat the Lease is
// renewed less often than the edge is heard, so it must last longer than
// the silence limit to not look expired between two renewals.
func (l *edgeLeases) connected(sess *session.Session, edge config.Edge, eng engineStatus, heartbeat time.Duration) *edgeLeaseSession {
	if l == nil {
		return nil
	}
	counts, ok := l.counts[edge.Identity]
	if !ok {
		counts = &edgeCounts{} // not configured at start: not possible, the handshake checks
	}
	period := max(heartbeat, l.renewInterval)
	s := &edgeLeaseSession{
		leases: l, sess: sess, edge: edge, engine: eng, counts: counts,
		duration: protocol.DeadAfter(period), stop: make(chan struct{}), done: make(chan struct{}),
	}
	l.writer.Set(s.status(edgelease.Connected))
	go s.renew(period)
	l.log.V(1).Info("edge Lease: connected", logging.KeyIdentity, edge.Identity, logging.KeySession, sess.ID, "renewEvery", period.String())
	return s
}

func (s *edgeLeaseSession) renew(period time.Duration) {
	defer close(s.done)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			s.leases.writer.Set(s.status(edgelease.Connected))
		}
	}
}

// observe wraps the stream's message handler to count the edge's nacks.
func (s *edgeLeaseSession) observe(handle func(*ferryv1.ConnectRequest) error) func(*ferryv1.ConnectRequest) error {
	if s == nil {
		return handle
	}
	return func(m *ferryv1.ConnectRequest) error {
		if ae := m.GetIntentResult().GetError(); ae != nil {
			s.counts.nacked(ae)
		}
		return handle(m)
	}
}

// disconnected marks the edge Disconnected, keeping its counts and
// versions; err ended the stream (nil: the edge closed it).
func (s *edgeLeaseSession) disconnected(err error) {
	if s == nil {
		return
	}
	close(s.stop)
	<-s.done // no renewal after this
	st := s.status(edgelease.Disconnected)
	st.DisconnectedAt, st.Reason = time.Now(), disconnectReason(err)
	s.leases.writer.Set(st)
}

// ReasonStreamCanceled is the disconnect reason of a stream the edge
// cancelled or whose connection closed (e.g. the edge stopped).
const ReasonStreamCanceled = "stream canceled: the edge stopped or its connection closed"

// disconnectReason is the end of a stream as the Lease shows it: the gRPC
// status's message without its code prefix.
func disconnectReason(err error) string {
	st, ok := status.FromError(err)
	switch {
	case err == nil || !ok:
		return errorText(err)
	case st.Code() == codes.Canceled:
		return ReasonStreamCanceled
	default:
		return st.Message()
	}
}

func (s *edgeLeaseSession) status(state edgelease.State) edgelease.Status {
	nacks, lastError := s.counts.get()
	var refused uint64
	if s.engine != nil {
		refused = s.engine.Status().GetRefusedMessages()
	}
	return edgelease.Status{
		Edge:            s.edge,
		State:           state,
		AgentName:       s.sess.AgentName,
		EdgeVersion:     s.sess.EdgeVersion,
		ProtocolVersion: s.sess.ProtocolVersion,
		SessionID:       s.sess.ID,
		PeerAddress:     s.sess.PeerAddress,
		ConnectedSince:  s.sess.ConnectedAt,
		LastSeen:        s.sess.LastSeen(),
		LeaseDuration:   s.duration,
		Counts:          &edgelease.Counts{RefusedMessages: refused, Nacks: nacks, LastError: lastError},
	}
}

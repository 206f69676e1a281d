package server

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/edgelease"
	"github.com/ferry-dev/ferry/broker/engine"
	"github.com/ferry-dev/ferry/broker/kcp"
	"github.com/ferry-dev/ferry/broker/registry"
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
	// RenewalsPerSecond bounds the renewals of all connected edges' Leases
	// together: with n edges connected each is renewed no more often than
	// every n/RenewalsPerSecond seconds (renewPeriod). 0 bounds nothing.
	RenewalsPerSecond float64
	// Clients writes the Leases; nil uses Options.KCP.
	Clients edgelease.Clients
}

// DefaultEdgeLeaseRenewInterval bounds the Lease writes per connected edge
// to one per 10 s.
const DefaultEdgeLeaseRenewInterval = 10 * time.Second

// DefaultEdgeLeaseRenewalsPerSecond bounds the renewals of all edges'
// Leases together: up to 500 connected edges renew every 10 s, 1,000 every
// 20 s. Each renewal is an update in kcp; at 100 a second kcp spent more
// than a core on them.
const DefaultEdgeLeaseRenewalsPerSecond = 50

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
	renewalsPerSec  float64
	namespace       string
	shutdownTimeout time.Duration
	log             logr.Logger
	// sessions counts the connected edges whose Leases are renewed: the
	// renewal period grows with it (renewPeriod).
	sessions atomic.Int64
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
		if clients, err = kcp.NewLeasesClients(o.KCP); err != nil {
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
		renewalsPerSec:  max(lo.RenewalsPerSecond, 0),
		namespace:       lo.Namespace,
		shutdownTimeout: o.ShutdownTimeout,
		log:             log,
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
	// Every initial status is set before the writer runs, so that the
	// first write in a workspace lists its Leases for all of its edges
	// (one List rather than a read per edge).
	for _, e := range l.cfg.Edges {
		l.writer.Set(edgelease.Status{Edge: e, State: edgelease.Disconnected, Initial: true, Reason: edgelease.ReasonNotConnected})
	}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.writer.Run(runCtx)
	}()
	l.log.Info("keeping a Lease per configured edge in its APIExport's workspace", "namespace", l.namespace,
		"edges", len(l.cfg.Edges), "renewInterval", l.renewInterval.String(), "renewalsPerSecond", l.renewalsPerSec)
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
	ErrorCounts() engine.ErrorCounts
}

// edgeLeaseSession keeps one stream's Lease: Connected and renewed until
// disconnected is called. A nil *edgeLeaseSession does nothing.
type edgeLeaseSession struct {
	leases    *edgeLeases
	sess      *registry.Session
	edge      config.Edge
	engine    engineStatus
	heartbeat time.Duration
	// duration is the Lease duration of the last write: set by connected,
	// then only by renew's goroutine (and read by disconnected after it
	// ended).
	duration time.Duration
	stop     chan struct{}
	done     chan struct{}
}

// renewPeriod is how often a connected edge's Lease is renewed while n
// edges are connected: every heartbeat interval, but no more often than
// renewInterval, and, with perSecond > 0, no more often than every
// n/perSecond seconds, so that all n renewals together stay within
// perSecond writes a second on average (1,000 edges at 50 a second: every
// 20 s).
func renewPeriod(heartbeat, renewInterval time.Duration, perSecond float64, n int64) time.Duration {
	period := max(heartbeat, renewInterval)
	if perSecond > 0 {
		period = max(period, time.Duration(float64(n)/perSecond*float64(time.Second)))
	}
	return period
}

// connected marks sess's edge Connected and renews its Lease every
// renewPeriod, computed anew for each renewal from the number of edges
// connected then. Each write's Lease duration is three of the period until
// the next renewal: with the default heartbeat (10 s) and few edges that is
// the broker's own silence limit; with a shorter heartbeat, or many edges,
// the Lease is renewed less often than the edge is heard, so it must last
// longer than the silence limit to not look expired between two renewals.
// Connect and disconnect are written at once; only renewals are paced.
func (l *edgeLeases) connected(sess *registry.Session, edge config.Edge, eng engineStatus, heartbeat time.Duration) *edgeLeaseSession {
	if l == nil {
		return nil
	}
	n := l.sessions.Add(1)
	period := renewPeriod(heartbeat, l.renewInterval, l.renewalsPerSec, n)
	s := &edgeLeaseSession{
		leases: l, sess: sess, edge: edge, engine: eng, heartbeat: heartbeat,
		duration: protocol.DeadAfter(period), stop: make(chan struct{}), done: make(chan struct{}),
	}
	l.writer.Set(s.status(edgelease.Connected))
	go s.renew(period)
	l.log.V(1).Info("edge Lease: connected", logging.KeyIdentity, edge.Identity, logging.KeySession, sess.ID,
		"renewEvery", period.String(), "connectedEdges", n)
	return s
}

// renew renews the Lease first after period, then at the period each
// renewal computes; a renewal's Lease lasts three of the period that
// follows it, so a growing period never lets the Lease lapse.
func (s *edgeLeaseSession) renew(period time.Duration) {
	defer close(s.done)
	t := time.NewTimer(period)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			period = renewPeriod(s.heartbeat, s.leases.renewInterval, s.leases.renewalsPerSec, s.leases.sessions.Load())
			s.duration = protocol.DeadAfter(period)
			s.leases.writer.Set(s.status(edgelease.Connected))
			t.Reset(period)
		}
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
	s.leases.sessions.Add(-1)
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
	var counts engine.ErrorCounts
	if s.engine != nil {
		counts = s.engine.ErrorCounts()
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
		Counts:          &edgelease.Counts{RefusedMessages: counts.Refused, Nacks: counts.Nacks, LastError: counts.LastError},
	}
}

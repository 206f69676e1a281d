package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"slices"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/engine"
	"github.com/ferry-dev/ferry/broker/kcp"
	"github.com/ferry-dev/ferry/broker/ownership"
	"github.com/ferry-dev/ferry/broker/registry"
	"github.com/ferry-dev/ferry/broker/revocation"
	"github.com/ferry-dev/ferry/pkg/link"
	"github.com/ferry-dev/ferry/pkg/logging"
	"github.com/ferry-dev/ferry/pkg/metrics"
	"github.com/ferry-dev/ferry/pkg/protocol"
	"github.com/ferry-dev/ferry/pkg/version"
)

// ExportResolver looks an APIExport up in kcp. Implemented by *kcp.Resolver;
// must be safe for concurrent use and honour ctx.
type ExportResolver interface {
	// Resolve checks the export and returns its state.
	Resolve(ctx context.Context, ref config.APIExportRef) (kcp.ExportState, error)
	// WatchVirtualWorkspace reports the export's virtual workspace URLs
	// (every endpoint, sorted) on every change until ctx ends (blocking).
	WatchVirtualWorkspace(ctx context.Context, ref config.APIExportRef, onChange func(kcp.VirtualWorkspace))
}

// syncService implements ferry.v1alpha1.SyncService: it authorizes the edge,
// runs the handshake, attaches the stream to its APIExport's engine and runs
// the stream's loops. Sync policy lives in the engine.
type syncService struct {
	ferryv1.UnimplementedSyncServiceServer

	cfg               *config.Config
	registry          *registry.Registry
	resolver          ExportResolver
	engines           *engines
	epoch             uint64
	heartbeatInterval time.Duration
	maxMessageBytes   uint32
	log               logr.Logger
	metrics           *metrics.Broker
	leases            *edgeLeases
	revocations       *revocation.Set
	enrolment         *enrolmentService
	// owners decides which replica serves an export; nil: this broker
	// serves every export (a single replica).
	owners *ownership.Owners
	// admission bounds the handshakes in progress (nil: unbounded).
	admission *admission
}

var _ ferryv1.SyncServiceServer = (*syncService)(nil)

// Stream queue sizes. The receive queue only smooths bursts: the dispatcher
// never waits on the network. The control queue must hold every answer the
// edge's windows allow at once (reports in flight) plus heartbeats and
// publish results; overflowing it ends the stream.
const (
	receiveQueue    = 256
	controlCapacity = 8192
)

func (s *syncService) Connect(stream ferryv1.SyncService_ConnectServer) error {
	ctx := stream.Context()
	peer, err := callerFrom(ctx)
	if err != nil {
		s.metrics.HandshakeRefused(refusedUnauthenticated)
		return status.Error(codes.Unauthenticated, err.Error())
	}
	id, addr := peer.identity, peer.addr
	log := s.log.WithValues(logging.KeyIdentity, id, logging.KeyPeer, addr)

	edgeCfg, ok := s.cfg.EdgeFor(id)
	if !ok {
		log.Info("refused edge: identity not configured")
		s.metrics.HandshakeRefused(refusedNotConfigured)
		return status.Errorf(codes.PermissionDenied,
			"identity %q is not configured at this broker: add it to edges[] in the broker configuration", id)
	}
	log = log.WithValues(logging.KeyExport, edgeCfg.APIExport.String())
	// Everything from here to the BrokerHello may read kcp: bounded (see
	// AdmissionOptions); the slot is released once the hello is sent.
	admitted, err := s.admission.acquire(ctx)
	if err != nil {
		var busy *busyError
		if errors.As(err, &busy) {
			log.V(1).Info("refused edge: too many handshakes in progress", "retryAfter", busy.retryAfter.String())
			s.metrics.HandshakeRefused(refusedBusy)
			return busy.GRPCStatus().Err()
		}
		return status.FromContextError(err).Err()
	}
	handshaking := true
	endHandshake := func() {
		if handshaking {
			handshaking = false
			admitted()
		}
	}
	defer endHandshake()
	if err := s.refuseRevoked(ctx, log, peer); err != nil {
		return err
	}

	// One receiver for the stream's lifetime: gRPC allows a single reader.
	// It exits when the handler has returned (gRPC then cancels the
	// stream's context) and never touches the engine.
	streamCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// The stream lives no longer than the certificate it was authenticated
	// with: a timer, so an idle stream ends on time too.
	leaf := peer.cert
	expiry := time.AfterFunc(time.Until(leaf.NotAfter), func() { cancel(&certificateExpiredError{at: leaf.NotAfter}) })
	defer expiry.Stop()
	r := link.Receive(streamCtx, stream.Recv, receiveQueue)

	hello, err := receiveHello(r)
	if err != nil {
		s.metrics.HandshakeRefused(refusedHandshakeTimeout)
		return err
	}
	if err := protocol.ValidateEdgeHello(hello); err != nil {
		s.metrics.HandshakeRefused(refusedBadHello)
		return status.Errorf(codes.InvalidArgument, "invalid EdgeHello: %v", err)
	}
	negotiated, err := protocol.NegotiateVersion(hello.GetProtocolVersion())
	if err != nil {
		s.metrics.HandshakeRefused(refusedProtocolVersion)
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	log = log.WithValues(logging.KeyAgent, hello.GetAgentName())

	state, err := s.exportState(ctx, edgeCfg.APIExport)
	if err != nil {
		log.Error(err, "cannot resolve the APIExport in kcp")
		var nf *kcp.NotFoundError
		if errors.As(err, &nf) {
			s.metrics.HandshakeRefused(refusedExportNotFound)
			return status.Error(codes.FailedPrecondition, err.Error())
		}
		s.metrics.HandshakeRefused(refusedKCPUnavailable)
		return status.Errorf(codes.Unavailable, "cannot reach kcp: %v", err)
	}

	owned, err := s.claim(ctx, log, edgeCfg.APIExport)
	if err != nil {
		return err
	}
	if owned != nil {
		// Ownership lost (the Lease was not renewed in time, so another
		// replica may take over): the stream ends first, and the edge
		// reconnects to whichever replica owns the export then.
		stop := context.AfterFunc(owned.Context(), func() {
			cancel(status.Errorf(codes.Unavailable, "this broker replica no longer owns APIExport %s; reconnect", edgeCfg.APIExport))
		})
		defer stop()
	}

	sess := registry.NewSession(registry.Info{
		ID:                  newSessionID(),
		Identity:            id,
		AgentName:           hello.GetAgentName(),
		EdgeVersion:         hello.GetEdgeVersion(),
		Export:              edgeCfg.APIExport,
		ExportState:         state,
		PeerAddress:         addr,
		CertificateSHA256:   peer.fingerprint,
		ProtocolVersion:     negotiated,
		EdgeMaxMessageBytes: hello.GetMaxReceiveMessageBytes(),
		Capabilities:        s.capabilities(hello),
		ConnectedAt:         time.Now(),
	}, cancel)

	release, err := s.registry.Acquire(sess)
	var held *registry.HeldError
	switch {
	case errors.As(err, &held):
		log.Info("refused edge: APIExport already served", logging.KeyHolder, held.Holder.Identity)
		s.metrics.HandshakeRefused(refusedExportHeld)
		return status.Error(codes.FailedPrecondition, err.Error())
	case err != nil:
		s.metrics.HandshakeRefused(refusedShuttingDown)
		return status.Error(codes.Unavailable, err.Error())
	}
	defer release()
	// A Revoke between the check above and Acquire found no session to
	// end, but its block is in the set before it looks (see adminService.Revoke).
	if err := s.refuseRevoked(ctx, log, peer); err != nil {
		return err
	}

	loop := link.NewLoop[*ferryv1.ConnectRequest, *ferryv1.ConnectResponse](controlCapacity)
	// The engine's finalizer comes from the configuration entry, never from
	// the agent name the edge announces.
	eng, detach := s.engines.attach(loop, edgeCfg.APIExport, edgeCfg.ResolvedName(), state.LogicalCluster, owned)
	// Detached after the loops have stopped (defers run in reverse): the
	// slot is released only then, so a new stream never overlaps this one.
	defer detach()
	if urls, known := eng.VirtualWorkspaceURLs(); known {
		state.VirtualWorkspaceURLs = urls
		sess.SetVirtualWorkspaceURLs(urls)
	}

	interval := protocol.NegotiateHeartbeat(s.heartbeatInterval, hello.GetHeartbeatInterval().AsDuration())
	err = stream.Send(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Hello{Hello: &ferryv1.BrokerHello{
		ProtocolVersion:        negotiated,
		Capabilities:           s.capabilities(hello),
		Identity:               id,
		MaxReceiveMessageBytes: s.maxMessageBytes,
		HeartbeatInterval:      durationpb.New(interval),
		BrokerVersion:          version.String(),
		BrokerEpoch:            s.epoch,
		SessionId:              sess.ID,
		Export:                 engine.ExportStatus(edgeCfg.APIExport, state.LogicalCluster, state.VirtualWorkspaceURLs, eng.Endpoints()),
	}}})
	if err != nil {
		return err
	}
	endHandshake()
	log = log.WithValues(logging.KeySession, sess.ID)
	log.Info("edge connected", logging.KeyProtocolVersion, negotiated, logging.KeyLogicalCluster, state.LogicalCluster)
	edgeLease := s.leases.connected(sess, edgeCfg, eng, interval)

	maxSend := int(sess.EdgeMaxMessageBytes)
	loop.Receiver = r
	loop.Send = stream.Send
	loop.Handle = func(m *ferryv1.ConnectRequest) error {
		if r := m.GetCertificateRenewal(); r != nil {
			// Signing is local CPU work (no network): fine on the
			// dispatcher.
			return loop.Control(s.enrolment.renew(r, id, peer.fingerprint, log))
		}
		return eng.Handle(m)
	}
	loop.OnReceive = func() { sess.Seen(time.Now()) }
	loop.Bulk = eng.NextIntent
	loop.BulkReady = eng.BulkReady()
	loop.Heartbeat = func(hb *ferryv1.Heartbeat) *ferryv1.ConnectResponse {
		return &ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Heartbeat{Heartbeat: hb}}
	}
	loop.Interval, loop.DeadAfter = interval, protocol.DeadAfter(interval)
	loop.MaxSend, loop.Size = maxSend, engine.Size
	loop.TooLarge = func(m *ferryv1.ConnectResponse, size int) { eng.TooLarge(m, size, maxSend) }
	err = loop.Run(streamCtx)
	var ended interface{ GRPCStatus() *status.Status }
	var expired *certificateExpiredError
	switch cause := context.Cause(streamCtx); {
	case errors.Is(cause, registry.ErrClosed):
		err = status.Error(codes.Unavailable, registry.ErrClosed.Error())
	case errors.As(cause, &ended):
		// Ended on purpose with a status (a revocation): the edge is told.
		err = ended.GRPCStatus().Err()
	case errors.As(cause, &expired):
		err = status.Error(codes.Unauthenticated, expired.Error())
	case link.IsEOF(err):
		err = nil
	case errors.Is(err, link.ErrPeerSilent):
		err = status.Errorf(codes.Unavailable, "no message from the edge for %s", protocol.DeadAfter(interval))
	case errors.Is(err, link.ErrControlFull):
		err = status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, context.Canceled) && ctx.Err() != nil:
		err = status.FromContextError(ctx.Err()).Err()
	}
	log.Info("edge disconnected", logging.KeyReason, errorText(err))
	edgeLease.disconnected(err)
	return err
}

// exportState is export's state in kcp: from its running engine, whose
// watch of the export's endpoint slice keeps it current, so a reconnect
// (or a storm of them) reads nothing from kcp; else resolved in kcp. An
// engine whose watch has not seen the slice yet, or saw it go (the export
// may be gone), is not trusted with it.
func (s *syncService) exportState(ctx context.Context, export config.APIExportRef) (kcp.ExportState, error) {
	if eng, ok := s.engines.get(export); ok {
		if state, known := eng.ExportState(); known {
			return state, nil
		}
	}
	return s.resolver.Resolve(ctx, export)
}

// claim returns this replica's ownership of export when replicas share the
// exports (nil, nil for a single broker), or the refusal to return: the
// owner's address for the edge to connect to, or kcp unreachable.
func (s *syncService) claim(ctx context.Context, log logr.Logger, export config.APIExportRef) (*ownership.Held, error) {
	if s.owners == nil {
		return nil, nil
	}
	claimCtx, cancel := context.WithTimeout(ctx, protocol.HandshakeTimeout)
	defer cancel()
	held, err := s.owners.Claim(claimCtx, export, export.Workspace)
	var elsewhere *ownership.ElsewhereError
	switch {
	case errors.As(err, &elsewhere):
		log.Info("sent the edge to the broker replica that owns its APIExport", logging.KeyOwner, elsewhere.Owner)
		s.metrics.HandshakeRefused(refusedNotOwner)
		return nil, protocol.RedirectError(export.String(), elsewhere.Owner)
	case err != nil:
		log.Error(err, "cannot read the ownership of the APIExport in kcp")
		s.metrics.HandshakeRefused(refusedKCPUnavailable)
		return nil, status.Errorf(codes.Unavailable, "cannot read the ownership of APIExport %s in kcp: %v", export, err)
	}
	return held, nil
}

// refuseRevoked refuses a stream whose certificate or identity is
// blocked, and one whose blocks cannot be read (kcp unreachable since the
// broker started): a revoked edge must never be let in for want of its
// revocations.
func (s *syncService) refuseRevoked(ctx context.Context, log logr.Logger, peer caller) error {
	if err := s.revocations.EnsureLoaded(ctx, peer.identity); err != nil {
		log.Error(err, "refused edge: its revocations cannot be read")
		s.metrics.HandshakeRefused(refusedRevocationsUnknown)
		return status.Errorf(codes.Unavailable, "the broker cannot read this edge's revocations from kcp, retry later: %v", err)
	}
	b, blocked := s.revocations.Match(peer.identity, peer.fingerprint)
	if !blocked {
		return nil
	}
	log.Info("refused edge: revoked", logging.KeyReason, b.Message(), "certificateSHA256", peer.fingerprint, "source", b.Source)
	s.metrics.HandshakeRefused(refusedRevoked)
	return status.Error(codes.Unauthenticated, b.Message())
}

// capabilities are those both sides support, less certificate renewal
// when this broker issues no certificates.
func (s *syncService) capabilities(hello *ferryv1.EdgeHello) []ferryv1.Capability {
	caps := protocol.IntersectCapabilities(hello.GetCapabilities())
	if !s.enrolment.on() {
		caps = slices.DeleteFunc(caps, func(c ferryv1.Capability) bool { return c == ferryv1.Capability_CAPABILITY_CERTIFICATE_RENEWAL })
	}
	return caps
}

// certificateExpiredError ends a stream whose client certificate expired.
type certificateExpiredError struct{ at time.Time }

func (e *certificateExpiredError) Error() string {
	return "client certificate expired at " + e.at.UTC().Format(time.RFC3339) + "; reconnect with a renewed certificate"
}

// receiveHello waits for the first message, which must be an EdgeHello.
func receiveHello(r link.Receiver[*ferryv1.ConnectRequest]) (*ferryv1.EdgeHello, error) {
	timeout := time.NewTimer(protocol.HandshakeTimeout)
	defer timeout.Stop()
	select {
	case msg := <-r.C:
		hello := msg.GetHello()
		if hello == nil {
			return nil, status.Errorf(codes.InvalidArgument, "the first message must be an EdgeHello, got %T", msg.GetMessage())
		}
		return hello, nil
	case err := <-r.Err:
		return nil, err
	case <-timeout.C:
		return nil, status.Errorf(codes.DeadlineExceeded, "no EdgeHello within %s", protocol.HandshakeTimeout)
	}
}

func newSessionID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // never fails (crypto/rand, Go 1.24+)
	return hex.EncodeToString(b)
}

func errorText(err error) string {
	if err == nil {
		return "edge closed the stream"
	}
	return err.Error()
}

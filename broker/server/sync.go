package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"k8s.io/client-go/rest"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/kcp"
	"github.com/ferry-dev/ferry/broker/replicate"
	"github.com/ferry-dev/ferry/broker/session"
	"github.com/ferry-dev/ferry/pkg/link"
	"github.com/ferry-dev/ferry/pkg/logging"
	"github.com/ferry-dev/ferry/pkg/protocol"
	"github.com/ferry-dev/ferry/pkg/version"
)

// ExportResolver looks an APIExport up in kcp. Implemented by *kcp.Resolver;
// must be safe for concurrent use and honour ctx.
type ExportResolver interface {
	// Resolve checks the export and returns its state.
	Resolve(ctx context.Context, ref config.APIExportRef) (kcp.ExportState, error)
	// WatchVirtualWorkspace reports the export's virtual workspace URL on
	// every change until ctx ends (blocking).
	WatchVirtualWorkspace(ctx context.Context, ref config.APIExportRef, onChange func(url string))
}

// syncService implements ferry.v1alpha1.SyncService: it authorizes the edge,
// runs the handshake and then keeps the stream alive.
type syncService struct {
	ferryv1.UnimplementedSyncServiceServer

	cfg               *config.Config
	registry          *session.Registry
	resolver          ExportResolver
	publisher         PublishApplier
	kcp               *rest.Config
	window            int
	epoch             uint64
	heartbeatInterval time.Duration
	maxMessageBytes   uint32
	log               logr.Logger
}

var _ ferryv1.SyncServiceServer = (*syncService)(nil)

// errShuttingDown is the cancellation cause of streams ended by a broker
// shutdown; the edge sees UNAVAILABLE and reconnects.
var errShuttingDown = errors.New("the broker is shutting down")

func (s *syncService) Connect(stream ferryv1.SyncService_ConnectServer) error {
	ctx := stream.Context()
	id, addr, err := identityFrom(ctx)
	if err != nil {
		return status.Error(codes.Unauthenticated, err.Error())
	}
	log := s.log.WithValues(logging.KeyIdentity, id, logging.KeyPeer, addr)

	edgeCfg, ok := s.cfg.EdgeFor(id)
	if !ok {
		log.Info("refused edge: identity not configured")
		return status.Errorf(codes.PermissionDenied,
			"identity %q is not configured at this broker: add it to edges[] in the broker configuration", id)
	}
	log = log.WithValues(logging.KeyExport, edgeCfg.APIExport.String())

	// One receiver for the stream's lifetime: gRPC allows a single reader.
	streamCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	r := link.Receive(streamCtx, stream.Recv)

	hello, err := receiveHello(r)
	if err != nil {
		return err
	}
	if err := protocol.ValidateEdgeHello(hello); err != nil {
		return status.Errorf(codes.InvalidArgument, "invalid EdgeHello: %v", err)
	}
	negotiated, err := protocol.NegotiateVersion(hello.GetProtocolVersion())
	if err != nil {
		return status.Error(codes.FailedPrecondition, err.Error())
	}
	log = log.WithValues(logging.KeyAgent, hello.GetAgentName())

	state, err := s.resolver.Resolve(ctx, edgeCfg.APIExport)
	if err != nil {
		log.Error(err, "cannot resolve the APIExport in kcp")
		var nf *kcp.NotFoundError
		if errors.As(err, &nf) {
			return status.Error(codes.FailedPrecondition, err.Error())
		}
		return status.Errorf(codes.Unavailable, "cannot reach kcp: %v", err)
	}

	sess := session.NewSession(session.Info{
		ID:                  newSessionID(),
		Identity:            id,
		AgentName:           hello.GetAgentName(),
		EdgeVersion:         hello.GetEdgeVersion(),
		Export:              edgeCfg.APIExport,
		ExportState:         state,
		PeerAddress:         addr,
		ProtocolVersion:     negotiated,
		EdgeMaxMessageBytes: hello.GetMaxReceiveMessageBytes(),
		Capabilities:        protocol.IntersectCapabilities(hello.GetCapabilities()),
		ConnectedAt:         time.Now(),
	}, func() { cancel(errShuttingDown) })

	release, err := s.registry.Acquire(sess)
	var held *session.HeldError
	switch {
	case errors.As(err, &held):
		log.Info("refused edge: APIExport already served", logging.KeyHolder, held.Holder.Identity)
		return status.Error(codes.FailedPrecondition, err.Error())
	case err != nil:
		return status.Error(codes.Unavailable, err.Error())
	}
	defer release()

	interval := protocol.NegotiateHeartbeat(s.heartbeatInterval, hello.GetHeartbeatInterval().AsDuration())
	err = stream.Send(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Hello{Hello: &ferryv1.BrokerHello{
		ProtocolVersion:        negotiated,
		Capabilities:           protocol.IntersectCapabilities(hello.GetCapabilities()),
		Identity:               id,
		MaxReceiveMessageBytes: s.maxMessageBytes,
		HeartbeatInterval:      durationpb.New(interval),
		BrokerVersion:          version.String(),
		BrokerEpoch:            s.epoch,
		SessionId:              sess.ID,
		Export:                 exportStatus(edgeCfg.APIExport, state),
	}}})
	if err != nil {
		return err
	}
	log = log.WithValues(logging.KeySession, sess.ID)
	log.Info("edge connected", logging.KeyProtocolVersion, negotiated, logging.KeyLogicalCluster, state.LogicalCluster)

	err = s.serve(streamCtx, stream, r, sess, interval, log)
	log.Info("edge disconnected", logging.KeyReason, errorText(err))
	return err
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

// serve runs the stream after the handshake until the edge leaves, goes
// silent, breaks the protocol or the broker shuts down.
func (s *syncService) serve(ctx context.Context, stream ferryv1.SyncService_ConnectServer,
	r link.Receiver[*ferryv1.ConnectRequest], sess *session.Session, interval time.Duration, log logr.Logger,
) error {
	clock := link.NewClock(interval, protocol.DeadAfter(interval))
	defer clock.Stop()

	// Helpers of this stream; all end with ctx (the stream's context).
	wakeOutbox, outboxReady := link.NewWake()
	outbox := replicate.NewOutbox(s.window, wakeOutbox)
	mgr := replicate.NewManager(replicate.Options{
		KCP: s.kcp, Agent: sess.AgentName, Epoch: s.epoch, Outbox: outbox, Log: log.WithName("replicate"),
		InventoryGate: inventoryGate(sess.Capabilities),
	})
	go mgr.Run(ctx, 2)
	wakeReports, reportsReady := link.NewWake()
	reports := newReportWorker(mgr, wakeReports, log.WithName("reports"))
	go reports.run(ctx)

	publishResults := make(chan *ferryv1.PublishResult)
	publisher := newPublishWorker(s.publisher, sess.Export, publishResults, log.WithName("publish"),
		func(msg *ferryv1.Publish, res *ferryv1.PublishResult) {
			r, ok, err := syncedResource(msg, res)
			switch {
			case err != nil:
				log.Error(err, "cannot sync published resource", "publishedResource", msg.GetPublishedResource())
			case ok:
				mgr.Ensure(r)
			default:
				mgr.Remove(msg.GetPublishedResource())
			}
		}, mgr.Remove)
	go publisher.run(ctx)
	exportURLs := make(chan string)
	go s.resolver.WatchVirtualWorkspace(ctx, sess.Export, func(url string) {
		mgr.SetVirtualWorkspace(url)
		select {
		case exportURLs <- url:
		case <-ctx.Done():
		}
	})
	st := &streamState{outbox: outbox, mgr: mgr, reports: reports, publisher: publisher, maxSend: int(sess.EdgeMaxMessageBytes), log: log}

	for {
		select {
		case <-ctx.Done():
			if errors.Is(context.Cause(ctx), errShuttingDown) {
				return status.Error(codes.Unavailable, errShuttingDown.Error())
			}
			return status.FromContextError(ctx.Err()).Err()
		case err := <-r.Err:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case msg := <-r.C:
			clock.Received()
			sess.Seen(time.Now())
			if err := s.handle(msg, st); err != nil {
				return err
			}
		case <-outboxReady:
			if err := st.sendIntents(stream); err != nil {
				return err
			}
		case <-reportsReady:
			for _, answer := range reports.take() {
				if err := stream.Send(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_ReportResult{ReportResult: answer}}); err != nil {
					return err
				}
			}
		case res := <-publishResults:
			if err := stream.Send(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_PublishResult{PublishResult: res}}); err != nil {
				return err
			}
		case url := <-exportURLs:
			sess.SetVirtualWorkspaceURL(url)
			st := exportStatus(sess.Export, sess.ExportState())
			log.Info("APIExport state", "virtualWorkspaceReady", st.GetVirtualWorkspaceReady(), "waitingFor", st.GetWaitingFor())
			if err := stream.Send(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_ExportStatus{ExportStatus: st}}); err != nil {
				return err
			}
		case <-clock.Beat:
			err := stream.Send(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Heartbeat{Heartbeat: clock.Heartbeat()}})
			if err != nil {
				return err
			}
		case <-clock.Dead:
			return status.Errorf(codes.Unavailable, "no message from the edge for %s", protocol.DeadAfter(interval))
		}
	}
}

// handle processes one message from the edge. Messages of features this
// broker does not implement yet end the stream with UNIMPLEMENTED, so an edge
// never believes they were processed.
func (s *syncService) handle(msg *ferryv1.ConnectRequest, st *streamState) error {
	publisher := st.publisher
	switch m := msg.GetMessage().(type) {
	case *ferryv1.ConnectRequest_Heartbeat:
		return nil
	case *ferryv1.ConnectRequest_Publish:
		// The export is the session's own: an edge can only publish into the
		// APIExport its identity is configured for.
		name := m.Publish.GetPublishedResource()
		if name == "" || len(m.Publish.GetSpec()) == 0 || len(m.Publish.GetCustomResourceDefinition()) == 0 {
			return status.Error(codes.InvalidArgument, "Publish needs published_resource, spec and custom_resource_definition")
		}
		publisher.enqueue(name, msg)
		return nil
	case *ferryv1.ConnectRequest_Unpublish:
		name := m.Unpublish.GetPublishedResource()
		if name == "" {
			return status.Error(codes.InvalidArgument, "Unpublish needs published_resource")
		}
		publisher.enqueue(name, msg)
		return nil
	case *ferryv1.ConnectRequest_IntentResult:
		st.intentResult(m.IntentResult)
		return nil
	case *ferryv1.ConnectRequest_StatusReport:
		return st.statusReport(m.StatusReport)
	case *ferryv1.ConnectRequest_RelatedObjectReport:
		return st.relatedObjectReport(m.RelatedObjectReport)
	case *ferryv1.ConnectRequest_DeletionConfirmation:
		return st.deletionConfirmation(m.DeletionConfirmation)
	case *ferryv1.ConnectRequest_Inventory:
		if m.Inventory.GetPublishedResource() == "" {
			return status.Error(codes.InvalidArgument, "Inventory needs published_resource")
		}
		st.mgr.Inventory(m.Inventory)
		return nil
	case *ferryv1.ConnectRequest_Hello:
		return status.Error(codes.InvalidArgument, "EdgeHello may only be sent once per stream")
	case nil:
		return status.Error(codes.InvalidArgument, "message without payload")
	default:
		return status.Errorf(codes.Unimplemented, "this broker does not handle %T yet", m)
	}
}

// inventoryGate is how long the broker waits for an edge's inventory before
// sending every object; zero when the edge does not do inventories.
func inventoryGate(caps []ferryv1.Capability) time.Duration {
	if slices.Contains(caps, ferryv1.Capability_CAPABILITY_INVENTORY_RESYNC) {
		return 30 * time.Second
	}
	return 0
}

func exportStatus(ref config.APIExportRef, state kcp.ExportState) *ferryv1.ExportStatus {
	st := &ferryv1.ExportStatus{
		Export:                exportRef(ref),
		LogicalCluster:        state.LogicalCluster,
		VirtualWorkspaceReady: state.VirtualWorkspaceURL != "",
	}
	if !st.VirtualWorkspaceReady {
		st.WaitingFor = fmt.Sprintf("APIExportEndpointSlice %s to list a virtual workspace URL (kcp adds it once the APIExport is bound)", ref)
	}
	return st
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

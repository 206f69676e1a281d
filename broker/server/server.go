// Package server is the broker's gRPC server: the SyncService edges connect
// to, the AdminService, grpc.health.v1 and server reflection, behind
// recovery and logging interceptors, on mutually authenticated TLS 1.3.
package server

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"net"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	grpclogging "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/logging"
	"github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/recovery"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/admin"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/engine"
	"github.com/ferry-dev/ferry/broker/ownership"
	"github.com/ferry-dev/ferry/broker/registry"
	"github.com/ferry-dev/ferry/broker/revocation"
	"github.com/ferry-dev/ferry/pkg/logging"
	"github.com/ferry-dev/ferry/pkg/metrics"
)

// Options configure a Server. All fields are required.
type Options struct {
	// Config authorizes edge and admin identities.
	Config *config.Config
	// TLS is the server's TLS configuration (tlsconfig.Server).
	TLS *tls.Config
	// Resolver looks APIExports up in kcp.
	Resolver ExportResolver
	// Publisher applies Publish messages to kcp.
	Publisher engine.PublishApplier
	// KCP is the broker's kcp rest config, used through the virtual
	// workspace for object sync.
	KCP *rest.Config
	// InFlightWindow is how many sync intents may await a result per edge.
	InFlightWindow int
	// EngineIdleTimeout is how long an APIExport's sync engine (watches,
	// caches, outbox) is kept without a connected edge.
	EngineIdleTimeout time.Duration
	// HeartbeatInterval is the broker's heartbeat proposal.
	HeartbeatInterval time.Duration
	// MaxMessageBytes is the largest message the broker accepts.
	MaxMessageBytes uint32
	// ShutdownTimeout bounds the graceful stop.
	ShutdownTimeout time.Duration
	// Log receives the server's logs.
	Log logr.Logger
	// Metrics records the broker's metrics; nil records none.
	Metrics *metrics.Broker
	// EdgeLeases configure the Lease per configured edge in kcp; a zero
	// value writes none.
	EdgeLeases EdgeLeaseOptions
	// Revocations are the blocked certificates and identities (loaded by
	// the caller; a stream of an edge whose workspace's blocks were not
	// read yet reads them first). Optional: nil applies the
	// configuration's revoked[] only, and AdminService.Revoke fails.
	Revocations *revocation.Set
	// Enrolment issues edge certificates (enrolment and renewal); a zero
	// value turns both off.
	Enrolment EnrolmentOptions
	// Ownership shares the APIExports among broker replicas (an export's
	// edge is served only by the replica that owns it, and sent there by
	// the others); nil: this broker serves every export.
	Ownership *ownership.Owners
	// Admission bounds the handshakes in progress; a zero value bounds
	// nothing.
	Admission AdmissionOptions
}

// Server is the broker's gRPC server.
type Server struct {
	opts     Options
	grpc     *grpc.Server
	health   *health.Server
	registry *registry.Registry
	engines  *engines
	leases   *edgeLeases
	// serving is true while the gRPC server accepts streams (readiness).
	serving atomic.Bool
}

// New builds a server; Serve runs it.
func New(o Options) *Server {
	if o.Revocations == nil {
		o.Revocations = revocation.New(revocation.Options{Config: o.Config, Log: o.Log.WithName("revocation")})
	}
	registry := registry.NewRegistry()
	g := newGRPCServer(o)
	epoch := newEpoch()
	log := o.Log.WithName("sync")
	engs := newEngines(o.EngineIdleTimeout, clock.RealClock{}, log, func(export config.APIExportRef, agent, logicalCluster string) served {
		// The records keep refused reports only of objects the engine syncs
		// (eng is set before the engine runs, so before any report).
		var eng *engine.Engine
		objects := admin.NewObjects(func(key *ferryv1.ObjectKey) bool { return eng.Syncs(key) }, nil)
		eng = engine.New(engine.Options{
			Export: export, LogicalCluster: logicalCluster, EdgeName: agent, KCP: o.KCP, Publisher: o.Publisher, AllowRelated: allowRelated(o.Config, export),
			Watcher: o.Resolver, Epoch: epoch, Window: o.InFlightWindow, InventoryGate: inventoryGate,
			Log:      log.WithName("engine").WithValues(logging.KeyExport, export.String(), logging.KeyAgent, agent),
			Observer: engine.Observers(o.Metrics.Export(export.String()), objects),
		})
		return served{Engine: eng, objects: objects}
	})
	leases := newEdgeLeases(o)
	enrol := &enrolmentService{opts: o.Enrolment, log: o.Log.WithName("enrolment")}
	ferryv1.RegisterEnrolmentServiceServer(g, enrol)
	ferryv1.RegisterSyncServiceServer(g, &syncService{
		cfg:               o.Config,
		registry:          registry,
		resolver:          o.Resolver,
		engines:           engs,
		epoch:             epoch,
		heartbeatInterval: o.HeartbeatInterval,
		maxMessageBytes:   o.MaxMessageBytes,
		log:               log,
		metrics:           o.Metrics,
		leases:            leases,
		revocations:       o.Revocations,
		enrolment:         enrol,
		owners:            o.Ownership,
		admission:         newAdmission(o.Admission),
	})
	ferryv1.RegisterAdminServiceServer(g, &adminService{
		cfg: o.Config, registry: registry, engines: engs, workspaces: workspaceResolverOf(o.Resolver),
		revocations: o.Revocations, log: o.Log.WithName("admin"), enrolment: enrol,
	})
	hs := health.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	reflection.Register(g)
	return &Server{opts: o, grpc: g, health: hs, registry: registry, engines: engs, leases: leases}
}

// inventoryGate is how long an engine waits for an edge's inventory after a
// stream attaches before it compares with what it knew.
const inventoryGate = 30 * time.Second

// newGRPCServer returns a gRPC server with ferry's transport settings and
// interceptors: logging outermost, so it also logs the Internal error that
// recovery makes of a handler panic.
func newGRPCServer(o Options) *grpc.Server {
	logger := logging.GRPCLogger(o.Log.WithName("grpc"))
	logOpts := []grpclogging.Option{grpclogging.WithLogOnEvents(grpclogging.FinishCall)}
	recoverOpts := []recovery.Option{recovery.WithRecoveryHandlerContext(func(ctx context.Context, p any) error {
		o.Log.Error(nil, "recovered from a panic in a gRPC handler", "panic", p)
		return status.Error(codes.Internal, "internal error in the broker (logged)")
	})}
	opts := []grpc.ServerOption{
		grpc.Creds(credentials.NewTLS(o.TLS)),
		grpc.MaxRecvMsgSize(int(o.MaxMessageBytes)),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.ChainUnaryInterceptor(
			grpclogging.UnaryServerInterceptor(logger, logOpts...),
			recovery.UnaryServerInterceptor(recoverOpts...),
			requireClientCertUnary,
		),
		grpc.ChainStreamInterceptor(
			grpclogging.StreamServerInterceptor(logger, logOpts...),
			recovery.StreamServerInterceptor(recoverOpts...),
			requireClientCertStream,
		),
		grpc.StatsHandler(o.Metrics.StatsHandler(ferryv1.SyncService_Connect_FullMethodName)),
	}
	return grpc.NewServer(opts...)
}

// Serve accepts connections on lis until ctx ends, then shuts down: health
// turns NOT_SERVING, edge streams end with UNAVAILABLE (edges reconnect
// elsewhere or later), and in-flight calls get ShutdownTimeout to finish.
func (s *Server) Serve(ctx context.Context, lis net.Listener) error {
	s.health.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(ferryv1.SyncService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	s.opts.Log.Info("broker serving", logging.KeyAddress, lis.Addr().String())

	s.serving.Store(true)
	defer s.serving.Store(false)
	if s.opts.Ownership != nil {
		// This replica's Lease is renewed until ctx ends; the engines
		// then stop, and Close releases the Lease.
		s.opts.Ownership.Start(ctx)
	}
	engineCtx, stopEngines := context.WithCancel(ctx)
	defer func() {
		stopEngines()
		s.engines.wait()
		// Every engine has stopped writing: releasing this replica's
		// Lease lets the others take its exports over at once.
		if s.opts.Ownership != nil {
			s.opts.Ownership.Close()
		}
	}()
	s.engines.start(engineCtx)
	// Deferred after the engines' stop: runs once the streams have ended,
	// so their Disconnected Leases are written before the broker exits.
	stopLeases := s.leases.start(ctx)
	defer stopLeases()
	errc := make(chan error, 1)
	go func() { errc <- s.grpc.Serve(lis) }()

	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	s.opts.Log.Info("broker shutting down")
	s.serving.Store(false)
	s.health.Shutdown()
	s.registry.Close()
	stopped := make(chan struct{})
	go func() {
		s.grpc.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(s.opts.ShutdownTimeout):
		s.opts.Log.Info("graceful stop timed out; closing remaining connections")
		s.grpc.Stop()
		<-stopped
	}
	if err := <-errc; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// Serving tells whether the server accepts edge streams: between Serve's
// start and the beginning of its shutdown.
func (s *Server) Serving() bool { return s.serving.Load() }

// UnreachableEndpoints lists the virtual workspace endpoints (kcp shards)
// the running sync engines cannot reach, for the readiness probe's body.
func (s *Server) UnreachableEndpoints() []string { return s.engines.unreachableEndpoints() }

// newEpoch returns a random non-zero broker epoch.
func newEpoch() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
		if e := binary.BigEndian.Uint64(b[:]); e != 0 {
			return e
		}
	}
}

// allowRelated is the related-resource allow-list of the edges serving
// export (entries serving one export agree on it).
func allowRelated(cfg *config.Config, export config.APIExportRef) func(schema.GroupResource) bool {
	if cfg == nil {
		return nil
	}
	e, _ := cfg.ExportEntry(export)
	return e.AllowsRelated
}

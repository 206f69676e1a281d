// Package admin serves the edge's local, read-only admin API
// (ferry.v1alpha1.EdgeAdminService) for the service owner: the broker link,
// the published resources and what the edge did with each object. It is
// plaintext without authentication, so it listens on loopback only; in a
// cluster, reach it with kubectl port-forward.
//
// The server lives as long as the process; the edge's leader-scoped parts
// (sync engine, broker link) are rebuilt after a lost leader election Lease,
// and each incarnation points the server at its own (SetSource).
package admin

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/reflection"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/edge/objectlog"
	"github.com/ferry-dev/ferry/edge/replication"
	"github.com/ferry-dev/ferry/edge/session"
	"github.com/ferry-dev/ferry/pkg/logging"
	"github.com/ferry-dev/ferry/pkg/version"
)

// DefaultAddress is where the admin API listens unless told otherwise.
const DefaultAddress = "127.0.0.1:8082"

// Flag names the address flag in errors.
const Flag = "--admin-bind-address"

// Source is one incarnation's state the server reads.
type Source struct {
	// Link is the broker link's handler.
	Link *session.Handler
	// Engine is the sync engine.
	Engine *replication.Engine
	// Objects is the record of what Engine did with each object (its
	// Observer); nil holds none.
	Objects *objectlog.Log
	// Leading tells whether the incarnation leads (nil: it does).
	Leading func() bool
}

// objects is src.Objects, or an empty log.
func (src *Source) objects() *objectlog.Log {
	if src.Objects == nil {
		return objectlog.New(nil)
	}
	return src.Objects
}

// Server implements ferry.v1alpha1.EdgeAdminService. Safe for concurrent
// use.
type Server struct {
	ferryv1.UnimplementedEdgeAdminServiceServer

	agent, brokerAddress string
	source               atomic.Pointer[Source]
}

var _ ferryv1.EdgeAdminServiceServer = (*Server)(nil)

// New returns a server for the edge called agent, dialling brokerAddress.
func New(agent, brokerAddress string) *Server {
	return &Server{agent: agent, brokerAddress: brokerAddress}
}

// SetSource points the server at an incarnation's state (nil: none runs).
// A nil server ignores it.
func (s *Server) SetSource(src *Source) {
	if s != nil {
		s.source.Store(src)
	}
}

// ValidateAddress checks an --admin-bind-address value: "0" (off) or a
// loopback host:port. The API is plaintext and unauthenticated; an address
// beyond loopback would expose it to the network.
func ValidateAddress(addr string) error {
	if addr == "0" {
		return nil
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s %q: %w", Flag, addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%s %q is not a loopback address: the edge's admin API is plaintext without authentication, so it only listens on loopback (e.g. %s); reach it from elsewhere with kubectl port-forward, or \"0\" turns it off",
		Flag, addr, DefaultAddress)
}

// Serve listens on addr (so a bad or busy address stops the program at
// start) and serves the admin API with server reflection until ctx ends;
// "0" serves nothing. It returns the address listened on.
func (s *Server) Serve(ctx context.Context, addr string, log logr.Logger) (net.Addr, error) {
	if addr == "0" {
		return nil, nil
	}
	if err := ValidateAddress(addr); err != nil {
		return nil, err
	}
	lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("cannot listen on %s %s: %w", Flag, addr, err)
	}
	g := grpc.NewServer()
	ferryv1.RegisterEdgeAdminServiceServer(g, s)
	reflection.Register(g)
	go func() {
		<-ctx.Done()
		stopped := make(chan struct{})
		go func() {
			g.GracefulStop()
			close(stopped)
		}()
		select {
		case <-stopped:
		case <-time.After(time.Second):
			g.Stop()
		}
	}()
	go func() {
		if err := g.Serve(lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			log.Error(err, "edge admin API stopped")
		}
	}()
	log.Info("serving the edge admin API (grpcurl -plaintext)", logging.KeyAddress, lis.Addr().String())
	return lis.Addr(), nil
}

// GetStatus implements EdgeAdminService.
func (s *Server) GetStatus(context.Context, *ferryv1.GetStatusRequest) (*ferryv1.GetStatusResponse, error) {
	out := &ferryv1.GetStatusResponse{AgentName: s.agent, EdgeVersion: version.String(), BrokerAddress: s.brokerAddress}
	src := s.source.Load()
	if src == nil {
		return out, nil
	}
	out.Leading = src.Leading == nil || src.Leading()
	if src.Link != nil {
		link := src.Link.Link()
		out.Connected = link.Connected
		if !link.Since.IsZero() {
			out.Since = timestamppb.New(link.Since)
		}
		out.Export = link.Export
		if h := link.Hello; h != nil && link.Connected {
			out.SessionId = h.GetSessionId()
			out.ProtocolVersion = h.GetProtocolVersion()
			out.Capabilities = h.GetCapabilities()
			out.Identity = h.GetIdentity()
			out.BrokerVersion = h.GetBrokerVersion()
		}
	}
	if src.Engine != nil {
		out.Resources = src.Engine.Resources()
		out.IntentsApplied, out.IntentsFailed = src.objects().Counts()
		out.ReportsPending = uint32(src.Engine.ReportsPending())
	}
	return out, nil
}

// GetObjectState implements EdgeAdminService.
func (s *Server) GetObjectState(_ context.Context, req *ferryv1.EdgeAdminServiceGetObjectStateRequest) (*ferryv1.EdgeAdminServiceGetObjectStateResponse, error) {
	src := s.source.Load()
	if src == nil || src.Engine == nil {
		return nil, status.Error(codes.Unavailable, "the edge's sync engine is not running (starting, or waiting for the service cluster's API server)")
	}
	out, err := src.objects().ObjectState(src.Engine, req)
	switch {
	case errors.Is(err, objectlog.ErrInvalidQuery):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, objectlog.ErrObjectNotFound):
		msg := err.Error()
		if src.Leading != nil && !src.Leading() {
			msg += " (this replica is not the leader: it syncs nothing; ask the leading replica)"
		}
		return nil, status.Error(codes.NotFound, strings.TrimSpace(msg))
	case err != nil:
		return nil, status.Error(codes.Internal, err.Error())
	}
	return out, nil
}

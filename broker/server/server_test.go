package server

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"
	"k8s.io/client-go/rest"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/engine"
	"github.com/ferry-dev/ferry/broker/kcp"
	"github.com/ferry-dev/ferry/broker/publish"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/pkg/protocol"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// fakeResolver answers from a map; unknown exports are not found.
type fakeResolver struct {
	states map[config.APIExportRef]kcp.ExportState
	err    error
}

func (f fakeResolver) Resolve(_ context.Context, ref config.APIExportRef) (kcp.ExportState, error) {
	if f.err != nil {
		return kcp.ExportState{}, f.err
	}
	s, ok := f.states[ref]
	if !ok {
		return kcp.ExportState{}, &kcp.NotFoundError{What: "APIExport " + ref.String(), Err: errors.New("not found")}
	}
	return s, nil
}

func (f fakeResolver) WatchVirtualWorkspace(ctx context.Context, _ config.APIExportRef, onChange func(kcp.VirtualWorkspace)) {
	onChange(kcp.VirtualWorkspace{Exists: true, URLs: []string{"https://kcp.example/services/apiexport/abc/a.ferry.dev"}})
	<-ctx.Done()
}

// echoApplier answers every Publish with PUBLISHED, or fails the first
// failures calls with a retryable error.
type echoApplier struct {
	mu       sync.Mutex
	failures int
}

func (e *echoApplier) Apply(_ context.Context, export config.APIExportRef, owners publish.Owners, msg *ferryv1.Publish) (*ferryv1.PublishResult, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.failures > 0 {
		e.failures--
		return nil, errors.New("kcp is down")
	}
	owners[msg.GetPublishedResource()] = msg.GetPublishedResource()
	return &ferryv1.PublishResult{
		PublishedResource: msg.GetPublishedResource(), Revision: msg.GetRevision(),
		State: ferryv1.PublishState_PUBLISH_STATE_PUBLISHED, Message: export.String(),
	}, nil
}

var (
	exportA = config.APIExportRef{Workspace: "root:org", Name: "a.ferry.dev"}
	exportB = config.APIExportRef{Workspace: "root:org", Name: "missing.ferry.dev"}
)

type testBroker struct {
	srv    *Server
	addr   string
	pki    string
	cancel context.CancelFunc
	done   chan error
}

func startTestBroker(t *testing.T, resolver ExportResolver) *testBroker {
	t.Helper()
	return startTestBrokerWith(t, resolver, &echoApplier{})
}

// startTestBrokerWith starts a broker; mutate may change its options
// (Config is set when it runs; pki is the test PKI's directory).
func startTestBrokerWith(t *testing.T, resolver ExportResolver, applier engine.PublishApplier, mutate ...func(o *Options, pki string)) *testBroker {
	t.Helper()
	pki := t.TempDir()
	ca, err := devpki.LoadOrCreateCA(pki, "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.IssueServer(pki, "broker", []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"edge-a", "edge-a2", "edge-b", "stranger", "admin"} {
		if err := ca.IssueClient(pki, c, devpki.IdentityFor(c)); err != nil {
			t.Fatal(err)
		}
	}
	tlsCfg, err := tlsconfig.Server(tlsconfig.Files{
		CertFile: devpki.CertFile(pki, "broker"), KeyFile: devpki.KeyFile(pki, "broker"), CAFile: filepath.Join(pki, devpki.CACertFile),
	}, tlsconfig.Profile{}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	opts := Options{
		Config: &config.Config{
			Edges: []config.Edge{
				{Identity: devpki.IdentityFor("edge-a"), APIExport: exportA},
				{Identity: devpki.IdentityFor("edge-a2"), APIExport: exportA},
				{Identity: devpki.IdentityFor("edge-b"), APIExport: exportB},
			},
			Admins: []string{devpki.IdentityFor("admin")},
		},
		TLS:               tlsCfg,
		Resolver:          resolver,
		Publisher:         applier,
		KCP:               &rest.Config{},
		InFlightWindow:    16,
		HeartbeatInterval: 2 * time.Second,
		MaxMessageBytes:   protocol.DefaultMaxMessageBytes,
		ShutdownTimeout:   5 * time.Second,
		Log:               logr.Discard(),
	}
	for _, m := range mutate {
		m(&opts, pki)
	}
	srv := New(opts)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tb := &testBroker{srv: srv, addr: lis.Addr().String(), pki: pki, cancel: cancel, done: make(chan error, 1)}
	go func() { tb.done <- srv.Serve(ctx, lis) }()
	t.Cleanup(tb.stop)
	return tb
}

func (tb *testBroker) stop() {
	tb.cancel()
	<-tb.done
	tb.done <- nil // later stops return at once
}

func (tb *testBroker) dial(t *testing.T, client string) *grpc.ClientConn {
	t.Helper()
	tlsCfg, err := tlsconfig.Client(tlsconfig.Files{
		CertFile: devpki.CertFile(tb.pki, client), KeyFile: devpki.KeyFile(tb.pki, client), CAFile: filepath.Join(tb.pki, devpki.CACertFile),
	}, "", tlsconfig.Profile{})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := tlsCfg.Config()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(tb.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func validHello() *ferryv1.EdgeHello {
	return &ferryv1.EdgeHello{
		ProtocolVersion:        protocol.Version,
		Capabilities:           []ferryv1.Capability{ferryv1.Capability_CAPABILITY_STATUS},
		AgentName:              "nora",
		MaxReceiveMessageBytes: protocol.DefaultMaxMessageBytes,
		HeartbeatInterval:      durationpb.New(5 * time.Second),
	}
}

// connect opens a stream, sends first and returns the first answer or the
// error that ended the stream.
func connect(t *testing.T, conn *grpc.ClientConn, first *ferryv1.ConnectRequest) (ferryv1.SyncService_ConnectClient, *ferryv1.ConnectResponse, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	stream, err := ferryv1.NewSyncServiceClient(conn).Connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := stream.Send(first); err != nil {
		_, err = stream.Recv()
		return nil, nil, err
	}
	resp, err := stream.Recv()
	return stream, resp, err
}

func helloRequest(h *ferryv1.EdgeHello) *ferryv1.ConnectRequest {
	return &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_Hello{Hello: h}}
}

func TestConnectRefusals(t *testing.T) {
	tb := startTestBroker(t, fakeResolver{states: map[config.APIExportRef]kcp.ExportState{exportA: {LogicalCluster: "abc"}}})
	skewed := validHello()
	skewed.ProtocolVersion = protocol.Version + 2
	invalid := validHello()
	invalid.AgentName = "Not A Label"

	tests := []struct {
		name     string
		client   string
		first    *ferryv1.ConnectRequest
		wantCode codes.Code
		wantMsg  string
	}{
		{name: "unknown identity", client: "stranger", first: helloRequest(validHello()),
			wantCode: codes.PermissionDenied, wantMsg: `"` + devpki.IdentityFor("stranger") + `" is not configured`},
		{name: "admin identity is not an edge", client: "admin", first: helloRequest(validHello()),
			wantCode: codes.PermissionDenied, wantMsg: devpki.IdentityFor("admin")},
		{name: "first message not a hello", client: "edge-a",
			first:    &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_Heartbeat{Heartbeat: &ferryv1.Heartbeat{}}},
			wantCode: codes.InvalidArgument, wantMsg: "first message must be an EdgeHello"},
		{name: "invalid hello", client: "edge-a", first: helloRequest(invalid),
			wantCode: codes.InvalidArgument, wantMsg: "agent_name"},
		{name: "protocol too new", client: "edge-a", first: helloRequest(skewed),
			wantCode: codes.FailedPrecondition, wantMsg: "skew"},
		{name: "APIExport not in kcp", client: "edge-b", first: helloRequest(validHello()),
			wantCode: codes.FailedPrecondition, wantMsg: "APIExport " + exportB.String()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := connect(t, tb.dial(t, tt.client), tt.first)
			st := status.Convert(err)
			if st.Code() != tt.wantCode || !strings.Contains(st.Message(), tt.wantMsg) {
				t.Fatalf("got %v %q; want %v containing %q", st.Code(), st.Message(), tt.wantCode, tt.wantMsg)
			}
		})
	}
}

func TestConnectKCPUnreachableIsUnavailable(t *testing.T) {
	tb := startTestBroker(t, fakeResolver{err: errors.New("connection refused")})
	_, _, err := connect(t, tb.dial(t, "edge-a"), helloRequest(validHello()))
	if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "connection refused") {
		t.Fatalf("got %v %q", st.Code(), st.Message())
	}
}

func TestConnectHandshakeAndOneEdgePerExport(t *testing.T) {
	tb := startTestBroker(t, fakeResolver{states: map[config.APIExportRef]kcp.ExportState{exportA: {LogicalCluster: "abc"}}})

	first, resp, err := connect(t, tb.dial(t, "edge-a"), helloRequest(validHello()))
	if err != nil {
		t.Fatal(err)
	}
	h := resp.GetHello()
	switch {
	case h == nil:
		t.Fatalf("first answer is %T, want BrokerHello", resp.GetMessage())
	case h.GetIdentity() != devpki.IdentityFor("edge-a"):
		t.Errorf("identity %q", h.GetIdentity())
	case h.GetProtocolVersion() != protocol.Version:
		t.Errorf("protocol version %d", h.GetProtocolVersion())
	case h.GetHeartbeatInterval().AsDuration() != 5*time.Second:
		t.Errorf("heartbeat %v, want the longer proposal 5s", h.GetHeartbeatInterval().AsDuration())
	case len(h.GetCapabilities()) != 1 || h.GetCapabilities()[0] != ferryv1.Capability_CAPABILITY_STATUS:
		t.Errorf("capabilities %v, want only what the edge announced", h.GetCapabilities())
	case h.GetBrokerEpoch() == 0 || h.GetSessionId() == "":
		t.Errorf("epoch %d session %q must be set", h.GetBrokerEpoch(), h.GetSessionId())
	case h.GetExport().GetLogicalCluster() != "abc" || (h.GetExport().GetWaitingFor() == "") == (len(h.GetExport().GetEndpoints()) == 0):
		// The new engine's watch (the fake reports an endpoint at once)
		// may or may not have reported before the hello: either it waits
		// for a binding or it names the endpoint, never neither or both.
		t.Errorf("export status %v", h.GetExport())
	}

	// A second identity for the same export is refused, naming the holder.
	_, _, err = connect(t, tb.dial(t, "edge-a2"), helloRequest(validHello()))
	if st := status.Convert(err); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), devpki.IdentityFor("edge-a")) {
		t.Fatalf("second edge: got %v %q", st.Code(), st.Message())
	}

	// The admin API shows who holds it.
	admin := ferryv1.NewAdminServiceClient(tb.dial(t, "admin"))
	list, err := admin.ListEdges(context.Background(), &ferryv1.ListEdgesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	states := map[string]ferryv1.EdgeState{}
	for _, e := range list.GetEdges() {
		states[e.GetIdentity()] = e.GetState()
	}
	if states[devpki.IdentityFor("edge-a")] != ferryv1.EdgeState_EDGE_STATE_CONNECTED || states[devpki.IdentityFor("edge-a2")] != ferryv1.EdgeState_EDGE_STATE_DISCONNECTED {
		t.Errorf("admin states %v", states)
	}
	if _, err := ferryv1.NewAdminServiceClient(tb.dial(t, "edge-a")).ListEdges(context.Background(), &ferryv1.ListEdgesRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Errorf("an edge identity may not use the admin API: %v", err)
	}

	// When the first leaves, the second gets in.
	if err := first.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := first.Recv(); err != nil {
			break // the broker ended the stream
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, resp, err := connect(t, tb.dial(t, "edge-a2"), helloRequest(validHello()))
		if err == nil && resp.GetHello() != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("second edge still refused after the first left: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestShutdownEndsStreamsWithUnavailable(t *testing.T) {
	tb := startTestBroker(t, fakeResolver{states: map[config.APIExportRef]kcp.ExportState{exportA: {}}})
	stream, _, err := connect(t, tb.dial(t, "edge-a"), helloRequest(validHello()))
	if err != nil {
		t.Fatal(err)
	}
	health := healthpb.NewHealthClient(tb.dial(t, "admin"))
	if resp, err := health.Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health before shutdown: %v %v", resp, err)
	}
	tb.stop()
	for {
		_, err := stream.Recv()
		if err == nil {
			continue // heartbeats
		}
		if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "shutting down") {
			t.Fatalf("stream ended with %v %q, want UNAVAILABLE shutting down", st.Code(), st.Message())
		}
		return
	}
}

func TestHandlerPanicBecomesInternal(t *testing.T) {
	tb := startTestBroker(t, fakeResolver{}) // only for its PKI
	tlsCfg, err := tlsconfig.Server(tlsconfig.Files{
		CertFile: devpki.CertFile(tb.pki, "broker"), KeyFile: devpki.KeyFile(tb.pki, "broker"), CAFile: filepath.Join(tb.pki, devpki.CACertFile),
	}, tlsconfig.Profile{}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	g := newGRPCServer(Options{TLS: tlsCfg, MaxMessageBytes: protocol.DefaultMaxMessageBytes, Log: logr.Discard()})
	g.RegisterService(&grpc.ServiceDesc{
		ServiceName: "ferrytest.Panic",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{
			MethodName: "Do",
			Handler: func(_ any, ctx context.Context, dec func(any) error, ic grpc.UnaryServerInterceptor) (any, error) {
				in := new(emptypb.Empty)
				if err := dec(in); err != nil {
					return nil, err
				}
				panicking := func(context.Context, any) (any, error) { panic("boom") }
				return ic(ctx, in, &grpc.UnaryServerInfo{FullMethod: "/ferrytest.Panic/Do"}, panicking)
			},
		}},
	}, struct{}{})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	tb.addr = lis.Addr().String()

	err = tb.dial(t, "edge-a").Invoke(context.Background(), "/ferrytest.Panic/Do", &emptypb.Empty{}, &emptypb.Empty{})
	if status.Code(err) != codes.Internal {
		t.Fatalf("panic in a handler gave %v, want Internal", err)
	}
	// The server survived: a second call gets the same answer.
	err = tb.dial(t, "edge-a").Invoke(context.Background(), "/ferrytest.Panic/Do", &emptypb.Empty{}, &emptypb.Empty{})
	if status.Code(err) != codes.Internal {
		t.Fatalf("second call: %v", err)
	}
}

func TestPublishRoundTripWithRetry(t *testing.T) {
	tb := startTestBrokerWith(t, fakeResolver{states: map[config.APIExportRef]kcp.ExportState{exportA: {LogicalCluster: "abc"}}},
		&echoApplier{failures: 1})
	stream, _, err := connect(t, tb.dial(t, "edge-a"), helloRequest(validHello()))
	if err != nil {
		t.Fatal(err)
	}
	err = stream.Send(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_Publish{Publish: &ferryv1.Publish{
		PublishedResource: "certs", Spec: []byte("{}"), CustomResourceDefinition: []byte("{}"), Revision: "r1",
	}}})
	if err != nil {
		t.Fatal(err)
	}
	var states []ferryv1.PublishState
	sawExportStatus := false
	for len(states) == 0 || states[len(states)-1] != ferryv1.PublishState_PUBLISH_STATE_PUBLISHED {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if st := msg.GetExportStatus(); st != nil && st.GetVirtualWorkspaceReady() {
			sawExportStatus = true
		}
		if r := msg.GetPublishResult(); r != nil {
			if r.GetPublishedResource() != "certs" || r.GetRevision() != "r1" {
				t.Fatalf("result for the wrong publish: %v", r)
			}
			states = append(states, r.GetState())
		}
	}
	if len(states) != 2 || states[0] != ferryv1.PublishState_PUBLISH_STATE_PENDING {
		t.Errorf("want PENDING (kcp failure, retrying) then PUBLISHED, got %v", states)
	}
	if !sawExportStatus {
		t.Error("the virtual workspace URL reported by the watch never reached the edge as ExportStatus")
	}

	// A Publish without content breaks the protocol.
	if err := stream.Send(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_Publish{Publish: &ferryv1.Publish{PublishedResource: "x"}}}); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := stream.Recv()
		if err == nil {
			continue
		}
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("empty Publish: %v, want InvalidArgument", err)
		}
		break
	}
}

package stream

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/backoff"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/pkg/link"
	"github.com/ferry-dev/ferry/pkg/metrics"
	"github.com/ferry-dev/ferry/pkg/protocol"
	"github.com/ferry-dev/ferry/pkg/proxydial"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
	"github.com/ferry-dev/ferry/test/connectproxy"
)

func TestAttemptResult(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{status.Error(codes.PermissionDenied, "identity not configured"), "refused"},
		{status.Error(codes.Unauthenticated, "no certificate"), "refused"},
		{status.Error(codes.FailedPrecondition, "APIExport served by another edge"), "refused"},
		{status.Error(codes.InvalidArgument, "bad hello"), "refused"},
		{status.Error(codes.Unavailable, "connection refused"), "failed"},
		{errors.New("no BrokerHello within 10s"), "failed"},
		{nil, "failed"},
	} {
		if got := attemptResult(tc.err); got != tc.want {
			t.Errorf("attemptResult(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

func TestLogStreamEndIsAnErrorOnlyWhenRefused(t *testing.T) {
	for _, tc := range []struct {
		err       error
		wantError bool
		wantText  string
	}{
		{status.Error(codes.PermissionDenied, "identity not configured"), true, "broker refused this edge"},
		{status.Error(codes.Unauthenticated, `identity "spiffe://x/edge" is blocked: leaked`), true, `"reason"="identity \"spiffe://x/edge\" is blocked: leaked"`},
		{status.Error(codes.Unavailable, "broker shutting down"), false, "broker shutting down"},
		{nil, false, "stream ended"},
	} {
		var lines []string
		log := funcr.New(func(prefix, args string) { lines = append(lines, prefix+" "+args) }, funcr.Options{})
		logStreamEnd(log, tc.err, time.Second, 3)
		out := strings.Join(lines, "\n")
		if isError := strings.Contains(out, `"error"=`); isError != tc.wantError || !strings.Contains(out, tc.wantText) ||
			!strings.Contains(out, `"attempt"=3`) {
			t.Errorf("%v: logged %q, want error=%v containing %q and the attempt", tc.err, out, tc.wantError, tc.wantText)
		}
	}
}

func TestReceiveHello(t *testing.T) {
	for _, tc := range []struct {
		name    string
		msg     *ferryv1.ConnectResponse
		err     error
		wantErr string
	}{
		{name: "hello", msg: &ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Hello{Hello: &ferryv1.BrokerHello{SessionId: "s"}}}},
		{name: "another message first", msg: &ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Heartbeat{Heartbeat: &ferryv1.Heartbeat{}}},
			wantErr: "not a BrokerHello"},
		{name: "stream ended", err: status.Error(codes.PermissionDenied, "refused"), wantErr: "refused"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msgs, errs := make(chan *ferryv1.ConnectResponse, 1), make(chan error, 1)
			if tc.msg != nil {
				msgs <- tc.msg
			} else {
				errs <- tc.err
			}
			hello, err := receiveHello(link.Receiver[*ferryv1.ConnectResponse]{C: msgs, Err: errs})
			switch {
			case tc.wantErr == "" && (err != nil || hello.GetSessionId() != "s"):
				t.Errorf("got %v, %v; want the hello", hello, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestHandleForwardsAllButLivenessAndHandshake(t *testing.T) {
	for _, tc := range []struct {
		name      string
		msg       *ferryv1.ConnectResponse
		forwarded bool
		wantErr   bool
	}{
		{"heartbeat", &ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Heartbeat{Heartbeat: &ferryv1.Heartbeat{}}}, false, false},
		{"export status", &ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_ExportStatus{ExportStatus: &ferryv1.ExportStatus{}}}, true, false},
		{"intent", &ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Intent{Intent: &ferryv1.SyncIntent{}}}, true, false},
		{"second hello", &ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Hello{Hello: &ferryv1.BrokerHello{}}}, false, true},
		{"no payload", &ferryv1.ConnectResponse{}, false, true},
	} {
		h := &fakeHandler{}
		c := New(Options{Handler: h, Log: logr.Discard()})
		err := c.handle(tc.msg)
		if (err != nil) != tc.wantErr || (len(h.handled) == 1) != tc.forwarded {
			t.Errorf("%s: error %v, forwarded %d; want error %v, forwarded %v", tc.name, err, len(h.handled), tc.wantErr, tc.forwarded)
		}
	}
}

// startFakeBroker serves broker over mutual TLS and returns a client TLS
// configuration for it.
func startFakeBroker(t *testing.T, broker *fakeBroker) (addr string, clientTLS *tlsconfig.ClientConfig) {
	t.Helper()
	addrs, clientTLS := startFakeBrokers(t, broker)
	return addrs[0], clientTLS
}

// startFakeBrokers serves each broker (replicas with one serving
// certificate) on its own address.
func startFakeBrokers(t *testing.T, brokers ...ferryv1.SyncServiceServer) (addrs []string, clientTLS *tlsconfig.ClientConfig) {
	t.Helper()
	dir := t.TempDir()
	ca, err := devpki.LoadOrCreateCA(dir, "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.IssueServer(dir, "broker", []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	if err := ca.IssueClient(dir, "edge", devpki.IdentityFor("edge")); err != nil {
		t.Fatal(err)
	}
	serverTLS, err := tlsconfig.Server(tlsconfig.Files{CertFile: devpki.CertFile(dir, "broker"), KeyFile: devpki.KeyFile(dir, "broker"),
		CAFile: filepath.Join(dir, devpki.CACertFile)}, tlsconfig.Profile{}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	clientTLS, err = tlsconfig.Client(tlsconfig.Files{CertFile: devpki.CertFile(dir, "edge"), KeyFile: devpki.KeyFile(dir, "edge"),
		CAFile: filepath.Join(dir, devpki.CACertFile)}, "", tlsconfig.Profile{})
	if err != nil {
		t.Fatal(err)
	}
	for _, broker := range brokers {
		srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(serverTLS)))
		ferryv1.RegisterSyncServiceServer(srv, broker)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() { _ = srv.Serve(lis) }()
		t.Cleanup(srv.Stop)
		addrs = append(addrs, lis.Addr().String())
	}
	return addrs, clientTLS
}

// TestRunCountsAttemptsAndTracksTheConnection runs the client against an
// in-process broker over mutual TLS: refused handshakes count as refused
// and never connect; an accepted one connects, counts once, and Connected
// follows the stream.
func TestRunCountsAttemptsAndTracksTheConnection(t *testing.T) {
	addr, clientTLS := startFakeBroker(t, &fakeBroker{refuse: 2})

	reg := prometheus.NewRegistry()
	m, err := metrics.NewEdge(reg)
	if err != nil {
		t.Fatal(err)
	}
	h := &fakeHandler{}
	c := New(Options{
		BrokerAddress: addr, TLS: clientTLS, AgentName: "edge",
		HeartbeatInterval: protocol.MinHeartbeatInterval, MaxMessageBytes: protocol.DefaultMaxMessageBytes,
		Backoff: &backoff.Exponential{Initial: time.Millisecond, Max: 5 * time.Millisecond},
		Handler: h, Log: logr.Discard(), Metrics: m,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()

	deadline := time.Now().Add(20 * time.Second)
	for !c.Connected() {
		if time.Now().After(deadline) {
			t.Fatal("never connected")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := attempts(t, reg); got["refused"] != 2 || got["accepted"] != 1 {
		t.Errorf("attempts %v, want 2 refused and 1 accepted", got)
	}
	if h.connects() != 1 {
		t.Errorf("handler saw %d connects, want 1", h.connects())
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run returned %v after its context ended, want nil", err)
	}
	if c.Connected() {
		t.Error("still connected after the stream ended")
	}
}

func TestRunKeepsTheBrokersRefusalUntilAccepted(t *testing.T) {
	revoked := status.Error(codes.Unauthenticated, `client certificate sha256:ab of identity "spiffe://x/edge" is revoked: leaked`)
	broker := &fakeBroker{revoked: revoked, end: make(chan error, 1)}
	addr, clientTLS := startFakeBroker(t, broker)
	c := New(Options{
		BrokerAddress: addr, TLS: clientTLS, AgentName: "edge",
		HeartbeatInterval: protocol.MinHeartbeatInterval, MaxMessageBytes: protocol.DefaultMaxMessageBytes,
		Backoff: &backoff.Exponential{Initial: time.Millisecond, Max: 5 * time.Millisecond},
		Handler: &fakeHandler{}, Log: logr.Discard(),
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	isRevoked := func() bool {
		err := c.Refusal()
		return status.Code(err) == codes.Unauthenticated && status.Convert(err).Message() == status.Convert(revoked).Message()
	}

	// Refused handshakes: the refusal is kept.
	waitFor("the refusal", isRevoked)
	if c.Connected() {
		t.Error("connected while refused")
	}
	// Accepted: no refusal any more.
	broker.setRevoked(nil)
	waitFor("the connection", c.Connected)
	if err := c.Refusal(); err != nil {
		t.Errorf("Refusal = %v while connected", err)
	}
	// An accepted stream the broker ends with the reason: kept again, also
	// while the reconnects are refused.
	broker.setRevoked(revoked)
	broker.end <- revoked
	waitFor("the ended stream's refusal", func() bool { return !c.Connected() && isRevoked() })
}

func attempts(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "ferry_edge_stream_attempts_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			out[s.GetLabel()[0].GetValue()] = s.GetCounter().GetValue()
		}
	}
	return out
}

// fakeBroker refuses the first refuse streams, and every stream while
// revoked is set, then accepts and holds the stream open until the client
// leaves or end ends it with a status, sending a heartbeat every heartbeat
// when that is not zero.
type fakeBroker struct {
	ferryv1.UnimplementedSyncServiceServer
	mu        sync.Mutex
	refuse    int
	revoked   error
	end       chan error
	heartbeat time.Duration
	// offerRenewal announces certificate renewal and answers every
	// CertificateRenewal with an (empty) IssuedCertificate.
	offerRenewal bool
	// helloCaps records the capabilities of every EdgeHello.
	helloCaps [][]ferryv1.Capability
}

func (b *fakeBroker) setRevoked(err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.revoked = err
}

func (b *fakeBroker) Connect(stream ferryv1.SyncService_ConnectServer) error {
	first, err := stream.Recv()
	if err != nil {
		return err
	}
	b.mu.Lock()
	refuse := b.refuse > 0
	b.refuse--
	revoked := b.revoked
	b.helloCaps = append(b.helloCaps, first.GetHello().GetCapabilities())
	b.mu.Unlock()
	if refuse {
		return status.Error(codes.PermissionDenied, "identity not configured")
	}
	if revoked != nil {
		return revoked
	}
	var caps []ferryv1.Capability
	if b.offerRenewal {
		caps = []ferryv1.Capability{ferryv1.Capability_CAPABILITY_CERTIFICATE_RENEWAL}
	}
	if err := stream.Send(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Hello{Hello: &ferryv1.BrokerHello{
		ProtocolVersion: protocol.Version, SessionId: "s1", HeartbeatInterval: durationpb.New(b.heartbeat), Capabilities: caps,
	}}}); err != nil {
		return err
	}
	// Heartbeats and renewal answers come from two goroutines; gRPC allows
	// one sender at a time.
	var sendMu sync.Mutex
	send := func(m *ferryv1.ConnectResponse) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(m)
	}
	if b.heartbeat > 0 {
		go func() {
			t := time.NewTicker(b.heartbeat)
			defer t.Stop()
			for {
				select {
				case <-stream.Context().Done():
					return
				case <-t.C:
					if send(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Heartbeat{Heartbeat: &ferryv1.Heartbeat{}}}) != nil {
						return
					}
				}
			}
		}()
	}
	left := make(chan struct{})
	go func() {
		defer close(left)
		for {
			msg, err := stream.Recv()
			if err != nil {
				return
			}
			if msg.GetCertificateRenewal() != nil {
				if send(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_IssuedCertificate{IssuedCertificate: &ferryv1.IssuedCertificate{}}}) != nil {
					return
				}
			}
		}
	}()
	select {
	case <-left:
		return nil
	case err := <-b.end:
		return err
	}
}

func (b *fakeBroker) hellos() [][]ferryv1.Capability {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.helloCaps)
}

type fakeHandler struct {
	mu        sync.Mutex
	connected int
	handled   []*ferryv1.ConnectResponse
	ready     chan struct{}
}

func (h *fakeHandler) Attach(*ferryv1.BrokerHello, Sink) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.connected++
}

func (h *fakeHandler) connects() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.connected
}

func (h *fakeHandler) Detach() {}

func (h *fakeHandler) Ready() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ready == nil {
		h.ready = make(chan struct{})
	}
	return h.ready
}

func (h *fakeHandler) Next() (*ferryv1.ConnectRequest, bool) { return nil, false }

func (h *fakeHandler) Handle(m *ferryv1.ConnectResponse) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.handled = append(h.handled, m)
	return nil
}

func (h *fakeHandler) TooLarge(*ferryv1.ConnectRequest, int, int) {}

// TestHeartbeatsKeepAnIdleStreamThroughAProxy runs the edge through an HTTP
// CONNECT proxy that closes tunnels idle for 2.5 s, as middleboxes with
// idle timeouts do. Nothing but heartbeats (1 s) crosses the stream; the
// HTTP/2 keepalive pings would come only after 30 s without traffic, so
// within the test only the application heartbeats can keep the tunnel
// open: the stream must outlive several idle timeouts on one connection.
func TestHeartbeatsKeepAnIdleStreamThroughAProxy(t *testing.T) {
	addr, clientTLS := startFakeBroker(t, &fakeBroker{heartbeat: time.Second})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	proxyLis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	const idle = 2500 * time.Millisecond
	proxy := connectproxy.New(connectproxy.Options{Auth: "edge:pw", IdleTimeout: idle, Log: logr.Discard()})
	proxyDone := make(chan struct{})
	go func() {
		defer close(proxyDone)
		_ = proxy.Serve(ctx, proxyLis)
	}()
	defer func() { cancel(); <-proxyDone }()
	dialer, err := proxydial.New(proxydial.Options{ProxyURL: "http://edge:pw@" + proxyLis.Addr().String()})
	if err != nil {
		t.Fatal(err)
	}

	h := &fakeHandler{}
	c := New(Options{
		BrokerAddress: addr, TLS: clientTLS, Dial: dialer.Dial, AgentName: "edge",
		HeartbeatInterval: time.Second, MaxMessageBytes: protocol.DefaultMaxMessageBytes,
		Backoff: &backoff.Exponential{Initial: time.Millisecond, Max: 5 * time.Millisecond},
		Handler: h, Log: logr.Discard(),
	})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	deadline := time.Now().Add(20 * time.Second)
	for !c.Connected() {
		if time.Now().After(deadline) {
			t.Fatal("never connected")
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(3 * idle)
	if !c.Connected() || h.connects() != 1 {
		t.Errorf("after %s idle: connected %v, %d connects; want the first stream still up", 3*idle, c.Connected(), h.connects())
	}
	if got := proxy.Counts(); got.Accepted != 1 || got.IdleClosed != 0 {
		t.Errorf("proxy counts %+v, want one tunnel, never closed for idleness", got)
	}
	stop()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// fakeRenewer renews once, on the first stream that offers it, then waits.
type fakeRenewer struct {
	mu      sync.Mutex
	runs    int
	answers chan *ferryv1.IssuedCertificate
}

func (r *fakeRenewer) Run(ctx context.Context, send func(*ferryv1.ConnectRequest) error) bool {
	r.mu.Lock()
	r.runs++
	first := r.runs == 1
	r.mu.Unlock()
	if !first {
		<-ctx.Done()
		return false
	}
	if err := send(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_CertificateRenewal{CertificateRenewal: &ferryv1.CertificateRenewal{}}}); err != nil {
		return false
	}
	select {
	case <-r.answers:
		return true
	case <-ctx.Done():
		return false
	}
}

func (r *fakeRenewer) Deliver(ic *ferryv1.IssuedCertificate) { r.answers <- ic }

// TestRenewalReconnectsOnceAtOnce: after a renewal the stream ends and the
// client reconnects at once (no backoff delay) exactly once; an edge with
// a renewer announces the capability, one without does not.
func TestRenewalReconnectsOnceAtOnce(t *testing.T) {
	broker := &fakeBroker{offerRenewal: true}
	addr, clientTLS := startFakeBroker(t, broker)
	reg := prometheus.NewRegistry()
	m, err := metrics.NewEdge(reg)
	if err != nil {
		t.Fatal(err)
	}
	h := &fakeHandler{}
	r := &fakeRenewer{answers: make(chan *ferryv1.IssuedCertificate, 1)}
	c := New(Options{
		BrokerAddress: addr, TLS: clientTLS, AgentName: "edge",
		HeartbeatInterval: protocol.MinHeartbeatInterval, MaxMessageBytes: protocol.DefaultMaxMessageBytes,
		// A reconnect that waited for the backoff would take a minute.
		Backoff: &backoff.Exponential{Initial: time.Minute, Max: time.Minute},
		Handler: h, Log: logr.Discard(), Metrics: m, Renewer: r,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(20 * time.Second)
	for h.connects() < 2 || !c.Connected() {
		if time.Now().After(deadline) {
			t.Fatalf("connects %d after a renewal, want a second one at once", h.connects())
		}
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // a further reconnect would show now
	if h.connects() != 2 || attempts(t, reg)["accepted"] != 2 {
		t.Errorf("connects %d, attempts %v; want exactly one reconnect for the renewal", h.connects(), attempts(t, reg))
	}
	for i, caps := range broker.hellos() {
		if !slices.Contains(caps, ferryv1.Capability_CAPABILITY_CERTIFICATE_RENEWAL) {
			t.Errorf("hello %d announced %v, want certificate renewal", i, caps)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	// Without a renewer (certificates from files) the capability is not
	// announced, and an IssuedCertificate is a protocol error.
	plain := &fakeBroker{}
	addr, clientTLS = startFakeBroker(t, plain)
	c = New(Options{
		BrokerAddress: addr, TLS: clientTLS, AgentName: "edge",
		HeartbeatInterval: protocol.MinHeartbeatInterval, MaxMessageBytes: protocol.DefaultMaxMessageBytes,
		Backoff: &backoff.Exponential{Initial: time.Millisecond, Max: time.Millisecond}, Handler: &fakeHandler{}, Log: logr.Discard(),
	})
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = c.Run(ctx) }()
	for len(plain.hellos()) == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	if caps := plain.hellos()[0]; slices.Contains(caps, ferryv1.Capability_CAPABILITY_CERTIFICATE_RENEWAL) {
		t.Errorf("an edge without a renewer announced %v", caps)
	}
	if err := c.handle(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_IssuedCertificate{IssuedCertificate: &ferryv1.IssuedCertificate{}}}); err == nil {
		t.Error("an unasked IssuedCertificate was accepted")
	}
}

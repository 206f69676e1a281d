package edgeload

import (
	"context"
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
	"google.golang.org/grpc/status"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/pkg/protocol"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// fakeBroker accepts every edge's handshake, except the first attempt of
// each identity when refuseFirst is set (FailedPrecondition, as the real
// broker refuses an export still held by the edge's previous stream), and
// keeps the stream until the edge ends it.
type fakeBroker struct {
	ferryv1.UnimplementedSyncServiceServer
	refuseFirst bool

	mu       sync.Mutex
	attempts map[string]int
}

func (b *fakeBroker) Connect(s ferryv1.SyncService_ConnectServer) error {
	msg, err := s.Recv()
	if err != nil {
		return err
	}
	hello := msg.GetHello()
	if hello == nil {
		return status.Error(codes.InvalidArgument, "first message is not a hello")
	}
	b.mu.Lock()
	b.attempts[hello.GetAgentName()]++
	n := b.attempts[hello.GetAgentName()]
	b.mu.Unlock()
	if b.refuseFirst && n == 1 {
		return status.Error(codes.FailedPrecondition, "APIExport already served")
	}
	err = s.Send(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Hello{Hello: &ferryv1.BrokerHello{
		ProtocolVersion:        protocol.Version,
		Identity:               hello.GetAgentName(),
		MaxReceiveMessageBytes: protocol.DefaultMaxMessageBytes,
		HeartbeatInterval:      hello.GetHeartbeatInterval(),
		BrokerEpoch:            1,
		SessionId:              "s",
	}}})
	if err != nil {
		return err
	}
	for {
		if _, err := s.Recv(); err != nil {
			return nil
		}
	}
}

// startFakeBroker serves b over mTLS with a development PKI in dir that
// holds client certificates for names.
func startFakeBroker(t *testing.T, b *fakeBroker, dir string, names []string) string {
	t.Helper()
	ca, err := devpki.LoadOrCreateCA(dir, "test CA")
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.IssueServer(dir, "broker", []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if err := ca.IssueClient(dir, n, devpki.IdentityFor(n)); err != nil {
			t.Fatal(err)
		}
	}
	tlsCfg, err := tlsconfig.Server(tlsconfig.Files{
		CertFile: devpki.CertFile(dir, "broker"), KeyFile: devpki.KeyFile(dir, "broker"), CAFile: filepath.Join(dir, devpki.CACertFile),
	}, tlsconfig.Profile{}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	b.attempts = map[string]int{}
	srv := grpc.NewServer(grpc.Creds(credentials.NewTLS(tlsCfg)))
	ferryv1.RegisterSyncServiceServer(srv, b)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func testFleet(t *testing.T, addr, dir string, names []string) *Fleet {
	t.Helper()
	var edges []*Edge
	for _, n := range names {
		tlsCfg, err := tlsconfig.Client(tlsconfig.Files{
			CertFile: devpki.CertFile(dir, n), KeyFile: devpki.KeyFile(dir, n), CAFile: filepath.Join(dir, devpki.CACertFile),
		}, "", tlsconfig.Profile{})
		if err != nil {
			t.Fatal(err)
		}
		edges = append(edges, NewEdge(EdgeOptions{
			Name: n, BrokerAddress: addr, TLS: tlsCfg, HeartbeatInterval: time.Second,
			BackoffInitial: 10 * time.Millisecond, BackoffMax: 50 * time.Millisecond,
			MaxMessageBytes: protocol.DefaultMaxMessageBytes, Log: logr.Discard(),
		}))
	}
	f := NewFleet(edges)
	t.Cleanup(f.Stop)
	return f
}

// TestFleetWaves runs a cold start and an edge storm against a broker that
// refuses every edge's first attempt: every edge connects, the refused
// attempts are counted as failed, and the edge storm (after the refusals)
// connects each edge with one attempt.
func TestFleetWaves(t *testing.T) {
	dir := t.TempDir()
	names := []string{"e-0", "e-1", "e-2"}
	addr := startFakeBroker(t, &fakeBroker{refuseFirst: true}, dir, names)
	f := testFleet(t, addr, dir, names)
	ctx := context.Background()

	m := f.Mark()
	f.Start(ctx)
	cold, err := f.Wait(ctx, "cold", m, 5*time.Second, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if cold.Accepted != 3 || cold.Attempts != 6 || cold.FailedAttempts != 3 || cold.MaxAttempts != 2 || cold.OverCap != 0 {
		t.Errorf("cold start wave = %+v; want 3 accepted after 6 attempts, 3 failed, 2 at most per edge, none over the cap", cold)
	}
	if got := f.Connected(); got != 3 {
		t.Errorf("%d edges connected; want 3", got)
	}

	storm, err := f.Wait(ctx, "storm", f.Drop(ctx), 5*time.Second, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if storm.Accepted != 3 || storm.Attempts != 3 || storm.FailedAttempts != 0 {
		t.Errorf("storm wave = %+v; want 3 accepted after 3 attempts", storm)
	}
	if storm.MaxSeconds < storm.P50Seconds || storm.HandshakesPerSecond <= 0 {
		t.Errorf("storm wave latencies inconsistent: %+v", storm)
	}
}

// TestFleetWaitTimesOut reports the edges not accepted when the broker
// never answers.
func TestFleetWaitTimesOut(t *testing.T) {
	dir := t.TempDir()
	names := []string{"e-0"}
	startFakeBroker(t, &fakeBroker{}, dir, names)
	// Nothing listens at this address.
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	f := testFleet(t, addr, dir, names)
	m := f.Mark()
	f.Start(context.Background())
	w, err := f.Wait(context.Background(), "cold", m, time.Second, 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "0 of 1 edges accepted") {
		t.Fatalf("err = %v; want 0 of 1 accepted", err)
	}
	if w.Accepted != 0 || w.Attempts == 0 || w.FailedAttempts != w.Attempts {
		t.Errorf("wave = %+v; want every attempt failed", w)
	}
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Second)
	}
	for _, tc := range []struct {
		p    float64
		want time.Duration
	}{{0.5, 50 * time.Second}, {0.99, 99 * time.Second}, {1, 100 * time.Second}, {0, time.Second}} {
		if got := percentile(d, tc.p); got != tc.want {
			t.Errorf("percentile(%v) = %v; want %v", tc.p, got, tc.want)
		}
	}
	if got := percentile(nil, 0.5); got != 0 {
		t.Errorf("percentile of nothing = %v", got)
	}
}

// TestReportTable checks the per-edge arithmetic and that every wave and
// sample is printed.
func TestReportTable(t *testing.T) {
	r := &Report{Edges: 100, Workspaces: 10, WorkspacesSetupSeconds: 12.5, Samples: []Sample{
		{At: "idle", RSSBytes: 40 << 20, HeapBytes: 5 << 20, Goroutines: 20},
		{At: "connected", Connected: 100, RSSBytes: 140 << 20, HeapBytes: 55 << 20, Goroutines: 7020},
	}, Steady: CPUWindow{Seconds: 60, Cores: map[string]float64{"broker": 0.05}},
		Waves: []Wave{{Name: "cold start", Edges: 100, Accepted: 100, Refusals: map[string]float64{"export_served_by_another_edge": 3}}}}
	p, ok := r.PerEdge()
	if !ok {
		t.Fatal("no per-edge figures")
	}
	if p.RSSBytes != 1<<20 || p.HeapBytes != 512<<10 || p.Goroutines != 70 || p.MilliCores != 0.5 {
		t.Errorf("per edge = %+v", p)
	}
	var sb strings.Builder
	if err := r.WriteTable(&sb); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"spread over 10 workspaces (created in 12.5s)", "idle", "connected", "cold start", "export_served_by_another_edge=3", "RSS 1024.0 KiB", "70.0 goroutines"} {
		if !strings.Contains(sb.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, sb.String())
		}
	}
	if strings.Contains(sb.String(), "traffic") {
		t.Errorf("a run without traffic prints traffic:\n%s", sb.String())
	}

	r.Traffic = &Traffic{Edges: 20, TargetObjectsPerSecond: 10, Seconds: 60, Writes: 600, Counts: TrafficCounts{Intents: 600, Reports: 590},
		IntentsPerSecond: 10, ReportsPerSecond: 9.8, RoundTrips: 600, RoundTripP50Seconds: 0.04, RoundTripP99Seconds: 0.25}
	sb.Reset()
	if err := r.WriteTable(&sb); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"every edge connected, 20 with traffic", "the generator wrote 600 objects in kcp (0 failed), 10.0/s for a target of 10/s",
		"10.0 intents/s (600, 0 refused), 9.8 reports/s (590)", "600 intents: p50 0.040s, p99 0.250s", "cold start"} {
		if !strings.Contains(sb.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, sb.String())
		}
	}
}

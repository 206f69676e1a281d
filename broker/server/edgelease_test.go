package server

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/kubernetes/fake"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/edgelease"
	"github.com/ferry-dev/ferry/broker/engine"
	"github.com/ferry-dev/ferry/broker/registry"
)

// countingEngine is an engine's error counts, set by the test.
type countingEngine struct {
	mu     sync.Mutex
	counts engine.ErrorCounts
}

func (e *countingEngine) ErrorCounts() engine.ErrorCounts {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.counts
}

func (e *countingEngine) set(c engine.ErrorCounts) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.counts = c
}

var (
	leaseEdgeA = config.Edge{Identity: "spiffe://test/edge-a", Name: "alpha", APIExport: exportA}
	leaseEdgeB = config.Edge{Identity: "spiffe://test/edge-b", Name: "beta", APIExport: config.APIExportRef{Workspace: "root:team", Name: "b.ferry.dev"}}
)

// leaseHarness runs edgeLeases on one fake clientset per workspace.
type leaseHarness struct {
	kcp    map[string]*fake.Clientset
	leases *edgeLeases
	stop   func()
	cancel context.CancelFunc
}

func startLeaseHarness(t *testing.T) *leaseHarness {
	t.Helper()
	h := &leaseHarness{kcp: map[string]*fake.Clientset{"root:org": fake.NewClientset(), "root:team": fake.NewClientset()}}
	clients := edgelease.ClientsFunc(func(ws string) (coordinationv1client.LeasesGetter, error) {
		cs, ok := h.kcp[ws]
		if !ok {
			return nil, fmt.Errorf("no workspace %s", ws)
		}
		return cs.CoordinationV1(), nil
	})
	h.leases = newEdgeLeases(Options{
		Config:          &config.Config{Edges: []config.Edge{leaseEdgeA, leaseEdgeB}},
		ShutdownTimeout: 5 * time.Second,
		Log:             testr.New(t),
		EdgeLeases:      EdgeLeaseOptions{Namespace: "default", RenewInterval: 20 * time.Millisecond, Clients: clients},
	})
	if h.leases == nil {
		t.Fatal("edge Leases are off")
	}
	ctx, cancel := context.WithCancel(context.Background())
	h.cancel = cancel
	h.stop = h.leases.start(ctx)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			cancel()
			h.stop()
		}
	})
	stop := h.stop
	h.stop = func() { stopped = true; stop() }
	return h
}

// lease returns edge's Lease as the fake kcp holds it, or nil.
func (h *leaseHarness) lease(edge config.Edge) *coordinationv1.Lease {
	obj, err := h.kcp[edge.APIExport.Workspace].Tracker().Get(coordinationv1.SchemeGroupVersion.WithResource("leases"), "default",
		edgelease.Name(edge.ResolvedName(), edge.Identity))
	if err != nil {
		return nil
	}
	return obj.(*coordinationv1.Lease)
}

// waitLease waits until edge's Lease satisfies ok.
func (h *leaseHarness) waitLease(t *testing.T, edge config.Edge, what string, ok func(*coordinationv1.Lease) bool) *coordinationv1.Lease {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l := h.lease(edge)
		if l != nil && ok(l) {
			return l
		}
		if time.Now().After(deadline) {
			t.Fatalf("Lease of %s never %s; last: %v", edge.Identity, what, l)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func state(l *coordinationv1.Lease) string { return l.Annotations[edgelease.AnnotationState] }

func testSession(edge config.Edge, id string, at time.Time) *registry.Session {
	return registry.NewSession(registry.Info{
		ID: id, Identity: edge.Identity, AgentName: "nora", EdgeVersion: "v0.9.0", Export: edge.APIExport,
		PeerAddress: "127.0.0.1:40000", ProtocolVersion: 1, ConnectedAt: at,
	}, func(error) {})
}

func TestEdgeLeasesFollowASession(t *testing.T) {
	h := startLeaseHarness(t)

	// Every configured edge has a Lease from the start.
	for _, e := range []config.Edge{leaseEdgeA, leaseEdgeB} {
		l := h.waitLease(t, e, "created", func(l *coordinationv1.Lease) bool { return state(l) == "Disconnected" })
		if r := l.Annotations[edgelease.AnnotationDisconnectReason]; r != edgelease.ReasonNotConnected {
			t.Errorf("%s: reason %q, want %q", e.Identity, r, edgelease.ReasonNotConnected)
		}
	}

	connectedAt := time.Now().Add(-time.Minute).Truncate(time.Second)
	sess := testSession(leaseEdgeA, "s1", connectedAt)
	eng := &countingEngine{counts: engine.ErrorCounts{Refused: 2}}
	ls := h.leases.connected(sess, leaseEdgeA, eng, 5*time.Millisecond)
	l := h.waitLease(t, leaseEdgeA, "Connected", func(l *coordinationv1.Lease) bool { return state(l) == "Connected" })
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != "nora" || !l.Spec.AcquireTime.Time.Equal(connectedAt) {
		t.Errorf("Connected Lease spec = %+v", l.Spec)
	}
	// Renewed every renewInterval (20ms, longer than the heartbeat): three
	// of those make the Lease's duration, rounded up to a second.
	if d := l.Spec.LeaseDurationSeconds; d == nil || *d != 1 {
		t.Errorf("leaseDurationSeconds = %v, want 1", d)
	}
	for k, want := range map[string]string{
		edgelease.AnnotationEdgeVersion: "v0.9.0", edgelease.AnnotationSessionID: "s1", edgelease.AnnotationRefusedMessages: "2",
		edgelease.AnnotationPeerAddress: "127.0.0.1:40000", edgelease.AnnotationProtocolVersion: "1",
	} {
		if got := l.Annotations[k]; got != want {
			t.Errorf("annotation %s = %q, want %q", k, got, want)
		}
	}

	// The edge's messages move renewTime; the engine's nack counts follow.
	eng.set(engine.ErrorCounts{Refused: 2, Nacks: 3, LastError: "INVALID: spec.size: must be positive"})
	seen := connectedAt.Add(30 * time.Second)
	sess.Seen(seen)
	h.waitLease(t, leaseEdgeA, "renewed with the last message and the nacks", func(l *coordinationv1.Lease) bool {
		return l.Spec.RenewTime.Time.Equal(seen) && l.Annotations[edgelease.AnnotationNacks] == "3" &&
			l.Annotations[edgelease.AnnotationLastError] == "INVALID: spec.size: must be positive"
	})

	ls.disconnected(nil)
	l = h.waitLease(t, leaseEdgeA, "Disconnected", func(l *coordinationv1.Lease) bool { return state(l) == "Disconnected" })
	if l.Spec.HolderIdentity != nil {
		t.Errorf("holderIdentity = %q after the disconnect", *l.Spec.HolderIdentity)
	}
	if l.Annotations[edgelease.AnnotationDisconnectReason] != "edge closed the stream" || l.Annotations[edgelease.AnnotationNacks] != "3" ||
		l.Annotations[edgelease.AnnotationEdgeVersion] != "v0.9.0" {
		t.Errorf("Disconnected annotations = %v", l.Annotations)
	}
	// No renewal after the disconnect.
	rv := l.ResourceVersion
	time.Sleep(100 * time.Millisecond)
	if l := h.lease(leaseEdgeA); l.ResourceVersion != rv || state(l) != "Disconnected" {
		t.Errorf("the Lease changed after the disconnect: %v", l)
	}
	// The other edge never connected.
	if l := h.lease(leaseEdgeB); state(l) != "Disconnected" || l.Spec.HolderIdentity != nil {
		t.Errorf("the other edge's Lease = %v", l)
	}
}

func TestEdgeLeasesShutdownWritesDisconnected(t *testing.T) {
	h := startLeaseHarness(t)
	ls := h.leases.connected(testSession(leaseEdgeB, "s7", time.Now()), leaseEdgeB, &countingEngine{}, time.Second)
	h.waitLease(t, leaseEdgeB, "Connected", func(l *coordinationv1.Lease) bool { return state(l) == "Connected" })

	// As Serve does: the broker's context ends, the stream ends, then stop.
	h.cancel()
	ls.disconnected(status.Error(codes.Unavailable, registry.ErrClosed.Error()))
	h.stop()
	l := h.lease(leaseEdgeB)
	if state(l) != "Disconnected" || l.Annotations[edgelease.AnnotationDisconnectReason] != "the broker is shutting down" {
		t.Errorf("after shutdown the Lease shows %v", l.Annotations)
	}
}

func TestEdgeLeasesOff(t *testing.T) {
	for name, o := range map[string]Options{
		"no namespace": {Config: &config.Config{Edges: []config.Edge{leaseEdgeA}}, EdgeLeases: EdgeLeaseOptions{RenewInterval: time.Second}},
		"no config":    {EdgeLeases: EdgeLeaseOptions{Namespace: "default"}},
	} {
		t.Run(name, func(t *testing.T) {
			l := newEdgeLeases(o)
			if l != nil {
				t.Fatal("edge Leases are on")
			}
			// Every hook is a no-op.
			l.start(context.Background())()
			s := l.connected(testSession(leaseEdgeA, "s1", time.Now()), leaseEdgeA, &countingEngine{}, time.Second)
			s.disconnected(nil)
		})
	}
}

func TestDisconnectReason(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want string
	}{
		{name: "edge closed the stream", err: nil, want: "edge closed the stream"},
		{name: "edge cancelled", err: status.Error(codes.Canceled, "context canceled"), want: ReasonStreamCanceled},
		{name: "silent edge", err: status.Error(codes.Unavailable, "no message from the edge for 3s"), want: "no message from the edge for 3s"},
		{name: "shutdown", err: status.Error(codes.Unavailable, registry.ErrClosed.Error()), want: "the broker is shutting down"},
		{name: "plain error", err: fmt.Errorf("send: %w", context.DeadlineExceeded), want: "send: context deadline exceeded"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := disconnectReason(tt.err); got != tt.want {
				t.Errorf("disconnectReason(%v) = %q, want %q", tt.err, got, tt.want)
			}
		})
	}
}

// A broker restarting with 50 configured edges in one workspace, whose
// Leases exist, lists that workspace's Leases once and reads none of them.
func TestEdgeLeasesStartListsTheWorkspaceOnce(t *testing.T) {
	cs := fake.NewClientset()
	clients := edgelease.ClientsFunc(func(string) (coordinationv1client.LeasesGetter, error) { return cs.CoordinationV1(), nil })
	cfg := &config.Config{}
	for i := range 50 {
		cfg.Edges = append(cfg.Edges, config.Edge{
			Identity: fmt.Sprintf("spiffe://test/edge-%d", i), Name: fmt.Sprintf("edge-%d", i),
			APIExport: config.APIExportRef{Workspace: "root:org", Name: fmt.Sprintf("e%d.ferry.dev", i)},
		})
	}
	startAndStop := func() {
		l := newEdgeLeases(Options{
			Config: cfg, ShutdownTimeout: 5 * time.Second, Log: testr.New(t),
			EdgeLeases: EdgeLeaseOptions{Namespace: "default", Clients: clients},
		})
		ctx, cancel := context.WithCancel(context.Background())
		stop := l.start(ctx)
		cancel()
		stop() // flushes the initial statuses
	}
	startAndStop() // the first start creates the Leases
	if n := len(cs.Actions()); n < 50 {
		t.Fatalf("the first start made %d requests, want a create per edge", n)
	}
	cs.ClearActions()

	startAndStop()
	var verbs []string
	for _, a := range cs.Actions() {
		verbs = append(verbs, a.GetVerb())
	}
	if len(verbs) != 1 || verbs[0] != "list" {
		t.Errorf("requests at the restart = %v, want one list", verbs)
	}
}

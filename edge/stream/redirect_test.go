package stream

import (
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/backoff"
	"github.com/ferry-dev/ferry/pkg/metrics"
	"github.com/ferry-dev/ferry/pkg/protocol"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// redirectingBroker is a replica that does not own the edge's APIExport:
// it sends every stream to owner.
type redirectingBroker struct {
	ferryv1.UnimplementedSyncServiceServer
	owner *atomic.Pointer[string]
	calls atomic.Int32
}

func (b *redirectingBroker) Connect(stream ferryv1.SyncService_ConnectServer) error {
	if _, err := stream.Recv(); err != nil {
		return err
	}
	b.calls.Add(1)
	return protocol.RedirectError("root:org/things.example.com", *b.owner.Load())
}

func newRedirectClient(t *testing.T, addr string, clientTLS *tlsconfig.ClientConfig, initialBackoff time.Duration) (*Client, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := metrics.NewEdge(reg)
	if err != nil {
		t.Fatal(err)
	}
	c := New(Options{
		BrokerAddress: addr, TLS: clientTLS, AgentName: "edge",
		HeartbeatInterval: protocol.MinHeartbeatInterval, MaxMessageBytes: protocol.DefaultMaxMessageBytes,
		Backoff: &backoff.Exponential{Initial: initialBackoff, Max: initialBackoff},
		Handler: &fakeHandler{}, Log: logr.Discard(), Metrics: m,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return c, reg
}

// TestRedirectGoesToTheOwnerAtOnce: a replica that does not own the
// export names the owner; the edge connects there at once — no backoff
// (an hour here), no operator.
func TestRedirectGoesToTheOwnerAtOnce(t *testing.T) {
	owner := &fakeBroker{}
	to := &atomic.Pointer[string]{}
	replica := &redirectingBroker{owner: to}
	addrs, clientTLS := startFakeBrokers(t, replica, owner)
	// The owner's address is a name its certificate does not carry (its
	// pod's address): the edge verifies it as the broker it was
	// configured with, whose certificate every replica shares.
	_, port, _ := net.SplitHostPort(addrs[1])
	ownerAddr := net.JoinHostPort("localhost", port)
	to.Store(&ownerAddr)

	c, reg := newRedirectClient(t, addrs[0], clientTLS, time.Hour)
	deadline := time.Now().Add(10 * time.Second)
	for !c.Connected() {
		if time.Now().After(deadline) {
			t.Fatalf("not connected to the owner; attempts %v", attempts(t, reg))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := attempts(t, reg); got["redirected"] != 1 || got["accepted"] != 1 {
		t.Errorf("attempts %v, want 1 redirected and 1 accepted", got)
	}
	if n := replica.calls.Load(); n != 1 {
		t.Errorf("the non-owner saw %d streams, want 1", n)
	}
}

// TestRedirectToAnUnreachableOwnerFallsBack: the named owner is gone (it
// died; its Lease has not expired yet): after that one attempt the edge
// goes back to its configured address, with the backoff, not round in a
// circle of redirects at full speed.
func TestRedirectToAnUnreachableOwnerFallsBack(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := lis.Addr().String()
	_ = lis.Close()
	to := &atomic.Pointer[string]{}
	to.Store(&dead)
	replica := &redirectingBroker{owner: to}
	addrs, clientTLS := startFakeBrokers(t, replica)

	const delay = 200 * time.Millisecond
	_, reg := newRedirectClient(t, addrs[0], clientTLS, delay)
	deadline := time.Now().Add(10 * time.Second)
	for replica.calls.Load() < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("the edge did not come back to its configured address; non-owner saw %d streams", replica.calls.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	got := attempts(t, reg)
	if got["redirected"] < 2 || got["failed"] < 2 {
		t.Errorf("attempts %v, want redirects each followed by a failed attempt at the dead owner", got)
	}
}

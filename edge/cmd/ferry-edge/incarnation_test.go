package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

func TestRestartAfter(t *testing.T) {
	live := context.Background()
	stopped, cancel := context.WithCancel(context.Background())
	cancel()
	lost := fmt.Errorf("%w (the lease was last renewed 10s ago): %w", errLeadershipLost, errors.New("leader election lost"))
	for _, tt := range []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"lost leadership", live, lost, true},
		{"lost leadership, wrapped again", live, fmt.Errorf("incarnation 3: %w", lost), true},
		{"lost leadership while stopping", stopped, lost, false},
		{"other error", live, errors.New("failed to start caches"), false},
		{"message alone is not enough", live, errors.New("leader election lost"), false},
		{"clean stop", stopped, nil, false},
		{"nil while running", live, nil, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := restartAfter(tt.ctx, tt.err); got != tt.want {
				t.Errorf("restartAfter(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

// stubLock is a resourcelock.Interface whose writes fail on demand.
type stubLock struct {
	resourcelock.Interface // nil: only the methods below are called
	id                     string
	fail                   bool
}

func (s *stubLock) Create(context.Context, resourcelock.LeaderElectionRecord) error { return s.err() }
func (s *stubLock) Update(context.Context, resourcelock.LeaderElectionRecord) error { return s.err() }
func (s *stubLock) Identity() string                                                { return s.id }
func (s *stubLock) err() error {
	if s.fail {
		return errors.New("connection refused")
	}
	return nil
}

func TestObservedLockLost(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1000, 0)
	stub := &stubLock{id: "me"}
	l := &observedLock{Interface: stub, now: func() time.Time { return now }}
	const deadline = 10 * time.Second
	ours := resourcelock.LeaderElectionRecord{HolderIdentity: "me"}

	if _, lost := l.lost(deadline); lost {
		t.Fatal("lost before ever holding the lease")
	}
	now = now.Add(time.Hour)
	if _, lost := l.lost(deadline); lost {
		t.Fatal("lost without ever holding the lease, however long")
	}
	if err := l.Create(ctx, ours); err != nil {
		t.Fatal(err)
	}
	now = now.Add(deadline - time.Millisecond)
	if _, lost := l.lost(deadline); lost {
		t.Fatal("lost within the renew deadline")
	}
	// A release (empty holder), someone else's record and failed writes are
	// no renewals.
	_ = l.Update(ctx, resourcelock.LeaderElectionRecord{})
	_ = l.Update(ctx, resourcelock.LeaderElectionRecord{HolderIdentity: "other"})
	stub.fail = true
	if err := l.Update(ctx, ours); err == nil {
		t.Fatal("the stub's failure was swallowed")
	}
	now = now.Add(time.Millisecond)
	if age, lost := l.lost(deadline); !lost || age != deadline {
		t.Fatalf("lost = %v after %s without renewal, want true after %s", lost, age, deadline)
	}
	stub.fail = false
	if err := l.Update(ctx, ours); err != nil {
		t.Fatal(err)
	}
	if age, lost := l.lost(deadline); lost || age != 0 {
		t.Fatalf("lost = %v (age %s) right after a renewal", lost, age)
	}
}

// TestLeaseOutage runs client-go's elector against a fake API server that
// goes away: when the elector gives up, the lock must report the loss (the
// claim runIncarnation relies on), and a new elector with the same identity
// must lead again at once while the old Lease is still valid — a different
// identity would have to wait out the lease duration.
func TestLeaseOutage(t *testing.T) {
	const (
		leaseDuration = time.Minute // outlives the test: only the identity lets the next term start
		renewDeadline = time.Second
		retryPeriod   = 100 * time.Millisecond
	)
	client := fake.NewClientset()
	var down atomic.Bool
	client.PrependReactor("*", "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
		if down.Load() {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	newLock := func(t *testing.T, id string) *observedLock {
		t.Helper()
		rl, err := resourcelock.New(resourcelock.LeasesResourceLock, "ferry-system", "ferry-edge-test",
			client.CoreV1(), client.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
		if err != nil {
			t.Fatal(err)
		}
		return &observedLock{Interface: rl}
	}
	type term struct {
		started, stopped chan struct{}
		lostAtStop       atomic.Bool
		cancel           context.CancelFunc
	}
	elect := func(t *testing.T, lock *observedLock) *term {
		t.Helper()
		tm := &term{started: make(chan struct{}), stopped: make(chan struct{})}
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod,
			ReleaseOnCancel: true, Name: "test",
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(context.Context) { close(tm.started) },
				OnStoppedLeading: func() {
					_, lost := lock.lost(renewDeadline)
					tm.lostAtStop.Store(lost)
					close(tm.stopped)
				},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		var ctx context.Context
		ctx, tm.cancel = context.WithCancel(context.Background())
		t.Cleanup(func() {
			tm.cancel()
			<-tm.stopped
		})
		go le.Run(ctx)
		return tm
	}
	waitFor := func(t *testing.T, ch <-chan struct{}, d time.Duration, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(d):
			t.Fatalf("%s within %s", what, d)
		}
	}

	const id = "host_1234"
	lock := newLock(t, id)
	first := elect(t, lock)
	waitFor(t, first.started, 5*time.Second, "the first term did not lead")
	if _, lost := lock.lost(renewDeadline); lost {
		t.Fatal("lost while the API server is up")
	}

	down.Store(true)
	outage := time.Now()
	waitFor(t, first.stopped, 10*renewDeadline, "the elector did not give up")
	if !first.lostAtStop.Load() {
		t.Fatalf("the elector gave up after %s, but the lock does not report the loss", time.Since(outage))
	}
	down.Store(false)

	// Someone else must wait: the Lease still names the first term's
	// identity and is valid for most of a minute.
	other := elect(t, newLock(t, "other-host_5678"))
	select {
	case <-other.started:
		t.Fatal("another identity took over a valid lease")
	case <-time.After(5 * retryPeriod):
	}
	other.cancel()
	<-other.stopped

	back := time.Now()
	second := elect(t, newLock(t, id))
	waitFor(t, second.started, 2*time.Second, "the same identity did not lead again at once")
	t.Logf("the same identity led again %s after the API server returned", time.Since(back).Round(time.Millisecond))
}

func TestStopGate(t *testing.T) {
	var g stopGate
	release := make(chan struct{})
	running := make(chan struct{})
	go func() {
		_ = g.run(context.Background(), func(context.Context) error {
			close(running)
			<-release
			return nil
		})
	}()
	<-running

	short, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := g.closeAndWait(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("closeAndWait returned %v while a function runs, want a deadline error", err)
	}
	// Closed: a late start does not run.
	called := false
	if err := g.run(context.Background(), func(context.Context) error { called = true; return errors.New("ran") }); err != nil || called {
		t.Fatalf("a function ran after the gate closed (err %v)", err)
	}
	close(release)
	if err := g.closeAndWait(context.Background()); err != nil {
		t.Fatalf("closeAndWait after the function returned: %v", err)
	}
}

func TestAwaitAPIServer(t *testing.T) {
	var ready atomic.Bool
	var probes atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		if probes.Add(1) >= 3 {
			ready.Store(true)
		}
		if !ready.Load() {
			http.Error(w, "[-]etcd failed", http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	defer srv.Close()
	c, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := awaitAPIServer(ctx, c.Discovery().RESTClient(), logr.Discard()); err != nil {
		t.Fatalf("awaitAPIServer: %v after %d probes", err, probes.Load())
	}
	if n := probes.Load(); n != 3 {
		t.Errorf("returned after %d probes, want 3 (the first ready one)", n)
	}

	// Gone for good: it returns when its context ends.
	srv.Close()
	stopCtx, stop := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer stop()
	if err := awaitAPIServer(stopCtx, c.Discovery().RESTClient(), logr.Discard()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("awaitAPIServer against a closed server returned %v, want the context's error", err)
	}
}

// TestLeaderIdentity: a configured identity (the pod name) is used as is, so
// a restarted replica takes its Lease back; without one every process gets
// an identity of its own.
func TestLeaderIdentity(t *testing.T) {
	got, err := leaderIdentity("ferry-edge-7d9c5-x2x4q")
	if err != nil || got != "ferry-edge-7d9c5-x2x4q" {
		t.Errorf("configured identity: got %q, %v", got, err)
	}
	a, errA := leaderIdentity("")
	b, errB := leaderIdentity("")
	host, _ := os.Hostname()
	if errA != nil || errB != nil || a == b || !strings.HasPrefix(a, host+"_") {
		t.Errorf("without a configured identity: got %q and %q (%v, %v); want two different %s_<random>", a, b, errA, errB, host)
	}
}

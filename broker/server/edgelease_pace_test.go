package server

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/go-logr/logr/testr"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/kubernetes/fake"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/edgelease"
)

func TestRenewPeriod(t *testing.T) {
	tests := []struct {
		name                string
		heartbeat, interval time.Duration
		perSecond           float64
		n                   int64
		want                time.Duration
	}{
		{name: "few edges: the renew interval", heartbeat: 10 * time.Second, interval: 10 * time.Second, perSecond: 50, n: 100, want: 10 * time.Second},
		{name: "500 edges at 50/s: still 10 s", heartbeat: 10 * time.Second, interval: 10 * time.Second, perSecond: 50, n: 500, want: 10 * time.Second},
		{name: "1,000 edges at 50/s: 20 s", heartbeat: 10 * time.Second, interval: 10 * time.Second, perSecond: 50, n: 1000, want: 20 * time.Second},
		{name: "3,000 edges at 50/s: 60 s", heartbeat: 10 * time.Second, interval: 10 * time.Second, perSecond: 50, n: 3000, want: time.Minute},
		{name: "unbounded", heartbeat: 10 * time.Second, interval: 10 * time.Second, perSecond: 0, n: 1_000_000, want: 10 * time.Second},
		{name: "a longer heartbeat", heartbeat: 30 * time.Second, interval: 10 * time.Second, perSecond: 50, n: 1000, want: 30 * time.Second},
		{name: "a shorter heartbeat", heartbeat: time.Second, interval: 10 * time.Second, perSecond: 50, n: 10, want: 10 * time.Second},
		{name: "a fraction a second", heartbeat: time.Second, interval: time.Second, perSecond: 0.5, n: 10, want: 20 * time.Second},
		{name: "no edge", heartbeat: 10 * time.Second, interval: 10 * time.Second, perSecond: 50, n: 0, want: 10 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := renewPeriod(tt.heartbeat, tt.interval, tt.perSecond, tt.n); got != tt.want {
				t.Errorf("renewPeriod(%s, %s, %v, %d) = %s, want %s", tt.heartbeat, tt.interval, tt.perSecond, tt.n, got, tt.want)
			}
		})
	}
}

// With renewals bounded to one every 10 s for all edges together, each
// connected edge's Lease is renewed every max(10 s, connected edges × 10 s),
// computed at each renewal; each write lasts three of the period that
// follows it, so no Lease of a connected edge ever looks expired; connects
// are written at once.
func TestEdgeLeaseRenewalsArePaced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const heartbeat = 10 * time.Second
		cs := fake.NewClientset()
		clients := edgelease.ClientsFunc(func(string) (coordinationv1client.LeasesGetter, error) { return cs.CoordinationV1(), nil })
		var edges []config.Edge
		for i := range 3 {
			edges = append(edges, config.Edge{
				Identity: fmt.Sprintf("spiffe://test/paced-%d", i), Name: fmt.Sprintf("paced-%d", i),
				APIExport: config.APIExportRef{Workspace: "root:org", Name: fmt.Sprintf("p%d.ferry.dev", i)},
			})
		}
		l := newEdgeLeases(Options{
			Config: &config.Config{Edges: edges}, ShutdownTimeout: time.Second, Log: testr.New(t),
			EdgeLeases: EdgeLeaseOptions{Namespace: "default", RenewInterval: heartbeat, RenewalsPerSecond: 0.1, Clients: clients},
		})
		ctx, cancel := context.WithCancel(t.Context())
		stopLeases := l.start(ctx)
		lease := func(e config.Edge) *coordinationv1.Lease {
			obj, err := cs.Tracker().Get(coordinationv1.SchemeGroupVersion.WithResource("leases"), "default", edgelease.Name(e.ResolvedName(), e.Identity))
			if err != nil {
				t.Fatalf("Lease of %s: %v", e.Identity, err)
			}
			return obj.(*coordinationv1.Lease)
		}
		duration := func(e config.Edge) time.Duration {
			synctest.Wait() // the writer wrote what was set
			return time.Duration(*lease(e).Spec.LeaseDurationSeconds) * time.Second
		}
		// updates counts the updates of the Leases of edges (all: none).
		updates := func(edges ...config.Edge) int {
			names := map[string]bool{}
			for _, e := range edges {
				names[edgelease.Name(e.ResolvedName(), e.Identity)] = true
			}
			n := 0
			for _, a := range cs.Actions() {
				if u, ok := a.(k8stesting.UpdateAction); ok && a.GetResource().Resource == "leases" {
					if len(names) == 0 || names[u.GetObject().(*coordinationv1.Lease).Name] {
						n++
					}
				}
			}
			return n
		}
		// connect starts a session heard every heartbeat until it ends.
		type conn struct {
			s    *edgeLeaseSession
			quit chan struct{}
		}
		connect := func(e config.Edge) conn {
			sess := testSession(e, "s-"+e.Name, time.Now())
			c := conn{s: l.connected(sess, e, &countingEngine{}, heartbeat), quit: make(chan struct{})}
			go func() {
				tick := time.NewTicker(heartbeat)
				defer tick.Stop()
				for {
					select {
					case <-c.quit:
						return
					case <-tick.C:
						sess.Seen(time.Now())
					}
				}
			}()
			return c
		}
		end := func(c conn) {
			close(c.quit)
			c.s.disconnected(nil)
		}
		synctest.Wait()

		a := connect(edges[0]) // 1 connected: every 10 s
		if d := duration(edges[0]); d != 30*time.Second {
			t.Errorf("first edge connected alone: Lease duration %s, want 30s", d)
		}
		b := connect(edges[1]) // 2 connected: every 20 s
		if d := duration(edges[1]); d != time.Minute {
			t.Errorf("second edge: Lease duration %s, want 1m0s", d)
		}
		updatesB := updates(edges[1])
		time.Sleep(heartbeat + time.Second) // t=11s: the first edge's renewal counts 2 edges now
		if d := duration(edges[0]); d != time.Minute {
			t.Errorf("first edge's renewal with 2 edges connected: Lease duration %s, want 1m0s", d)
		}
		time.Sleep(8 * time.Second) // t=19s
		synctest.Wait()
		if n := updates(edges[1]); n != updatesB {
			t.Error("the second edge's Lease was renewed before its 20 s period")
		}
		time.Sleep(2 * time.Second) // t=21s
		if d, n := duration(edges[1]), updates(edges[1]); n != updatesB+1 || d != time.Minute {
			t.Errorf("the second edge's renewal at 20 s: %d update(s), Lease duration %s; want 1 update, 1m0s", n-updatesB, d)
		}
		c := connect(edges[2]) // 3 connected, written at once: every 30 s
		if d := duration(edges[2]); d != 90*time.Second {
			t.Errorf("third edge: Lease duration %s, want 1m30s", d)
		}
		time.Sleep(time.Second) // t=22s
		end(c)                  // back to 2: every 20 s
		synctest.Wait()
		if s := lease(edges[2]).Annotations[edgelease.AnnotationState]; s != string(edgelease.Disconnected) {
			t.Errorf("third edge after its disconnect: %s", s)
		}

		// From t=101 s to t=201 s the two edges renew every 20 s: the first
		// at 110, 130, …, 190, the second at 120, 140, …, 200. Never is a
		// connected edge's Lease expired.
		time.Sleep(79 * time.Second) // t=101s
		synctest.Wait()
		before := updates()
		for range 100 {
			time.Sleep(time.Second)
			synctest.Wait()
			for _, e := range edges[:2] {
				l := lease(e)
				if expiry := l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second); !expiry.After(time.Now()) {
					t.Fatalf("%s: the Lease of a connected edge expired at %s", e.Name, expiry)
				}
			}
		}
		if got := updates() - before; got != 10 {
			t.Errorf("%d renewals of 2 edges in 100 s, want 10 (one every 20 s each)", got)
		}
		if d := duration(edges[0]); d != time.Minute {
			t.Errorf("Lease duration with 2 edges connected: %s, want 1m0s", d)
		}

		end(a)
		end(b)
		cancel()
		stopLeases()
	})
}

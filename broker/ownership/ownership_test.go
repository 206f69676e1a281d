package ownership

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"

	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/kcp"
)

var export = config.APIExportRef{Workspace: "root:provider", Name: "databases.example.com"}

// replica is one broker replica's Owners over the shared fake kcp; down
// makes its Lease writes fail (a replica cut off from kcp, or killed: it
// renews no more).
type replica struct {
	*Owners
	down *atomic.Bool
}

func newReplica(t *testing.T, kube *fake.Clientset, identity string) replica {
	t.Helper()
	down := &atomic.Bool{}
	leases := kcp.LeasesClientsFunc(func(workspace string) (coordinationv1client.LeasesGetter, error) {
		if workspace != export.Workspace {
			t.Errorf("Leases of workspace %s, want the export's %s", workspace, export.Workspace)
		}
		return cutOff{LeasesGetter: kube.CoordinationV1(), down: down}, nil
	})
	o, err := New(Options{Leases: leases, Namespace: "ferry-system", Identity: identity,
		LeaseDuration: 1 * time.Second, RenewDeadline: 600 * time.Millisecond, RetryPeriod: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(o.Close)
	return replica{Owners: o, down: down}
}

// cutOff fails every Lease request while down is set.
type cutOff struct {
	coordinationv1client.LeasesGetter
	down *atomic.Bool
}

func (c cutOff) Leases(ns string) coordinationv1client.LeaseInterface {
	return failing{LeaseInterface: c.LeasesGetter.Leases(ns), down: c.down}
}

type failing struct {
	coordinationv1client.LeaseInterface
	down *atomic.Bool
}

var errCutOff = errors.New("kcp unreachable")

func (f failing) Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	if f.down.Load() {
		return nil, errCutOff
	}
	return f.LeaseInterface.Get(ctx, name, opts)
}

func (f failing) Create(ctx context.Context, l *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	if f.down.Load() {
		return nil, errCutOff
	}
	return f.LeaseInterface.Create(ctx, l, opts)
}

func (f failing) Update(ctx context.Context, l *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	if f.down.Load() {
		return nil, errCutOff
	}
	return f.LeaseInterface.Update(ctx, l, opts)
}

func claim(t *testing.T, r replica) (*Held, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return r.Claim(ctx, export, export.Workspace)
}

func TestOneOwnerAndTheOthersAreSentToIt(t *testing.T) {
	kube := fake.NewClientset()
	a, b := newReplica(t, kube, "broker-0:8443"), newReplica(t, kube, "broker-1:8443")

	held, err := claim(t, a)
	if err != nil {
		t.Fatalf("the first replica does not get the free export: %v", err)
	}
	if again, err := claim(t, a); err != nil || again != held {
		t.Fatalf("the owner's second claim: %v (same ownership %t)", err, again == held)
	}
	_, err = claim(t, b)
	var elsewhere *ElsewhereError
	if !errors.As(err, &elsewhere) || elsewhere.Owner != "broker-0:8443" {
		t.Fatalf("the second replica's claim: %v, want it sent to broker-0:8443", err)
	}
	lease, err := kube.CoordinationV1().Leases("ferry-system").Get(context.Background(), LeaseName(export.Name), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := *lease.Spec.HolderIdentity; got != "broker-0:8443" {
		t.Errorf("the Lease is held by %q", got)
	}
}

func TestReleaseHandsOverAtOnce(t *testing.T) {
	kube := fake.NewClientset()
	a, b := newReplica(t, kube, "broker-0:8443"), newReplica(t, kube, "broker-1:8443")
	held, err := claim(t, a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := claim(t, b); err == nil {
		t.Fatal("two owners")
	}
	start := time.Now()
	held.Release()
	select {
	case <-held.Context().Done():
	case <-time.After(time.Second):
		t.Fatal("the released ownership's context is not cancelled")
	}
	// b keeps competing (it claimed a moment ago): it takes over without
	// waiting out the lease duration.
	var got *Held
	for got == nil {
		if time.Since(start) > 900*time.Millisecond {
			t.Fatalf("no hand-over within the lease duration: %v", err)
		}
		got, err = claim(t, b)
		if got == nil {
			time.Sleep(20 * time.Millisecond)
		}
	}
	if _, err := claim(t, a); err == nil {
		t.Fatal("the replica that released still owns the export")
	}
}

// TestAnOwnerCutOffStopsBeforeAnotherStarts: the fencing. An owner that
// cannot renew cancels its context within the renew deadline; the other
// replica takes over only after the lease duration, later.
func TestAnOwnerCutOffStopsBeforeAnotherStarts(t *testing.T) {
	kube := fake.NewClientset()
	a, b := newReplica(t, kube, "broker-0:8443"), newReplica(t, kube, "broker-1:8443")
	held, err := claim(t, a)
	if err != nil {
		t.Fatal(err)
	}
	a.down.Store(true)
	cut := time.Now()
	stoppedAt := make(chan time.Time, 1)
	go func() {
		<-held.Context().Done()
		stoppedAt <- time.Now()
	}()
	var taken *Held
	for taken == nil {
		if time.Since(cut) > 4*time.Second {
			t.Fatal("no replica took the export over")
		}
		if taken, err = claim(t, b); taken == nil {
			time.Sleep(50 * time.Millisecond)
		}
	}
	took := time.Now()
	var stopped time.Time
	select {
	case stopped = <-stoppedAt:
	default:
	}
	if stopped.IsZero() || !stopped.Before(took) {
		t.Fatalf("the cut-off owner stopped at %v, the new owner started at %v: they overlapped", stopped.Sub(cut), took.Sub(cut))
	}
}

func TestLeaseName(t *testing.T) {
	if got := LeaseName("Databases.example.com"); got != "ferry-owner-databases.example.com" {
		t.Errorf("LeaseName = %s", got)
	}
	long := strings.Repeat("a", 250)
	if got := LeaseName(long); len(got) > 253 || !strings.HasPrefix(got, "ferry-owner-") {
		t.Errorf("LeaseName of a long name = %s (%d characters)", got, len(got))
	}
}

package ownership

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	k8stesting "k8s.io/client-go/testing"

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
	return newReplicaCounting(t, kube, identity, nil)
}

// replicaWorkspace holds the replica Leases in the tests.
const replicaWorkspace = "root:ferry"

// newReplicaCounting is newReplica whose Lease writes are counted in
// writes (nil: not counted).
func newReplicaCounting(t *testing.T, kube *fake.Clientset, identity string, writes *atomic.Int64) replica {
	t.Helper()
	return newReplicaCountingReads(t, kube, identity, writes, nil)
}

// newReplicaCountingReads is newReplicaCounting that also counts the
// reads of single Leases in gets.
func newReplicaCountingReads(t *testing.T, kube *fake.Clientset, identity string, writes, gets *atomic.Int64) replica {
	t.Helper()
	down := &atomic.Bool{}
	leases := kcp.LeasesClientsFunc(func(workspace string) (coordinationv1client.LeasesGetter, error) {
		if workspace != export.Workspace && workspace != replicaWorkspace {
			t.Errorf("Leases of workspace %s, want the export's %s or the replicas' %s", workspace, export.Workspace, replicaWorkspace)
		}
		return cutOff{LeasesGetter: kube.CoordinationV1(), down: down, writes: writes, gets: gets}, nil
	})
	o, err := New(Options{Leases: leases, Namespace: "ferry-system", Workspace: replicaWorkspace, Identity: identity,
		LeaseDuration: 1 * time.Second, RenewDeadline: 600 * time.Millisecond, RetryPeriod: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	o.Start(ctx)
	t.Cleanup(func() {
		cancel()
		o.Close()
	})
	return replica{Owners: o, down: down}
}

// cutOff fails every Lease request while down is set.
type cutOff struct {
	coordinationv1client.LeasesGetter
	down   *atomic.Bool
	writes *atomic.Int64
	gets   *atomic.Int64
}

func (c cutOff) Leases(ns string) coordinationv1client.LeaseInterface {
	return failing{LeaseInterface: c.LeasesGetter.Leases(ns), down: c.down, writes: c.writes, gets: c.gets}
}

type failing struct {
	coordinationv1client.LeaseInterface
	down   *atomic.Bool
	writes *atomic.Int64
	gets   *atomic.Int64
}

func (f failing) count() {
	if f.writes != nil {
		f.writes.Add(1)
	}
}

var errCutOff = errors.New("kcp unreachable")

func (f failing) Get(ctx context.Context, name string, opts metav1.GetOptions) (*coordinationv1.Lease, error) {
	if f.gets != nil {
		f.gets.Add(1)
	}
	if f.down.Load() {
		return nil, errCutOff
	}
	return f.LeaseInterface.Get(ctx, name, opts)
}

func (f failing) Create(ctx context.Context, l *coordinationv1.Lease, opts metav1.CreateOptions) (*coordinationv1.Lease, error) {
	f.count()
	if f.down.Load() {
		return nil, errCutOff
	}
	return f.LeaseInterface.Create(ctx, l, opts)
}

func (f failing) Update(ctx context.Context, l *coordinationv1.Lease, opts metav1.UpdateOptions) (*coordinationv1.Lease, error) {
	f.count()
	if f.down.Load() {
		return nil, errCutOff
	}
	return f.LeaseInterface.Update(ctx, l, opts)
}

func claim(t *testing.T, r replica) (*Held, error) {
	t.Helper()
	return claimExport(t, r, export)
}

func claimExport(t *testing.T, r replica, e config.APIExportRef) (*Held, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return r.Claim(ctx, e, e.Workspace)
}

// exportN is the n-th export in the provider workspace.
func exportN(n int) config.APIExportRef {
	return config.APIExportRef{Workspace: export.Workspace, Name: fmt.Sprintf("e%d.example.com", n)}
}

func TestOneOwnerAndTheOthersAreSentToIt(t *testing.T) {
	kube := newKube()
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
	kube := newKube()
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
	kube := newKube()
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

// TestRenewalsDoNotGrowWithTheExports: a replica owning 50 exports writes
// its Lease once per retry period, not once per export (with one election
// per export it wrote 50 times as often: 500 writes a second for 1,000
// exports at the default period).
func TestRenewalsDoNotGrowWithTheExports(t *testing.T) {
	kube := newKube()
	var writes atomic.Int64
	a := newReplicaCounting(t, kube, "broker-0:8443", &writes)
	const exports = 50
	for i := range exports {
		if _, err := claimExport(t, a, exportN(i)); err != nil {
			t.Fatal(err)
		}
	}
	before := writes.Load()
	time.Sleep(1 * time.Second) // ten retry periods
	if got := writes.Load() - before; got > 12 {
		t.Errorf("%d Lease writes in ten retry periods by a replica owning %d exports, want at most 12 (one renewal per period)", got, exports)
	}
}

// TestShutdownHandsEveryExportOverAtOnce: a replica closing releases its
// own Lease with one write; the other takes every export it owned without
// waiting out the lease duration.
func TestShutdownHandsEveryExportOverAtOnce(t *testing.T) {
	kube := newKube()
	var writes atomic.Int64
	a := newReplicaCounting(t, kube, "broker-0:8443", &writes)
	b := newReplica(t, kube, "broker-1:8443")
	const exports = 5
	var held []*Held
	for i := range exports {
		h, err := claimExport(t, a, exportN(i))
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, h)
	}
	for i := range exports {
		var elsewhere *ElsewhereError
		if _, err := claimExport(t, b, exportN(i)); !errors.As(err, &elsewhere) {
			t.Fatalf("export %d: %v, want it owned by the first replica", i, err)
		}
	}
	before := writes.Load()
	start := time.Now()
	// As the broker shuts down: its engines stop (releasing what they
	// own), then Close.
	a.cancelRun()
	for _, h := range held {
		h.Release()
	}
	a.Close()
	if got := writes.Load() - before; got > 1 {
		t.Errorf("shutting down wrote %d times, want one release of the replica Lease", got)
	}
	for i := range exports {
		for {
			if time.Since(start) > 900*time.Millisecond {
				t.Fatalf("export %d not taken over within the lease duration", i)
			}
			if _, err := claimExport(t, b, exportN(i)); err == nil {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if h := held[i]; h.Context().Err() == nil {
			t.Errorf("export %d: the closed replica's ownership is not cancelled", i)
		}
	}
}

// TestARecordNamesWhereItsOwnerLives: a record whose owner keeps its
// replica Lease in another workspace is judged by that Lease — an owner
// alive there is not taken over, although the claiming replica's own
// workspace has no Lease of it.
func TestARecordNamesWhereItsOwnerLives(t *testing.T) {
	kube := newKube()
	a := newReplica(t, kube, "broker-0:8443")
	if _, err := claim(t, a); err != nil {
		t.Fatal(err)
	}
	rec, err := kube.CoordinationV1().Leases("ferry-system").Get(context.Background(), LeaseName(export.Name), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := rec.Annotations[AnnotationReplicaLease], replicaWorkspace+" ferry-system/"+ReplicaLeaseName("broker-0:8443"); got != want {
		t.Errorf("record annotation %q, want %q", got, want)
	}
	if rec.Spec.LeaseDurationSeconds != nil {
		t.Errorf("the record has a lease duration (%d s): it is never renewed, readers must not see it expire", *rec.Spec.LeaseDurationSeconds)
	}
	b := newReplica(t, kube, "broker-1:8443")
	time.Sleep(1200 * time.Millisecond) // past the lease duration: a keeps renewing
	var elsewhere *ElsewhereError
	if _, err := claim(t, b); !errors.As(err, &elsewhere) {
		t.Fatalf("a live owner was taken over: %v", err)
	}
}

// TestTakingAnExportIsOneWrite: a replica takes a free export with one
// create and its own export back after a restart with one update, reading
// no record (the watched records say what there is); a replica that finds
// the export owned by a live replica reads nothing either.
func TestTakingAnExportIsOneWrite(t *testing.T) {
	kube := newKube()
	var writes, gets atomic.Int64
	a := newReplicaCountingReads(t, kube, "broker-0:8443", &writes, &gets)
	const exports = 20
	if _, err := claimExport(t, a, exportN(0)); err != nil { // starts the watches
		t.Fatal(err)
	}
	writes.Store(0)
	gets.Store(0) // the replica Lease's first renewal reads it
	for i := 1; i <= exports; i++ {
		if _, err := claimExport(t, a, exportN(i)); err != nil {
			t.Fatal(err)
		}
	}
	// Renewals of the replica Lease run beside: at most one per 100 ms.
	if w, g := writes.Load(), gets.Load(); w > exports+5 || g != 0 {
		t.Errorf("taking %d free exports: %d writes and %d reads, want one write each and no read", exports, w, g)
	}

	var bGets atomic.Int64
	b := newReplicaCountingReads(t, kube, "broker-1:8443", nil, &bGets)
	if _, err := claimExport(t, b, exportN(0)); err == nil {
		t.Fatal("two owners")
	}
	bGets.Store(0)
	for i := 1; i <= exports; i++ {
		var elsewhere *ElsewhereError
		if _, err := claimExport(t, b, exportN(i)); !errors.As(err, &elsewhere) {
			t.Fatalf("export %d: %v, want it owned by the live first replica", i, err)
		}
	}
	if g := bGets.Load(); g != 0 {
		t.Errorf("%d reads to be sent to a live owner, want none", g)
	}
}

// newKube is a fake clientset whose Leases have resourceVersions that
// change on every write and are checked on updates, as an API server's
// (the fake's tracker keeps them as given): a write on a stale record
// must fail as it would against kcp.
func newKube() *fake.Clientset {
	kube := fake.NewClientset()
	var mu sync.Mutex
	next := 0
	leases := coordinationv1.SchemeGroupVersion.WithResource("leases")
	kube.PrependReactor("create", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		l := a.(k8stesting.CreateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		next++
		l.ResourceVersion = strconv.Itoa(next)
		if err := kube.Tracker().Create(leases, l, l.Namespace); err != nil {
			return true, nil, err
		}
		return true, l, nil
	})
	kube.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		mu.Lock()
		defer mu.Unlock()
		l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease).DeepCopy()
		cur, err := kube.Tracker().Get(leases, l.Namespace, l.Name)
		if err != nil {
			return true, nil, err
		}
		if cur.(*coordinationv1.Lease).ResourceVersion != l.ResourceVersion {
			return true, nil, apierrors.NewConflict(leases.GroupResource(), l.Name, errors.New("the object has been modified"))
		}
		next++
		l.ResourceVersion = strconv.Itoa(next)
		if err := kube.Tracker().Update(leases, l, l.Namespace); err != nil {
			return true, nil, err
		}
		return true, l, nil
	})
	return kube
}

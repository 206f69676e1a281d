package e2e

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/test/framework"
)

// replicaLeaseDuration keeps the failover short in the test (the default
// is 15 s).
const replicaLeaseDuration = 3 * time.Second

// startReplica starts a broker replica named name that announces its own
// address (--replica-address) and competes for the exports' ownership.
func startReplica(t *testing.T, name, pki string, cfg config.Config) *framework.Broker {
	t.Helper()
	port, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	dir := testDir(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	b, err := framework.StartBroker(context.Background(), env.bins, framework.BrokerOptions{
		Name: name, Dir: dir + "/" + name, LogDir: dir, PKIDir: pki, KCPKubeconfig: env.kcp.StableKubeconfig, Config: cfg, Port: port,
		ExtraArgs: []string{"--replica-address", addr, "--ownership-lease-duration", replicaLeaseDuration.String()},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopChecked(t, b.Process) })
	return b
}

// replicaPair is two broker replicas sharing one APIExport (its edge
// configured on both), with the test PKI.
type replicaPair struct {
	export config.APIExportRef
	pki    string
	a, b   *framework.Broker
}

func startReplicaPair(t *testing.T) replicaPair {
	t.Helper()
	export := newExport(t)
	pki := newPKI(t, "pki", "edge", "admin")
	cfg := config.Config{
		Edges:  []config.Edge{{Identity: devpki.IdentityFor("edge"), APIExport: export}},
		Admins: []string{devpki.IdentityFor("admin")},
	}
	return replicaPair{export: export, pki: pki, a: startReplica(t, "broker-a", pki, cfg), b: startReplica(t, "broker-b", pki, cfg)}
}

// waitServedBy waits until replica b serves the edge.
func (r replicaPair) waitServedBy(t *testing.T, b *framework.Broker) {
	t.Helper()
	if _, err := framework.WaitEdgeState(context.Background(), adminConn(t, b, r.pki), devpki.IdentityFor("edge"), ferryv1.EdgeState_EDGE_STATE_CONNECTED, time.Minute); err != nil {
		t.Fatalf("the edge is not served by %s: %v", b.Name, err)
	}
}

// syncBehindBalancer starts the edge behind a balancer over both replicas
// (its first stream lands on broker-a, which so owns the export), publishes
// a CRD of kind/plural and binds a consumer workspace.
func (r replicaPair) syncBehindBalancer(t *testing.T, group, kind, plural string) *syncEnv {
	t.Helper()
	lb := startBalancer(t, r.a.Address, r.b.Address)
	p := &pubEnv{label: sanitize(t.Name()), path: env.provider, pki: r.pki, export: r.export, broker: r.a, edgeDial: lb.addr}
	p.edge = p.startEdge(t)
	r.waitServedBy(t, r.a)
	var err error
	if p.kcp, err = framework.KCPClient(env.kcp.Config); err != nil {
		t.Fatal(err)
	}
	crd := testCRD(group, kind, plural, apiextensionsv1.NamespaceScoped, "v1")
	apply(t, crd)
	p.publish(t, plural, ferryv1alpha1.PublishedResourceSpec{Resource: ferryv1alpha1.SourceResource{APIGroup: group, Kind: kind, Version: "v1"}})
	e := publishedSyncEnv(t, p, crd)
	e.useConsumer(t, bindConsumer(t, p, plural[:4]))
	return e
}

// TestReplicasSendTheEdgeToTheOwnerAndFailOver: two broker replicas share
// an APIExport's ownership through its Lease in kcp. An edge pointed at
// the replica that does not own the export is sent to the owner and served
// there without operator action; when the owner is killed, the other
// replica takes the export over once the Lease runs out and the edge,
// still pointed at it, is served there: a PublishedResource applied after
// the failover is published through the new owner.
func TestReplicasSendTheEdgeToTheOwnerAndFailOver(t *testing.T) {
	r := startReplicaPair(t)
	owner, other := r.a, r.b

	// The first edge stream makes broker-a the owner.
	e := &pubEnv{label: sanitize(t.Name()), path: env.provider, pki: r.pki, export: r.export, broker: owner}
	first := e.startEdge(t)
	r.waitServedBy(t, owner)
	stopChecked(t, first)

	// An edge pointed at broker-b is sent to broker-a, which still owns
	// the export (its engine outlives the stream).
	e.edgeDial = other.Address
	e.edge = e.startEdge(t)
	r.waitServedBy(t, owner) // the edge pointed at the non-owner reached the owner
	waitFor(t, "broker-b sent the edge to broker-a", func(context.Context) (bool, string) {
		log, err := other.Log()
		return err == nil && containsAll(string(log), []string{"sent the edge to the broker replica that owns its APIExport", owner.Address}),
			"broker-b's log does not say it sent the edge to " + owner.Address
	})
	crd := testCRD("replicas.example.com", "Ferryboat", "ferryboats", apiextensionsv1.NamespaceScoped, "v1")
	apply(t, crd)
	e.publish(t, "ferryboats", ferryv1alpha1.PublishedResourceSpec{Resource: ferryv1alpha1.SourceResource{APIGroup: crd.Spec.Group, Kind: "Ferryboat", Version: "v1"}})
	e.waitCondition(t, "ferryboats", metav1.ConditionTrue, ferryv1alpha1.ReasonPublished)

	// The owner dies: broker-b takes the export over after the Lease
	// duration, and the edge, reconnecting to broker-b, is served there.
	killed := time.Now()
	owner.Kill()
	r.waitServedBy(t, other)
	t.Logf("served by broker-b %s after the owner was killed (lease duration %s)", time.Since(killed).Round(100*time.Millisecond), replicaLeaseDuration)
	crd2 := testCRD("replicas.example.com", "Scow", "scows", apiextensionsv1.NamespaceScoped, "v1")
	apply(t, crd2)
	e.publish(t, "scows", ferryv1alpha1.PublishedResourceSpec{Resource: ferryv1alpha1.SourceResource{APIGroup: crd2.Spec.Group, Kind: "Scow", Version: "v1"}})
	e.waitCondition(t, "scows", metav1.ConditionTrue, ferryv1alpha1.ReasonPublished)
}

// TestReplicaFailoverWhileCreating is issue 22's first acceptance line: two
// broker replicas behind a balancer (the Service), one edge; the owner is
// killed with SIGKILL while 500 objects are being created in kcp. The edge
// is served by the other replica after the Lease duration and a reconnect;
// every object is synced exactly once (one local copy each, none written
// twice), every status comes back, and deleting them all leaves no
// finalizer behind.
func TestReplicaFailoverWhileCreating(t *testing.T) {
	ctx := context.Background()
	const n = 500
	r := startReplicaPair(t)
	e := r.syncBehindBalancer(t, "failover.example.com", "Pontoon", "pontoons")

	want := map[string]string{}
	var names []string
	for i := range n {
		name := fmt.Sprintf("pontoon-%03d", i)
		want[name] = "v1"
		names = append(names, name)
	}
	created := make(chan struct{})
	go func() {
		defer close(created)
		e.createRemoteParallel(t, names)
	}()
	// Kill the owner once some copies exist and kcp is still taking
	// objects.
	err := framework.Eventually(ctx, 2*time.Minute, 20*time.Millisecond, func(context.Context) (bool, string) {
		got := len(e.localState(t))
		return got >= n/10, fmt.Sprintf("%d local copies so far", got)
	})
	if err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	r.a.Kill()
	t.Logf("broker-a (the owner) killed with %d local copies", len(e.localState(t)))
	r.waitServedBy(t, r.b)
	t.Logf("the edge was served by broker-b %s after the kill (lease duration %s)", time.Since(killed).Round(100*time.Millisecond), replicaLeaseDuration)
	<-created
	before := e.waitConverged(t, want)
	t.Logf("all %d objects synced %s after the kill", n, time.Since(killed).Round(100*time.Millisecond))

	// Every status back, and nothing written twice meanwhile.
	setLocalStatusParallel(t, e, "Ready")
	waitFor(t, "every status in kcp", func(ctx context.Context) (bool, string) {
		list, err := e.remote.Namespace("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		ready := 0
		for _, u := range list.Items {
			if phase, _, _ := unstructured.NestedString(u.Object, "status", "phase"); phase == "Ready" {
				ready++
			}
		}
		return ready == n, fmt.Sprintf("%d of %d objects carry their copy's status", ready, n)
	})
	after := e.localState(t)
	for name, st := range after {
		if st[1] != before[name][1] {
			t.Errorf("%s: spec changed after convergence: %v → %v", name, before[name], st)
		}
	}

	// Deleting them all leaves no finalizer behind.
	deleteRemoteParallel(t, e, names)
	waitFor(t, "every object gone from kcp and the service cluster", func(ctx context.Context) (bool, string) {
		list, err := e.remote.Namespace("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		local := len(e.localState(t))
		return len(list.Items) == 0 && local == 0, fmt.Sprintf("%d objects left in kcp (finalizers), %d local copies", len(list.Items), local)
	})
}

// setLocalStatusParallel sets status.phase on every local copy of e.
func setLocalStatusParallel(t testing.TB, e *syncEnv, phase string) {
	t.Helper()
	list, err := e.local.Namespace(e.consumerLC).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inParallel(t, list.Items, func(u unstructured.Unstructured) error {
		_ = unstructured.SetNestedField(u.Object, phase, "status", "phase")
		_, err := e.local.Namespace(u.GetNamespace()).UpdateStatus(context.Background(), &u, metav1.UpdateOptions{})
		return err
	})
}

// deleteRemoteParallel deletes the named kcp objects of e.
func deleteRemoteParallel(t testing.TB, e *syncEnv, names []string) {
	t.Helper()
	inParallel(t, names, func(name string) error {
		return e.remote.Namespace("default").Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// rolloutBound is the longest an object may wait during a rolling
// restart: one reconnect of the edge (its backoff is capped at 5 s) plus
// the handshake and the new owner's resync.
const rolloutBound = 10 * time.Second

// TestRollingRestartOfReplicas: two replicas behind a balancer, steady
// traffic (an object created in kcp every 100 ms); both replicas are
// restarted one after the other with SIGTERM, as a rolling update does. A
// stopping owner hands its export over, so no object waits for its copy
// longer than one reconnect of the edge.
func TestRollingRestartOfReplicas(t *testing.T) {
	ctx := context.Background()
	r := startReplicaPair(t)
	e := r.syncBehindBalancer(t, "rolling.example.com", "Skiff", "skiffs")

	// When each object was created in kcp, and when its copy appeared.
	var mu sync.Mutex
	created, appeared := map[string]time.Time{}, map[string]time.Time{}
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	watchFrom(watchCtx, t, e.local.Namespace(e.consumerLC), "", func(ev watch.EventType, u *unstructured.Unstructured) {
		name := u.GetAnnotations()[naming.AnnotationName]
		mu.Lock()
		defer mu.Unlock()
		if _, seen := appeared[name]; !seen && ev != watch.Deleted {
			appeared[name] = time.Now()
		}
	})
	trafficCtx, stopTraffic := context.WithCancel(ctx)
	traffic := make(chan struct{})
	go func() {
		defer close(traffic)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for i := 0; trafficCtx.Err() == nil; i++ {
			name := fmt.Sprintf("skiff-%04d", i)
			mu.Lock()
			created[name] = time.Now()
			mu.Unlock()
			if _, err := e.remote.Namespace("default").Create(ctx, e.remoteObject(name), metav1.CreateOptions{}); err != nil {
				t.Errorf("create %s: %v", name, err)
			}
			select {
			case <-trafficCtx.Done():
			case <-tick.C:
			}
		}
	}()

	time.Sleep(2 * time.Second)
	for _, b := range []*framework.Broker{r.a, r.b} {
		if err := b.Restart(ctx, false); err != nil {
			t.Fatalf("restarting %s: %v", b.Name, err)
		}
		t.Logf("%s restarted", b.Name)
		time.Sleep(3 * time.Second)
	}
	stopTraffic()
	<-traffic

	var worst time.Duration
	var worstName string
	err := framework.Eventually(ctx, time.Minute, 100*time.Millisecond, func(context.Context) (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		missing := 0
		worst, worstName = 0, ""
		for name, at := range created {
			seen, ok := appeared[name]
			if !ok {
				missing++
				continue
			}
			if d := seen.Sub(at); d > worst {
				worst, worstName = d, name
			}
		}
		return missing == 0, fmt.Sprintf("%d of %d objects without a local copy", missing, len(created))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d objects created during the rolling restart; the longest wait for a copy: %s (%s)", len(created), worst.Round(10*time.Millisecond), worstName)
	if worst > rolloutBound {
		t.Errorf("%s waited %s for its copy during the rolling restart, more than one reconnect (%s)", worstName, worst.Round(10*time.Millisecond), rolloutBound)
	}
}

package e2e

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ferry-dev/ferry/test/framework"
)

// endpointReachableMetric is the broker's gauge per virtual workspace
// endpoint (labels export, url): 1 while its lists and watches succeed.
const endpointReachableMetric = "ferry_broker_virtual_workspace_endpoint_reachable"

// TestShardedKCPSyncsEveryShard: on a kcp of two shards, one broker syncs the
// workspaces on both shards. 100 objects in a workspace on each shard reach
// the service cluster, their statuses come back, and deleting them leaves
// neither an object held by a finalizer nor a local copy.
func TestShardedKCPSyncsEveryShard(t *testing.T) {
	const perShard = 100
	ctx := context.Background()
	start := time.Now()
	se := newShardedEnv(t, "sharded.example.com", "Hamper", "hampers")
	urls := se.endpoints(t)
	t.Logf("set up in %s; the APIExportEndpointSlice lists %v", se.startup.Round(time.Second), urls)

	want := map[string]string{}
	for i := range perShard {
		want[fmt.Sprintf("hamper-%03d", i)] = "v1"
	}
	names := slices.Sorted(maps.Keys(want))
	synced := time.Now()
	se.ws.parallel(perShard, func(e *syncEnv, i int) {
		if _, err := e.remote.Namespace("default").Create(ctx, e.remoteObject(names[i]), metav1.CreateOptions{}); err != nil {
			t.Error(err)
		}
	})
	se.waitConverged(t, 3*time.Minute, want)
	se.waitRemoteEach(t, time.Minute, perShard, "carry the broker's finalizer", hasBrokerFinalizer)
	t.Logf("%d objects on each of %d shards synced in %s", perShard, len(se.ws), time.Since(synced).Round(time.Millisecond))

	// Status written on every local copy (as the service's controller
	// would) reaches the kcp object on either shard.
	statused := time.Now()
	for _, e := range se.ws {
		for _, u := range e.localCopies(t, "") {
			_ = unstructured.SetNestedField(u.Object, "Ready", "status", "phase")
			if _, err := e.local.Namespace(u.GetNamespace()).UpdateStatus(ctx, &u, metav1.UpdateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
	}
	se.waitRemoteEach(t, 2*time.Minute, perShard, "with status.phase Ready", func(u *unstructured.Unstructured) bool {
		return statusPhase(u) == "Ready"
	})
	t.Logf("statuses back in %s", time.Since(statused).Round(time.Millisecond))

	// Deleting in kcp deletes every local copy, then releases the
	// finalizer: nothing stays Terminating on either shard.
	deleted := time.Now()
	se.ws.parallel(perShard, func(e *syncEnv, i int) {
		if err := e.remote.Namespace("default").Delete(ctx, names[i], metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
	})
	se.waitEach(t, 2*time.Minute, func(ctx context.Context, e *syncEnv) (bool, string) {
		_, left, err := remoteCount(ctx, e, func(*unstructured.Unstructured) bool { return true })
		if err != nil {
			return false, err.Error()
		}
		copies := len(e.localCopies(t, ""))
		return left == 0 && copies == 0, fmt.Sprintf("%d kcp objects left, %d local copies left", left, copies)
	})
	t.Logf("deleted in %s; whole test %s", time.Since(deleted).Round(time.Millisecond), time.Since(start).Round(time.Second))
}

// TestShardedKCPShardOutage: while one shard of two cannot be reached, the
// other shard keeps syncing both ways (also while the broker's write of a
// status to the unreachable shard hangs), the broker says so (its
// endpoint's reachable gauge is 0 and ListEdges names its URL), and no
// local copy of the unreachable shard's objects is taken as gone. After the shard is back
// its workspace catches up (a status set meanwhile reaches kcp, a new object
// syncs) and no object that did not change was written on either side.
//
// The shard is frozen (SIGSTOP, see framework.ShardedKCP.FreezeShard): a
// hung shard, which clients notice only through their timeouts.
func TestShardedKCPShardOutage(t *testing.T) {
	const perShard = 5
	ctx := context.Background()
	se := newShardedEnv(t, "outage.sharded.example.com", "Tote", "totes")
	urls := se.endpoints(t)
	healthy, down := se.ws[0], se.ws[1]
	downShard := se.kcp.Shards[1]

	want := map[string]string{}
	for i := range perShard {
		want[fmt.Sprintf("tote-%d", i)] = "v1"
	}
	names := slices.Sorted(maps.Keys(want))
	se.ws.parallel(perShard, func(e *syncEnv, i int) {
		if _, err := e.remote.Namespace("default").Create(ctx, e.remoteObject(names[i]), metav1.CreateOptions{}); err != nil {
			t.Error(err)
		}
	})
	se.waitConverged(t, 2*time.Minute, want)
	se.waitRemoteEach(t, time.Minute, perShard, "carry the broker's finalizer", hasBrokerFinalizer)
	se.waitReachable(t, urls[downShard.Name], true)
	remoteBefore, localBefore := se.ws.versions(t)

	outage := time.Now()
	if err := se.kcp.FreezeShard(downShard.Name); err != nil {
		t.Fatal(err)
	}
	// Registered after the broker's and the edge's cleanups, so it runs
	// before them: they must not wait on a frozen shard.
	thawed := false
	t.Cleanup(func() {
		if !thawed {
			_ = se.kcp.ThawShard(downShard.Name)
		}
	})
	// A status set meanwhile for an object of the frozen shard waits for
	// it; the broker's attempts to write it must not hold up the other
	// shard.
	setLocalStatus(t, down, "tote-0", "Ready")

	// The healthy shard keeps syncing both ways, before and after the
	// broker noticed the outage.
	healthy.createRemote(t, "default", "tote-during-outage", map[string]any{"fieldV1": "v1"})
	healthy.waitLocal(t, "default", "tote-during-outage", func(*unstructured.Unstructured) (bool, string) { return true, "" })
	setLocalStatus(t, healthy, "tote-0", "Ready")
	healthy.waitRemote(t, "default", "tote-0", func(u *unstructured.Unstructured, err error) (bool, string) {
		if err != nil {
			return false, err.Error()
		}
		return statusPhase(u) == "Ready", "status.phase = " + statusPhase(u)
	})
	t.Logf("the healthy shard synced both ways %s after the freeze", time.Since(outage).Round(time.Millisecond))

	se.waitReachable(t, urls[downShard.Name], false)
	t.Logf("the broker reported %s unreachable %s after the freeze", urls[downShard.Name], time.Since(outage).Round(time.Second))
	waiting := healthy.adminEdge(t).GetExportStatus().GetWaitingFor()
	if !strings.Contains(waiting, urls[downShard.Name]) {
		t.Errorf("ListEdges says it waits for %q, which does not name the unreachable endpoint %s", waiting, urls[downShard.Name])
	}
	// Readiness stays up (the healthy shard is served) and its body names
	// the shard that is not.
	waitProbe(t, healthy.broker.Process, "/readyz?verbose", http.StatusOK, "[+]virtual-workspaces ok, degraded: ")
	waitProbe(t, healthy.broker.Process, "/readyz?verbose", http.StatusOK, urls[downShard.Name])
	healthy.createRemote(t, "default", "tote-noticed-outage", map[string]any{"fieldV1": "v1"})
	healthy.waitLocal(t, "default", "tote-noticed-outage", func(*unstructured.Unstructured) (bool, string) { return true, "" })

	if err := se.kcp.ThawShard(downShard.Name); err != nil {
		t.Fatal(err)
	}
	thawed = true
	back := time.Now()
	se.waitReachable(t, urls[downShard.Name], true)
	down.waitRemote(t, "default", "tote-0", func(u *unstructured.Unstructured, err error) (bool, string) {
		if err != nil {
			return false, err.Error()
		}
		return statusPhase(u) == "Ready", "status.phase = " + statusPhase(u)
	})
	down.createRemote(t, "default", "tote-after-outage", map[string]any{"fieldV1": "v1"})
	down.waitLocal(t, "default", "tote-after-outage", func(*unstructured.Unstructured) (bool, string) { return true, "" })
	t.Logf("the shard's workspace caught up %s after the thaw (outage %s)", time.Since(back).Round(time.Second), back.Sub(outage).Round(time.Second))

	// Nothing that did not change was written: not on the service
	// cluster, not in kcp (tote-0's status was, on purpose, in both
	// workspaces; the new objects are new).
	remoteAfter, localAfter := se.ws.versions(t)
	for _, m := range []map[string]map[string]string{remoteAfter, localAfter} {
		delete(m[healthy.consumerLC], "tote-during-outage")
		delete(m[healthy.consumerLC], "tote-noticed-outage")
		delete(m[down.consumerLC], "tote-after-outage")
		for _, ws := range m {
			delete(ws, "tote-0")
		}
	}
	for _, m := range []map[string]map[string]string{remoteBefore, localBefore} {
		for _, ws := range m {
			delete(ws, "tote-0")
		}
	}
	if got := changedIn(remoteBefore, remoteAfter); len(got) > 0 {
		t.Errorf("kcp objects rewritten across the shard outage: %v", got)
	}
	if got := changedIn(localBefore, localAfter); len(got) > 0 {
		t.Errorf("local copies rewritten (or deleted and created again) across the shard outage: %v", got)
	}
	for ws, objs := range localBefore {
		for name := range objs {
			if _, ok := localAfter[ws][name]; !ok {
				t.Errorf("local copy of %s in %s is gone after the shard outage", name, ws)
			}
		}
	}
}

// waitReachable waits until the broker's gauge for the virtual workspace
// endpoint url says reachable. Frozen shards are noticed through client
// timeouts (HTTP/2 pings, TLS handshakes), hence the generous timeout.
func (se *shardedEnv) waitReachable(t testing.TB, url string, reachable bool) {
	t.Helper()
	want := 0.0
	if reachable {
		want = 1
	}
	b := se.ws[0].broker
	err := framework.Eventually(context.Background(), 3*time.Minute, time.Second, func(ctx context.Context) (bool, string) {
		m, err := framework.Scrape(ctx, b.Process)
		if err != nil {
			return false, err.Error()
		}
		v, ok := m.Value(endpointReachableMetric, map[string]string{"url": url})
		if !ok {
			return false, fmt.Sprintf("the broker has no %s series for url %s", endpointReachableMetric, url)
		}
		return v == want, fmt.Sprintf("%s{url=%q} is %v", endpointReachableMetric, url, v)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// setLocalStatus sets status.phase on the local copy of the kcp object
// default/name, as the service's controller would.
func setLocalStatus(t testing.TB, e *syncEnv, name, phase string) {
	t.Helper()
	copies := e.localCopiesOf(t, "default", name)
	if len(copies) != 1 {
		t.Fatalf("%d local copies of default/%s in %s", len(copies), name, e.consumer)
	}
	u := copies[0]
	_ = unstructured.SetNestedField(u.Object, phase, "status", "phase")
	if _, err := e.local.Namespace(u.GetNamespace()).UpdateStatus(context.Background(), &u, metav1.UpdateOptions{}); err != nil {
		t.Fatalf("cannot set the status of the local copy of default/%s: %v", name, err)
	}
}

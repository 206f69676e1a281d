package e2e

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/test/framework"
)

// scaleEnvs is one broker and edge serving a resource bound in several
// consumer workspaces: one syncEnv per workspace, sharing the processes.
type scaleEnvs []*syncEnv

func newScaleEnvs(t testing.TB, workspaces int) scaleEnvs {
	t.Helper()
	first := newSyncEnv(t, "scale.example.com", "Pallet", "pallets", nil)
	out := scaleEnvs{first}
	for i := 1; i < workspaces; i++ {
		e := *first // shares the broker and edge (pubEnv)
		e.useConsumer(t, bindConsumer(t, first.pubEnv, fmt.Sprintf("c%d", i)))
		out = append(out, &e)
	}
	return out
}

// parallel runs do for every (workspace, index) pair from a few goroutines.
func (s scaleEnvs) parallel(perWorkspace int, do func(e *syncEnv, i int)) {
	type job struct {
		e *syncEnv
		i int
	}
	jobs := make(chan job, len(s)*perWorkspace)
	for i := range perWorkspace {
		for _, e := range s {
			jobs <- job{e, i}
		}
	}
	close(jobs)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for j := range jobs {
				do(j.e, j.i)
			}
		})
	}
	wg.Wait()
}

// versions returns workspace → name → resourceVersion of the kcp objects
// and of the local copies.
func (s scaleEnvs) versions(t testing.TB) (remote, local map[string]map[string]string) {
	t.Helper()
	remote, local = map[string]map[string]string{}, map[string]map[string]string{}
	for _, e := range s {
		remote[e.consumerLC] = e.remoteVersions(t)
		local[e.consumerLC] = map[string]string{}
		for name, st := range e.localState(t) {
			local[e.consumerLC][name] = st[0]
		}
	}
	return remote, local
}

func changedIn(before, after map[string]map[string]string) []string {
	var out []string
	for ws, objs := range after {
		for _, name := range changed(before[ws], objs) {
			out = append(out, ws+"/"+name)
		}
	}
	return out
}

// TestEngineAtScale is the engine's acceptance at 2,000 objects in 10
// workspaces: after the edge is killed (SIGKILL) and started again, the
// resync is complete within 5 s of the new stream, writes nothing on either
// side and lists nothing from kcp; statuses set on every local copy while
// the broker is killed and started again all reach kcp.
func TestEngineAtScale(t *testing.T) {
	const workspaces, perWorkspace = 10, 200
	const total = workspaces * perWorkspace
	ctx := context.Background()
	s := newScaleEnvs(t, workspaces)
	e := s[0]
	want := map[string]string{}
	for i := range perWorkspace {
		want[fmt.Sprintf("pallet-%03d", i)] = "v1"
	}

	start := time.Now()
	s.parallel(perWorkspace, func(e *syncEnv, i int) {
		if _, err := e.remote.Namespace("default").Create(ctx, e.remoteObject(fmt.Sprintf("pallet-%03d", i)), metav1.CreateOptions{}); err != nil {
			t.Error(err)
		}
	})
	t.Logf("created %d objects in %d workspaces in %s", total, workspaces, time.Since(start).Round(time.Millisecond))
	for _, e := range s {
		e.waitConverged(t, want)
	}
	t.Logf("all %d local copies exist %s after the first create", total, time.Since(start).Round(time.Millisecond))

	// Settle: finalizers written (the broker writes them beside the intents,
	// not before them, so copies can exist first), nothing queued for the
	// edge.
	err := framework.Eventually(ctx, 2*time.Minute, 250*time.Millisecond, func(ctx context.Context) (bool, string) {
		st := e.engineStatus(t)
		if st.GetObjects() != total || st.GetOutboxPending() != 0 || st.GetOutboxInFlight() != 0 {
			return false, fmt.Sprintf("engine: %d objects, %d intents pending, %d in flight", st.GetObjects(), st.GetOutboxPending(), st.GetOutboxInFlight())
		}
		with := 0
		for _, w := range s {
			list, err := w.remote.Namespace("default").List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err.Error()
			}
			for _, u := range list.Items {
				if slices.Contains(u.GetFinalizers(), brokerFinalizer) {
					with++
				}
			}
		}
		return with == total, fmt.Sprintf("%d of %d objects carry the broker's finalizer", with, total)
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second)
	remoteBefore, localBefore := s.versions(t)
	before := e.engineStatus(t)

	// SIGKILL the edge and start it again.
	e.edge.Kill()
	restarted := time.Now()
	e.edge = e.startEdge(t)
	var stream time.Time
	err = framework.Eventually(ctx, 2*time.Minute, 50*time.Millisecond, func(context.Context) (bool, string) {
		edge := e.adminEdge(t)
		if edge.GetState() != ferryv1.EdgeState_EDGE_STATE_CONNECTED || edge.GetEngine().GetAttachments() <= before.GetAttachments() {
			return false, fmt.Sprintf("edge %s, %d attachments", edge.GetState(), edge.GetEngine().GetAttachments())
		}
		stream = edge.GetConnectedAt().AsTime()
		return true, ""
	})
	if err != nil {
		t.Fatal(err)
	}
	// The restarted edge has the killed one's identity (its instance name,
	// as a pod name would be): it takes the Lease back at once instead of
	// waiting out the 15 s lease duration.
	failover := stream.Sub(restarted)
	t.Logf("new stream %s after the edge restart", failover.Round(time.Millisecond))
	if failover > 10*time.Second {
		t.Errorf("the restarted edge connected %s after its start: it waited for its own predecessor's Lease", failover.Round(time.Millisecond))
	}
	waitLogCount(t, e.broker.Process, time.Minute, 1, "edge inventory complete", fmt.Sprintf(`"objects":%d`, total))
	err = framework.Eventually(ctx, time.Minute, 50*time.Millisecond, func(context.Context) (bool, string) {
		st := e.engineStatus(t)
		return st.GetOutboxPending() == 0 && st.GetOutboxInFlight() == 0,
			fmt.Sprintf("%d intents pending, %d in flight", st.GetOutboxPending(), st.GetOutboxInFlight())
	})
	if err != nil {
		t.Fatal(err)
	}
	resync := time.Since(stream)
	t.Logf("resync of %d objects complete %s after the new stream started", total, resync.Round(time.Millisecond))
	if resync > 5*time.Second {
		t.Errorf("resync took %s after the new stream, want ≤ 5s", resync.Round(time.Millisecond))
	}
	time.Sleep(2 * time.Second) // anything spurious would be written by now
	remoteAfter, localAfter := s.versions(t)
	if c := changedIn(remoteBefore, remoteAfter); len(c) != 0 {
		t.Errorf("%d objects changed in kcp after the edge restart, e.g. %v", len(c), c[:min(len(c), 5)])
	}
	if c := changedIn(localBefore, localAfter); len(c) != 0 {
		t.Errorf("%d local copies changed after the edge restart, e.g. %v", len(c), c[:min(len(c), 5)])
	}
	if after := e.engineStatus(t); after.GetKcpLists() != before.GetKcpLists() {
		t.Errorf("the broker listed from kcp again: %d lists before the edge restart, %d after", before.GetKcpLists(), after.GetKcpLists())
	}

	// Statuses on every local copy while the broker is killed and started
	// again: the edge's unanswered reports are sent to the new broker.
	start = time.Now()
	var written atomic.Int32
	killed := make(chan error, 1)
	go func() {
		for written.Load() < total/4 {
			time.Sleep(20 * time.Millisecond)
		}
		killed <- e.broker.Restart(ctx, true)
	}()
	locals := map[*syncEnv]map[string]string{} // kcp name → local name
	for _, e := range s {
		list, err := e.local.Namespace(e.consumerLC).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		locals[e] = map[string]string{}
		for _, u := range list.Items {
			locals[e][u.GetAnnotations()[naming.AnnotationName]] = u.GetName()
		}
	}
	s.parallel(perWorkspace, func(e *syncEnv, i int) {
		name := locals[e][fmt.Sprintf("pallet-%03d", i)]
		if _, err := e.local.Namespace(e.consumerLC).Patch(ctx, name, types.MergePatchType,
			[]byte(`{"status":{"phase":"ready"}}`), metav1.PatchOptions{}, "status"); err != nil {
			t.Error(err)
		}
		written.Add(1)
	})
	t.Logf("status set on %d local copies in %s", total, time.Since(start).Round(time.Millisecond))
	if err := <-killed; err != nil {
		t.Fatal(err)
	}
	for _, e := range s {
		err := framework.Eventually(ctx, 5*time.Minute, 500*time.Millisecond, func(context.Context) (bool, string) {
			list, err := e.remote.Namespace("default").List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err.Error()
			}
			ready := 0
			for _, u := range list.Items {
				if p, _, _ := unstructured.NestedString(u.Object, "status", "phase"); p == "ready" {
					ready++
				}
			}
			return ready == perWorkspace, fmt.Sprintf("%s: %d of %d statuses in kcp", e.consumerLC, ready, perWorkspace)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("all %d statuses in kcp %s after the first status write (broker killed after %d)", total, time.Since(start).Round(time.Millisecond), total/4)
}

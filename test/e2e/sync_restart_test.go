package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/test/framework"
)

// localState maps remote name → (local resourceVersion, spec.fieldV1) of
// every local copy in the consumer workspace's namespace.
func (e *syncEnv) localState(t testing.TB) map[string][2]string {
	t.Helper()
	list, err := e.local.Namespace(e.consumerLC).List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][2]string{}
	for _, u := range list.Items {
		name := u.GetAnnotations()[naming.AnnotationName]
		if _, dup := out[name]; dup {
			t.Errorf("two local copies of %s", name)
		}
		v, _ := specField(&u, "fieldV1")
		out[name] = [2]string{u.GetResourceVersion(), v}
	}
	return out
}

// waitConverged waits until the local copies are exactly want (name →
// spec.fieldV1) and returns their state.
func (e *syncEnv) waitConverged(t testing.TB, want map[string]string) map[string][2]string {
	t.Helper()
	var state map[string][2]string
	err := framework.Eventually(context.Background(), 3*time.Minute, 250*time.Millisecond, func(context.Context) (bool, string) {
		state = e.localState(t)
		return converged(state, want)
	})
	if err != nil {
		t.Fatal(err)
	}
	return state
}

// converged compares local copies (name → resourceVersion, spec.fieldV1)
// with want (name → spec.fieldV1).
func converged(state map[string][2]string, want map[string]string) (bool, string) {
	missing, wrong, extra := 0, 0, 0
	for name, v := range want {
		got, ok := state[name]
		switch {
		case !ok:
			missing++
		case got[1] != v:
			wrong++
		}
	}
	for name := range state {
		if _, ok := want[name]; !ok {
			extra++
		}
	}
	return missing+wrong+extra == 0, fmt.Sprintf("%d of %d local copies missing, %d out of date, %d extra", missing, len(want), wrong, extra)
}

func TestSyncConvergesAcrossEdgeAndBrokerRestarts(t *testing.T) {
	ctx := context.Background()
	e := newSyncEnv(t, "restart.example.com", "Crate", "crates", nil)
	const n = 200
	want := map[string]string{}
	for i := range n {
		want[fmt.Sprintf("crate-%03d", i)] = "v1"
	}
	var names []string
	for name := range want {
		names = append(names, name)
	}
	start := time.Now()
	// From a few goroutines: one by one takes kcp most of a minute.
	e.createRemoteParallel(t, names)
	t.Logf("created %d objects in kcp in %s", n, time.Since(start).Round(time.Millisecond))

	// Kill the edge while it is syncing, start it again.
	err := framework.Eventually(ctx, time.Minute, 50*time.Millisecond, func(context.Context) (bool, string) {
		got := len(e.localState(t))
		return got >= n/4, fmt.Sprintf("%d local copies so far", got)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d local copies after %s; killing the edge", n/4, time.Since(start).Round(time.Millisecond))
	e.edge.Kill()
	e.edge = e.startEdge(t)
	before := e.waitConverged(t, want)
	t.Logf("all %d converged after %s", n, time.Since(start).Round(time.Millisecond))

	// Kill the broker; after it is back, nothing that did not change is
	// written again.
	if err := e.broker.Restart(ctx, true); err != nil {
		t.Fatal(err)
	}
	waitLogCount(t, e.broker.Process, time.Minute, 1, "edge inventory complete", fmt.Sprintf(`"objects":%d`, n))
	// Change a few objects in kcp; they must arrive, and they mark the point
	// by which anything spurious would have been written too.
	for i := range 5 {
		name := fmt.Sprintf("crate-%03d", i)
		e.setRemoteField(t, name, "v2")
		want[name] = "v2"
	}
	after := e.waitConverged(t, want)
	rewritten := 0
	for name, st := range after {
		if want[name] == "v1" && st[0] != before[name][0] {
			rewritten++
		}
	}
	if rewritten != 0 {
		t.Errorf("%d unchanged objects were written again after the broker restart", rewritten)
	}

	// While the edge is down: delete some objects and change others in kcp.
	e.edge.Kill()
	for i := 10; i < 15; i++ {
		name := fmt.Sprintf("crate-%03d", i)
		if err := e.remote.Namespace("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		delete(want, name)
	}
	for i := 20; i < 25; i++ {
		name := fmt.Sprintf("crate-%03d", i)
		e.setRemoteField(t, name, "v3")
		want[name] = "v3"
	}
	before = after
	e.edge = e.startEdge(t)
	after = e.waitConverged(t, want)
	rewritten = 0
	for name, st := range after {
		if want[name] == "v1" && st[0] != before[name][0] {
			rewritten++
		}
	}
	if rewritten != 0 {
		t.Errorf("%d unchanged objects were written again after the edge restart", rewritten)
	}
	// The deleted objects are gone from kcp too: the finalizer was released.
	for i := 10; i < 15; i++ {
		name := fmt.Sprintf("crate-%03d", i)
		e.waitRemote(t, "default", name, func(_ *unstructured.Unstructured, err error) (bool, string) {
			return apierrors.IsNotFound(err), fmt.Sprintf("%s: %v", name, err)
		})
	}
}

func (e *syncEnv) setRemoteField(t testing.TB, name, value string) {
	t.Helper()
	ctx := context.Background()
	u, err := e.remote.Namespace("default").Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(u.Object, value, "spec", "fieldV1")
	if _, err := e.remote.Namespace("default").Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/test/framework"
)

// createRemoteParallel creates objects named names (spec.fieldV1 = v1) in
// the consumer workspace from a few goroutines.
func (e *syncEnv) createRemoteParallel(t testing.TB, names []string) {
	t.Helper()
	inParallel(t, names, func(name string) error {
		_, err := e.remote.Namespace("default").Create(context.Background(), e.remoteObject(name), metav1.CreateOptions{})
		return err
	})
}

// inParallel runs do for every item from 8 goroutines (one by one takes kcp
// most of a minute for a few hundred objects); a failing item fails the
// test.
func inParallel[T any](t testing.TB, items []T, do func(T) error) {
	t.Helper()
	ch := make(chan T, len(items))
	for _, it := range items {
		ch <- it
	}
	close(ch)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for it := range ch {
				if err := do(it); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
}

// remoteObject is a new kcp object default/name with spec.fieldV1 = v1.
func (e *syncEnv) remoteObject(name string) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": e.remoteGVR.GroupVersion().String(), "kind": e.remoteKind,
		"metadata": map[string]any{"name": name, "namespace": "default"},
		"spec":     map[string]any{"fieldV1": "v1"},
	}}
}

// remoteVersions maps name → resourceVersion of the kcp objects.
func (e *syncEnv) remoteVersions(t testing.TB) map[string]string {
	t.Helper()
	list, err := e.remote.Namespace("default").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, u := range list.Items {
		out[u.GetName()] = u.GetResourceVersion()
	}
	return out
}

// adminEdge reads this environment's edge from the broker's admin API.
func (e *syncEnv) adminEdge(t testing.TB) *ferryv1.Edge {
	t.Helper()
	if e.admin == nil { // one connection for the test (tests poll this)
		e.admin = adminConn(t, e.broker, e.pki)
	}
	resp, err := ferryv1.NewAdminServiceClient(e.admin).ListEdges(context.Background(), &ferryv1.ListEdgesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, edge := range resp.GetEdges() {
		if edge.GetIdentity() == devpki.IdentityFor("edge") {
			return edge
		}
	}
	t.Fatalf("no edge in the admin API: %v", resp)
	return nil
}

// engineStatus reads the broker's engine figures through the admin API.
func (e *syncEnv) engineStatus(t testing.TB) *ferryv1.EngineStatus {
	t.Helper()
	st := e.adminEdge(t).GetEngine()
	if st == nil {
		t.Fatal("no engine in the admin API")
	}
	return st
}

func changed(before, after map[string]string, except ...string) []string {
	var out []string
	for name, v := range after {
		if before[name] != v && !slices.Contains(except, name) {
			out = append(out, name)
		}
	}
	return out
}

// TestEngineOutlivesStreams: the broker's engine keeps its caches across an
// edge kill (no re-list from kcp, nothing rewritten on either side), a
// status round trip does not rewrite the local copy, copies changed or
// deleted by hand are repaired, and objects created and deleted at once
// leave nothing behind.
func TestEngineOutlivesStreams(t *testing.T) {
	ctx := context.Background()
	e := newSyncEnv(t, "engine.example.com", "Barrel", "barrels", nil)
	const n = 100
	want := map[string]string{}
	var names []string
	for i := range n {
		name := fmt.Sprintf("barrel-%03d", i)
		want[name] = "v1"
		names = append(names, name)
	}
	e.createRemoteParallel(t, names)
	e.waitConverged(t, want)

	// A status round trip (local status → kcp) leaves the local copy alone.
	local := e.waitLocal(t, "default", "barrel-000", func(*unstructured.Unstructured) (bool, string) { return true, "" })
	_ = unstructured.SetNestedField(local.Object, "ready", "status", "phase")
	local, err := e.local.Namespace(local.GetNamespace()).UpdateStatus(ctx, local, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.waitRemote(t, "default", "barrel-000", func(u *unstructured.Unstructured, err error) (bool, string) {
		if err != nil {
			return false, err.Error()
		}
		p, _, _ := unstructured.NestedString(u.Object, "status", "phase")
		return p == "ready", "status.phase = " + p
	})

	// Settle: the finalizers and the status are in kcp; record both sides.
	time.Sleep(2 * time.Second)
	remoteBefore := e.remoteVersions(t)
	localBefore := map[string]string{}
	for name, st := range e.localState(t) {
		localBefore[name] = st[0]
	}
	if got := localBefore["barrel-000"]; got != local.GetResourceVersion() {
		t.Errorf("status round trip rewrote the local copy: resourceVersion %s after the status write, %s now", local.GetResourceVersion(), got)
	}
	listsBefore := e.engineStatus(t).GetKcpLists()

	// Kill the edge and start it again. (The first stream's inventory was
	// empty: the objects did not exist yet.)
	e.edge.Kill()
	restarted := time.Now()
	e.edge = e.startEdge(t)
	waitLogCount(t, e.broker.Process, 2*time.Minute, 1, "edge inventory complete", fmt.Sprintf(`"objects":%d`, n))
	t.Logf("inventory compared %s after the edge restart", time.Since(restarted).Round(time.Millisecond))
	// A change made now marks the point by which a spurious write would
	// have happened too.
	e.setRemoteField(t, "barrel-001", "v2")
	want["barrel-001"] = "v2"
	e.waitConverged(t, want)
	t.Logf("resynced and the marker change applied %s after the edge restart", time.Since(restarted).Round(time.Millisecond))
	localAfter := map[string]string{}
	for name, st := range e.localState(t) {
		localAfter[name] = st[0]
	}
	if c := changed(remoteBefore, e.remoteVersions(t), "barrel-001"); len(c) != 0 {
		t.Errorf("%d objects were written in kcp after the edge restart: %v", len(c), c)
	}
	if c := changed(localBefore, localAfter, "barrel-001"); len(c) != 0 {
		t.Errorf("%d local copies were written after the edge restart: %v", len(c), c)
	}
	if st := e.engineStatus(t); st.GetKcpLists() != listsBefore || st.GetAttachments() < 2 {
		t.Errorf("broker engine: %d lists in kcp before the edge restart, %d after (attachments %d); want no new list",
			listsBefore, st.GetKcpLists(), st.GetAttachments())
	}

	// Drift: a copy deleted by hand comes back; a field ferry owns changed
	// by hand is reset while a field another manager owns stays.
	gone := e.waitLocal(t, "default", "barrel-002", func(*unstructured.Unstructured) (bool, string) { return true, "" })
	if err := e.local.Namespace(gone.GetNamespace()).Delete(ctx, gone.GetName(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitLocal(t, "default", "barrel-002", func(u *unstructured.Unstructured) (bool, string) {
		return u.GetUID() != gone.GetUID(), "still the deleted copy (or none)"
	})
	edited := e.waitLocal(t, "default", "barrel-003", func(*unstructured.Unstructured) (bool, string) { return true, "" })
	patch := []byte(`{"apiVersion":"` + e.localGVR.GroupVersion().String() + `","kind":"Barrel","spec":{"region":"eu"}}`)
	if _, err := e.local.Namespace(edited.GetNamespace()).Patch(ctx, edited.GetName(), types.ApplyPatchType, patch,
		metav1.PatchOptions{FieldManager: "other-controller"}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.local.Namespace(edited.GetNamespace()).Patch(ctx, edited.GetName(), types.MergePatchType,
		[]byte(`{"spec":{"fieldV1":"edited-by-hand"}}`), metav1.PatchOptions{FieldManager: "kubectl-edit"}); err != nil {
		t.Fatal(err)
	}
	e.waitLocal(t, "default", "barrel-003", func(u *unstructured.Unstructured) (bool, string) {
		v, _ := specField(u, "fieldV1")
		r, _ := specField(u, "region")
		return v == "v1" && r == "eu", fmt.Sprintf("spec.fieldV1 = %q, spec.region = %q", v, r)
	})

	// The same for a copy this edge process applied (barrel-001, the
	// marker): the edge keeps no content of what it applied and asks the
	// broker for the desired state, within seconds.
	own := e.waitLocal(t, "default", "barrel-001", func(*unstructured.Unstructured) (bool, string) { return true, "" })
	repairStart := time.Now()
	if err := e.local.Namespace(own.GetNamespace()).Delete(ctx, own.GetName(), metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	own = e.waitLocal(t, "default", "barrel-001", func(u *unstructured.Unstructured) (bool, string) {
		v, _ := specField(u, "fieldV1")
		return u.GetUID() != own.GetUID() && v == "v2", fmt.Sprintf("uid %s, spec.fieldV1 = %q", u.GetUID(), v)
	})
	if took := time.Since(repairStart); took > 15*time.Second {
		t.Errorf("a copy this edge applied, deleted by hand, came back after %s", took)
	}
	repairStart = time.Now()
	if _, err := e.local.Namespace(own.GetNamespace()).Patch(ctx, own.GetName(), types.MergePatchType,
		[]byte(`{"spec":{"fieldV1":"edited-by-hand"}}`), metav1.PatchOptions{FieldManager: "kubectl-edit"}); err != nil {
		t.Fatal(err)
	}
	e.waitLocal(t, "default", "barrel-001", func(u *unstructured.Unstructured) (bool, string) {
		v, _ := specField(u, "fieldV1")
		return v == "v2", fmt.Sprintf("spec.fieldV1 = %q", v)
	})
	if took := time.Since(repairStart); took > 15*time.Second {
		t.Errorf("a copy this edge applied, edited by hand, was reset after %s", took)
	}
	t.Logf("copies this edge applied repaired within %s", time.Since(repairStart).Round(time.Millisecond))

	// Created and deleted at once: nothing left on either side. Three
	// rounds: kcp sometimes deletes an object whose finalizer the broker
	// added concurrently (kubernetes/kubernetes#77988), about one object in
	// a few hundred here; its copy must go too.
	for round := range 3 {
		var quick []string
		for i := range 100 {
			quick = append(quick, fmt.Sprintf("quick%d-%03d", round, i))
		}
		e.createRemoteParallel(t, quick)
		var wg sync.WaitGroup
		for _, name := range quick {
			wg.Go(func() {
				if err := e.remote.Namespace("default").Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	}
	err = framework.Eventually(ctx, 3*time.Minute, 250*time.Millisecond, func(context.Context) (bool, string) {
		left := 0
		for name := range e.remoteVersions(t) {
			if strings.HasPrefix(name, "quick") {
				left++
			}
		}
		var copies []string
		for name := range e.localState(t) {
			if strings.HasPrefix(name, "quick") {
				copies = append(copies, name)
			}
		}
		return left == 0 && len(copies) == 0, fmt.Sprintf("%d objects left in kcp (finalizers), local copies %v", left, copies)
	})
	if err != nil {
		t.Fatal(err)
	}
}

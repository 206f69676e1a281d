package kcp

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	apisv1alpha1 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/pkg/watching"
)

// sliceSource lists a workspace's endpoint slices and hands the test the
// watch to send changes on; it counts the watches started.
type sliceSource struct {
	items   []apisv1alpha1.APIExportEndpointSlice
	started atomic.Int32

	mu      sync.Mutex
	watches []*watch.FakeWatcher
	opened  chan struct{}
}

func newSliceSource(items ...*apisv1alpha1.APIExportEndpointSlice) *sliceSource {
	f := &sliceSource{opened: make(chan struct{}, 16)}
	for _, s := range items {
		f.items = append(f.items, *s)
	}
	return f
}

func (f *sliceSource) listWatch(workspace string) cache.ListerWatcher {
	f.started.Add(1)
	return watching.WithoutWatchList(&cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			return &apisv1alpha1.APIExportEndpointSliceList{ListMeta: metav1.ListMeta{ResourceVersion: "1"}, Items: f.items}, nil
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			w := watch.NewFakeWithChanSize(16, false)
			f.mu.Lock()
			f.watches = append(f.watches, w)
			f.mu.Unlock()
			f.opened <- struct{}{}
			return w, nil
		},
	})
}

// latest is the watch opened last, waiting for it.
func (f *sliceSource) latest(t *testing.T) *watch.FakeWatcher {
	t.Helper()
	select {
	case <-f.opened:
	case <-time.After(5 * time.Second):
		t.Fatal("no watch opened")
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.watches[len(f.watches)-1]
}

// endpointSlice is the slice kcp makes for the export named name.
func endpointSlice(name string, urls ...string) *apisv1alpha1.APIExportEndpointSlice {
	s := sliceWith(urls...)
	s.Name = name
	s.Spec.APIExport.Name = name
	return s
}

// recorder collects one subscriber's reports.
type recorder struct {
	mu  sync.Mutex
	got []VirtualWorkspace
}

func (r *recorder) report(vw VirtualWorkspace) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, vw)
}

func (r *recorder) last() (VirtualWorkspace, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.got) == 0 {
		return VirtualWorkspace{}, 0
	}
	return r.got[len(r.got)-1], len(r.got)
}

func (r *recorder) waitFor(t *testing.T, want VirtualWorkspace) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got, n := r.last()
		if n > 0 && got.Exists == want.Exists && slices.Equal(got.URLs, want.URLs) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("last report %+v (%d reports), want %+v", got, n, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestOneSliceWatchPerWorkspace: the engines of 50 exports in one
// workspace share one watch, each hears of its own slice only, and the
// watch stops with the last of them.
func TestOneSliceWatchPerWorkspace(t *testing.T) {
	const exports = 50
	var objs []*apisv1alpha1.APIExportEndpointSlice
	for i := range exports {
		objs = append(objs, endpointSlice(fmt.Sprintf("e%d", i), fmt.Sprintf("https://shard/services/apiexport/c/e%d", i)))
	}
	fake := newSliceSource(objs...)
	w := newSliceWatches(fake.listWatch, EndpointRewrite{})
	w.linger = 0 // stops with its last engine

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	recorders := make([]*recorder, exports)
	for i := range exports {
		recorders[i] = &recorder{}
		wg.Go(func() { w.watch(ctx, "root:provider", fmt.Sprintf("e%d", i), recorders[i].report) })
	}
	for i, r := range recorders {
		r.waitFor(t, VirtualWorkspace{Exists: true, URLs: []string{fmt.Sprintf("https://shard/services/apiexport/c/e%d", i)}})
	}
	if n := fake.started.Load(); n != 1 {
		t.Errorf("%d watches for one workspace, want 1", n)
	}

	// A change of one slice reaches its export's engine only.
	_, before := recorders[1].last()
	events := fake.latest(t)
	events.Modify(endpointSlice("e0", "https://shard/services/apiexport/c/e0", "https://shard-2/services/apiexport/c/e0"))
	recorders[0].waitFor(t, VirtualWorkspace{Exists: true, URLs: []string{"https://shard-2/services/apiexport/c/e0", "https://shard/services/apiexport/c/e0"}})
	events.Delete(endpointSlice("e0"))
	recorders[0].waitFor(t, VirtualWorkspace{Exists: false})
	if _, after := recorders[1].last(); after != before {
		t.Errorf("another export's engine heard %d reports of e0's changes", after-before)
	}

	// Handshakes read the watch while it runs.
	if slice, _, ok := w.lookup("root:provider", "e1"); !ok || slice == nil {
		t.Errorf("lookup of a watched export: %v, %t", slice, ok)
	}
	w.learnedLogicalCluster("root:provider", "c")
	if _, cluster, _ := w.lookup("root:provider", "e1"); cluster != "c" {
		t.Errorf("logical cluster %q, want the one learned", cluster)
	}

	cancel()
	wg.Wait()
	if _, _, ok := w.lookup("root:provider", "e1"); ok {
		t.Error("the watch runs on after its last engine stopped")
	}
	// The next engine starts a new watch, and learns the cluster again.
	ctx2, cancel2 := context.WithCancel(context.Background())
	defer cancel2()
	r := &recorder{}
	go w.watch(ctx2, "root:provider", "e1", r.report)
	r.waitFor(t, VirtualWorkspace{Exists: true, URLs: []string{"https://shard/services/apiexport/c/e1"}})
	if n := fake.started.Load(); n != 2 {
		t.Errorf("%d watches started, want a second one after the first stopped", n)
	}
	if _, cluster, ok := w.lookup("root:provider", "e1"); !ok || cluster != "" {
		t.Errorf("the new watch knows logical cluster %q: it must be read again", cluster)
	}
}

// TestSliceWatchReportsAnExportWithoutSlice: an engine of an export
// without a slice hears that there is none (it may be gone), and hears of
// the slice when kcp makes it.
func TestSliceWatchReportsAnExportWithoutSlice(t *testing.T) {
	fake := newSliceSource(endpointSlice("other"))
	w := newSliceWatches(fake.listWatch, EndpointRewrite{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// A first engine makes the watch list before the second subscribes.
	first := &recorder{}
	go w.watch(ctx, "root:provider", "other", first.report)
	first.waitFor(t, VirtualWorkspace{Exists: true})
	r := &recorder{}
	go w.watch(ctx, "root:provider", "e", r.report)
	r.waitFor(t, VirtualWorkspace{Exists: false})
	if slice, _, ok := w.lookup("root:provider", "e"); !ok || slice != nil {
		t.Errorf("lookup of an export without slice: %v, %t; want none, from the watch", slice, ok)
	}
	fake.latest(t).Add(endpointSlice("e", "https://shard/x"))
	r.waitFor(t, VirtualWorkspace{Exists: true, URLs: []string{"https://shard/x"}})
}

// TestResolveReadsNothingWhileTheWorkspaceIsWatched: once an engine of the
// workspace runs (its slices watched) and a handshake learned the logical
// cluster, the handshakes of the workspace's other exports read nothing;
// an export without a slice is read in kcp (it may be gone).
func TestResolveReadsNothingWhileTheWorkspaceIsWatched(t *testing.T) {
	client := workspaceWithExports(3)
	src := newSliceSource(endpointSlice("export-0"), endpointSlice("export-1", "https://shard/services/apiexport/x/export-1"))
	r := NewResolver(client, EndpointRewrite{})
	r.slices = newSliceWatches(src.listWatch, EndpointRewrite{})

	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	rec := &recorder{}
	go r.WatchVirtualWorkspace(ctx, config.APIExportRef{Workspace: testWorkspace, Name: "export-0"}, rec.report)
	rec.waitFor(t, VirtualWorkspace{Exists: true})

	// The first handshake since the watch started reads (and teaches the
	// watch the logical cluster); the next ones read nothing.
	if _, err := r.Resolve(t.Context(), config.APIExportRef{Workspace: testWorkspace, Name: "export-0"}); err != nil {
		t.Fatal(err)
	}
	reads := client.reads.Load()
	got, err := r.Resolve(t.Context(), config.APIExportRef{Workspace: testWorkspace, Name: "export-1"})
	if err != nil || got.LogicalCluster != testCluster || !slices.Equal(got.VirtualWorkspaceURLs, []string{"https://shard/services/apiexport/x/export-1"}) {
		t.Errorf("export-1 from the watch: %+v, %v", got, err)
	}
	if n := client.reads.Load() - reads; n != 0 {
		t.Errorf("%d reads for a handshake of a watched export, want none", n)
	}
	// No slice in the watch: read kcp.
	if _, err := r.Resolve(t.Context(), config.APIExportRef{Workspace: testWorkspace, Name: "export-2"}); err != nil {
		t.Fatal(err)
	}
	if n := client.reads.Load() - reads; n != 1 {
		t.Errorf("%d LogicalCluster reads for an export without a slice, want 1 (read in kcp)", n)
	}
}

// TestASliceOfAnotherExportIsNoSlice: a slice under the export's name
// that points at another export proves nothing: the engine hears of no
// slice and a handshake reads kcp.
func TestASliceOfAnotherExportIsNoSlice(t *testing.T) {
	client := workspaceWithExports(1)
	impostor := endpointSlice("export-0", "https://elsewhere/services/apiexport/y/other")
	impostor.Spec.APIExport.Name = "other"
	src := newSliceSource(impostor)
	r := NewResolver(client, EndpointRewrite{})
	r.slices = newSliceWatches(src.listWatch, EndpointRewrite{})
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	rec := &recorder{}
	go r.WatchVirtualWorkspace(ctx, config.APIExportRef{Workspace: testWorkspace, Name: "export-0"}, rec.report)
	rec.waitFor(t, VirtualWorkspace{Exists: false})
	r.slices.learnedLogicalCluster(testWorkspace, testCluster)
	reads := client.reads.Load()
	if _, err := r.Resolve(t.Context(), config.APIExportRef{Workspace: testWorkspace, Name: "export-0"}); err != nil {
		t.Fatal(err)
	}
	if n := client.reads.Load() - reads; n != 1 {
		t.Errorf("%d reads: a handshake trusted another export's slice", n)
	}
}

// TestSliceWatchLingersAfterAHandshake: the watch a handshake started (no
// engine yet) runs on for the linger, so the engine that attaches next
// finds it listed; without anyone it stops after the linger.
func TestSliceWatchLingersAfterAHandshake(t *testing.T) {
	src := newSliceSource(endpointSlice("e", "https://shard/x"))
	w := newSliceWatches(src.listWatch, EndpointRewrite{})
	w.linger = 200 * time.Millisecond
	ws := w.hold("root:provider")
	slice, _, listed := w.listedState(t.Context(), ws, "e", 5*time.Second)
	if !listed || !isSliceOf(slice, "e") {
		t.Fatalf("the handshake's wait: %v, listed %t", slice, listed)
	}
	w.release("root:provider", ws)
	rec := &recorder{}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.watch(ctx, "root:provider", "e", rec.report)
	}()
	rec.waitFor(t, VirtualWorkspace{Exists: true, URLs: []string{"https://shard/x"}})
	if n := src.started.Load(); n != 1 {
		t.Errorf("%d watches: the engine after the handshake started its own", n)
	}
	cancel()
	<-done
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, _, ok := w.lookup("root:provider", "e"); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the watch runs on long after its linger")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// lookup (tests) is what the running, listed watch of workspace knows of export:
// its slice (nil: none) and the workspace's logical cluster ("" when no
// handshake read it yet); ok is false without such a watch.
func (w *sliceWatches) lookup(workspace, export string) (slice *apisv1alpha1.APIExportEndpointSlice, logicalCluster string, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	ws, running := w.byWorkspace[workspace]
	if !running || !ws.informer.HasSynced() {
		return nil, "", false
	}
	return current(ws.informer, export), ws.logicalCluster, true
}

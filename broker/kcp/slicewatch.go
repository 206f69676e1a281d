package kcp

import (
	"context"
	"sync"
	"time"

	apisv1alpha1 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha1"
	kcpclientset "github.com/kcp-dev/kcp/sdk/client/clientset/versioned/cluster"
	"github.com/kcp-dev/logicalcluster/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/ferry-dev/ferry/pkg/watching"
)

// sliceWatches shares one watch of a workspace's APIExportEndpointSlices
// among every engine of an export in that workspace, and answers the
// handshakes of those exports from it: a thousand exports in one provider
// workspace cost kcp one watch, not a thousand, and a storm of their
// edges reads one list per workspace, not a slice per edge. A workspace's
// watch runs while an engine of one of its exports runs or a handshake
// waits for it, and lingers a little after the last (a handshake's engine
// attaches right after it).
type sliceWatches struct {
	listWatch func(workspace string) cache.ListerWatcher
	rewrite   EndpointRewrite
	linger    time.Duration

	mu          sync.Mutex
	byWorkspace map[string]*workspaceSlices
}

// sliceWatchLinger is how long a workspace's watch runs on without
// engines or handshakes.
const sliceWatchLinger = time.Minute

func newSliceWatches(listWatch func(workspace string) cache.ListerWatcher, rewrite EndpointRewrite) *sliceWatches {
	return &sliceWatches{listWatch: listWatch, rewrite: rewrite, linger: sliceWatchLinger, byWorkspace: map[string]*workspaceSlices{}}
}

// kcpSliceListWatch lists and watches the endpoint slices of a workspace.
func kcpSliceListWatch(client kcpclientset.ClusterInterface) func(workspace string) cache.ListerWatcher {
	return func(workspace string) cache.ListerWatcher {
		slices := client.Cluster(logicalcluster.NewPath(workspace)).ApisV1alpha1().APIExportEndpointSlices()
		// List, then watch (package watching): a handful of small objects.
		return watching.WithoutWatchList(&cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return slices.List(ctx, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return slices.Watch(ctx, o)
			},
		})
	}
}

// workspaceSlices is one workspace's watch and who listens to it.
type workspaceSlices struct {
	informer cache.SharedIndexInformer
	cancel   context.CancelFunc
	// subscribers by export name; guarded by sliceWatches.mu, and
	// every report is made under it, so reports of one export never
	// overtake each other.
	subscribers map[string]map[*endpointReporter]struct{}
	// listed is closed once the informer has listed.
	listed chan struct{}
	// holders are the engines and waiting handshakes using the watch;
	// at zero it stops after the linger (idle).
	holders int
	idle    *time.Timer
	// logicalCluster is the workspace's, once a handshake read it; kept
	// while the watch runs.
	logicalCluster string
}

// watch reports ref's virtual workspace to onChange on every change until
// ctx ends (blocking), as Resolver.WatchVirtualWorkspace.
func (w *sliceWatches) watch(ctx context.Context, workspace, export string, onChange func(VirtualWorkspace)) {
	rep := newEndpointReporter(w.rewrite, onChange)
	rep.export = export
	w.mu.Lock()
	ws := w.holdLocked(workspace)
	if ws.subscribers[export] == nil {
		ws.subscribers[export] = map[*endpointReporter]struct{}{}
	}
	ws.subscribers[export][rep] = struct{}{}
	if ws.informer.HasSynced() {
		rep.observe(current(ws.informer, export))
	}
	w.mu.Unlock()

	<-ctx.Done()

	w.mu.Lock()
	defer w.mu.Unlock()
	delete(ws.subscribers[export], rep)
	if len(ws.subscribers[export]) == 0 {
		delete(ws.subscribers, export)
	}
	w.releaseLocked(workspace, ws)
}

// hold returns workspace's watch, started if needed, held until release.
func (w *sliceWatches) hold(workspace string) *workspaceSlices {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.holdLocked(workspace)
}

func (w *sliceWatches) release(workspace string, ws *workspaceSlices) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.releaseLocked(workspace, ws)
}

func (w *sliceWatches) holdLocked(workspace string) *workspaceSlices {
	ws, ok := w.byWorkspace[workspace]
	if !ok {
		ws = w.start(workspace)
	}
	ws.holders++
	if ws.idle != nil {
		ws.idle.Stop()
		ws.idle = nil
	}
	return ws
}

func (w *sliceWatches) releaseLocked(workspace string, ws *workspaceSlices) {
	ws.holders--
	if ws.holders > 0 || w.byWorkspace[workspace] != ws {
		return
	}
	stop := func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if ws.holders == 0 && w.byWorkspace[workspace] == ws {
			ws.cancel()
			delete(w.byWorkspace, workspace)
		}
	}
	if w.linger <= 0 {
		ws.cancel()
		delete(w.byWorkspace, workspace)
		return
	}
	ws.idle = time.AfterFunc(w.linger, stop)
}

// waitListed waits until ws has listed, at most wait or until ctx ends,
// and tells whether it has.
func waitListed(ctx context.Context, ws *workspaceSlices, wait time.Duration) bool {
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ws.listed:
		return true
	case <-t.C:
		return false
	case <-ctx.Done():
		return false
	}
}

// listedState is, once ws has listed (waiting at most wait), export's
// slice there and the workspace's logical cluster as learned ("" if not
// yet); ok is false when it has not listed in time.
func (w *sliceWatches) listedState(ctx context.Context, ws *workspaceSlices, export string, wait time.Duration) (slice *apisv1alpha1.APIExportEndpointSlice, logicalCluster string, ok bool) {
	if !waitListed(ctx, ws, wait) {
		return nil, "", false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return current(ws.informer, export), ws.logicalCluster, true
}

// start runs workspace's watch; w.mu is held.
func (w *sliceWatches) start(workspace string) *workspaceSlices {
	ctx, cancel := context.WithCancel(context.Background())
	ws := &workspaceSlices{
		informer:    cache.NewSharedIndexInformer(w.listWatch(workspace), &apisv1alpha1.APIExportEndpointSlice{}, 0, cache.Indexers{}),
		cancel:      cancel,
		subscribers: map[string]map[*endpointReporter]struct{}{},
		listed:      make(chan struct{}),
	}
	// The transform keeps the cache small: a slice's name and endpoints
	// are all that is read.
	_ = ws.informer.SetTransform(func(obj any) (any, error) {
		if s, ok := obj.(*apisv1alpha1.APIExportEndpointSlice); ok {
			s.ManagedFields = nil
		}
		return obj, nil
	})
	report := func(obj any) {
		name := sliceName(obj)
		w.mu.Lock()
		defer w.mu.Unlock()
		// The store's current state, not the event's object: a
		// subscriber that joined after the store moved on has seen it
		// already, and an older event must not take it back.
		state := current(ws.informer, name)
		for rep := range ws.subscribers[name] {
			rep.observe(state)
		}
	}
	_, _ = ws.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    report,
		UpdateFunc: func(_, obj any) { report(obj) },
		DeleteFunc: report,
	})
	w.byWorkspace[workspace] = ws
	go ws.informer.RunWithContext(ctx)
	go func() {
		// One wait per workspace, however many handshakes wait.
		if cache.WaitForCacheSync(ctx.Done(), ws.informer.HasSynced) {
			close(ws.listed)
		}
	}()
	return ws
}

// learnedLogicalCluster records workspace's logical cluster in its running
// watch, if any.
func (w *sliceWatches) learnedLogicalCluster(workspace, cluster string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if ws, ok := w.byWorkspace[workspace]; ok {
		ws.logicalCluster = cluster
	}
}

// current is the cached slice named name (nil when there is none).
func current(informer cache.SharedIndexInformer, name string) *apisv1alpha1.APIExportEndpointSlice {
	obj, exists, err := informer.GetStore().GetByKey(name)
	if err != nil || !exists {
		return nil
	}
	s, _ := obj.(*apisv1alpha1.APIExportEndpointSlice)
	return s
}

func sliceName(obj any) string {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if s, ok := obj.(*apisv1alpha1.APIExportEndpointSlice); ok {
		return s.Name
	}
	return ""
}

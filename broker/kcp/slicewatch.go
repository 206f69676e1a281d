package kcp

import (
	"context"
	"sync"

	apisv1alpha1 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha1"
	kcpclientset "github.com/kcp-dev/kcp/sdk/client/clientset/versioned/cluster"
	"github.com/kcp-dev/logicalcluster/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"
)

// sliceWatches shares one watch of a workspace's APIExportEndpointSlices
// among every engine of an export in that workspace, and answers the
// handshakes of those exports from it: a thousand exports in one provider
// workspace cost kcp one watch, not a thousand, and a storm of their
// edges reads nothing once the watch has listed. A workspace's watch runs
// while an engine of one of its exports runs.
type sliceWatches struct {
	listWatch func(workspace string) cache.ListerWatcher
	rewrite   EndpointRewrite

	mu          sync.Mutex
	byWorkspace map[string]*workspaceSlices
}

func newSliceWatches(listWatch func(workspace string) cache.ListerWatcher, rewrite EndpointRewrite) *sliceWatches {
	return &sliceWatches{listWatch: listWatch, rewrite: rewrite, byWorkspace: map[string]*workspaceSlices{}}
}

// kcpSliceListWatch lists and watches the endpoint slices of a workspace.
func kcpSliceListWatch(client kcpclientset.ClusterInterface) func(workspace string) cache.ListerWatcher {
	return func(workspace string) cache.ListerWatcher {
		slices := client.Cluster(logicalcluster.NewPath(workspace)).ApisV1alpha1().APIExportEndpointSlices()
		return &cache.ListWatch{
			ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
				return slices.List(ctx, o)
			},
			WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
				return slices.Watch(ctx, o)
			},
		}
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
	count       int
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
	ws, ok := w.byWorkspace[workspace]
	if !ok {
		ws = w.start(workspace)
	}
	if ws.subscribers[export] == nil {
		ws.subscribers[export] = map[*endpointReporter]struct{}{}
	}
	ws.subscribers[export][rep] = struct{}{}
	ws.count++
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
	ws.count--
	if ws.count == 0 && w.byWorkspace[workspace] == ws {
		ws.cancel()
		delete(w.byWorkspace, workspace)
	}
}

// start runs workspace's watch; w.mu is held.
func (w *sliceWatches) start(workspace string) *workspaceSlices {
	ctx, cancel := context.WithCancel(context.Background())
	ws := &workspaceSlices{
		informer:    cache.NewSharedIndexInformer(w.listWatch(workspace), &apisv1alpha1.APIExportEndpointSlice{}, 0, cache.Indexers{}),
		cancel:      cancel,
		subscribers: map[string]map[*endpointReporter]struct{}{},
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
	return ws
}

// lookup is what the running, listed watch of workspace knows of export:
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

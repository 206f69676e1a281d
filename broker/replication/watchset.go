package replication

import (
	"context"
	"strings"
	"sync/atomic"

	"github.com/ferry-dev/ferry/pkg/logging"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// The watch set: which published resources are watched in the virtual
// workspace (one unfiltered watch and cache per PublishedResource, plus the
// namespaces while a resource filters by them), their clients, and what
// starts, restarts and stops them.

type watcher struct {
	res   Resource
	store *shardedWatch
}

// SetVirtualWorkspace sets the APIExport's virtual workspace endpoints
// (sorted, without duplicates; none while kcp serves none): every watch
// starts at an endpoint added and stops at one removed. A removed
// endpoint's objects are not taken as deleted (see listedFor).
func (m *Manager) SetVirtualWorkspace(urls []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.endpoints.set(urls) {
		return
	}
	m.opts.Log.Info("virtual workspace endpoints", "endpoints", urls)
	for _, w := range m.running {
		w.store.follow(urls)
	}
	if m.namespaces != nil {
		m.namespaces.follow(urls)
	}
	for _, rw := range m.relWatchers {
		rw.store.follow(urls)
	}
	m.reconcileLocked()
}

// Endpoints returns the state of every current virtual workspace
// endpoint, by URL.
func (m *Manager) Endpoints() []EndpointState { return m.endpoints.states() }

// listedFor tells whether w's cache proves that an object of cluster it
// does not hold is gone from kcp: the watch at the endpoint where the
// workspace was seen has listed, or, for a workspace no watch has seen,
// the watches at every endpoint have. A workspace last seen at an endpoint
// that was removed proves nothing until a current endpoint shows it again:
// a shard drained or unreachable never makes its objects look deleted.
func (m *Manager) listedFor(w *shardedWatch, cluster string) bool {
	if url, ok := m.endpoints.home(cluster); ok {
		return w.listedAt(url)
	}
	return w.listed()
}

// watchDeps is what the manager's watches run on; m.ctx must be set.
func (m *Manager) watchDepsLocked() watchDeps {
	return watchDeps{ctx: m.ctx, endpoints: m.endpoints, lists: &m.lists, log: m.opts.Log}
}

// watchLocked starts watching gvr (objects whose labels match selector;
// "" is every object) at every current endpoint; see shardedWatch.
func (m *Manager) watchLocked(gvr schema.GroupVersionResource, selector string, indexers cache.Indexers, onChange func(key string), onListed func()) *shardedWatch {
	w := newShardedWatch(m.watchDepsLocked(), gvr, selector, indexers, onChange, onListed)
	urls, _ := m.endpoints.current()
	w.follow(urls)
	return w
}

// Ensure makes res synced, restarting its watch when it changed.
func (m *Manager) Ensure(res Resource) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if w, ok := m.running[res.PublishedResource]; ok {
		switch {
		case !sameWatch(w.res, res):
			m.stopLocked(res.PublishedResource)
		case !sameFilters(w.res, res):
			// The watch is unfiltered: a filter change only re-evaluates
			// which objects are in scope (those leaving it are released).
			w.res = res
			for _, k := range w.store.ListKeys() {
				m.queue.Add(item{pr: res.PublishedResource, key: k})
			}
		}
	}
	pr := res.PublishedResource
	if _, known := m.desired[pr]; !known {
		m.gateLocked(pr)
	}
	if m.withdrawn[pr] {
		// Published again: copies may have been deleted or changed
		// meanwhile; every object is compared and sent again.
		delete(m.withdrawn, pr)
		m.ledger.republished(pr)
		m.queueAllLocked(pr)
	}
	// A changed PublishedResource (e.g. a fixed mutation) may be what the
	// rejected objects waited for.
	for _, id := range m.ledger.rejectedOf(pr) {
		m.ledger.unreject(id)
		m.queue.Add(id.slot())
	}
	for it := range m.rejected {
		if it.pr == pr {
			delete(m.rejected, it)
			m.relSent.again(it)
			m.queue.Add(it)
		}
	}
	m.desired[pr] = res
	m.reconcileLocked()
	// The related[] entries may have changed: re-evaluate them.
	for _, s := range m.ledger.slotsApplied(pr) {
		m.queueRelatedLocked(s.pr, s.key)
	}
}

// queueAllLocked queues every cached object of pr and every slot where
// the edge may hold a copy.
func (m *Manager) queueAllLocked(pr string) {
	if w, ok := m.running[pr]; ok {
		for _, k := range w.store.ListKeys() {
			m.queue.Add(item{pr: pr, key: k})
		}
	}
	m.queueCopiesLocked(pr)
}

// sameWatch tells whether b can keep a's watch and cache.
func sameWatch(a, b Resource) bool {
	return a.GVR == b.GVR && a.HasStatus == b.HasStatus && a.WorkspacePaths == b.WorkspacePaths
}

// sameFilters tells whether a and b select the same objects.
func sameFilters(a, b Resource) bool {
	selectorString := func(s labels.Selector) string {
		if s == nil {
			return "<none>"
		}
		return s.String()
	}
	return selectorString(a.Selector) == selectorString(b.Selector) &&
		selectorString(a.NamespaceSelector) == selectorString(b.NamespaceSelector) &&
		a.NamespaceName == b.NamespaceName
}

// Withdraw withdraws a PublishedResource for now (it became invalid, or
// its edge paused it): nothing new is synced, but its watch stays and
// deletions still flow — an object deleted in kcp (or gone) still gets
// its copy deleted, and the edge's confirmation releases its finalizer.
// Ensure publishes it again. A resource the manager does not sync is left
// alone.
func (m *Manager) Withdraw(pr string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.desired[pr]; !ok || m.withdrawn[pr] {
		return
	}
	m.withdrawn[pr] = true
	// Deletions asked for before may have been refused meanwhile (their
	// confirmation raced the withdrawal): compared again.
	m.ledger.withdrawn(pr)
	m.queueAllLocked(pr)
	m.opts.Log.Info("published resource withdrawn; deletions still flow, nothing new is synced", logging.KeyPublishedResource, pr)
}

// Remove stops syncing a PublishedResource's objects and forgets them: its
// objects are released (ReleaseAll), or it was never served.
func (m *Manager) Remove(pr string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.desired, pr)
	delete(m.withdrawn, pr)
	delete(m.open, pr)
	delete(m.inventory, pr)
	delete(m.unlisted, pr)
	m.ledger.forget(pr)
	m.relSent.forgetResource(pr)
	for it := range m.rejected {
		if it.pr == pr {
			delete(m.rejected, it)
		}
	}
	m.stopLocked(pr)
	m.reconcileRelatedLocked()
}

func (m *Manager) stopLocked(pr string) {
	if w, ok := m.running[pr]; ok {
		w.store.stop()
		delete(m.running, pr)
	}
}

func (m *Manager) reconcileLocked() {
	if m.ctx == nil {
		return
	}
	for pr, res := range m.desired {
		if _, ok := m.running[pr]; ok {
			continue
		}
		w := &watcher{res: res}
		// Unfiltered: an object that leaves spec.filter must still be seen
		// (as out of scope, not as deleted), or its finalizer would stay.
		// m.listed waits for m.mu: w is running before it is called.
		w.store = m.watchLocked(res.GVR, "", primaryIndexers(), func(key string) { m.queue.Add(item{pr: pr, key: key}) }, func() { m.listed(pr, w) })
		m.running[pr] = w
		m.opts.Log.Info("watching published resource", logging.KeyPublishedResource, pr, "resource", res.GVR.String(), "filter", res.Selector.String())
	}
	m.reconcileNamespacesLocked()
	m.reconcileRelatedLocked()
}

// reconcileNamespacesLocked watches the consumer workspaces' namespaces
// while some resource filters by namespace labels (through the APIExport's
// "namespaces" permission claim).
func (m *Manager) reconcileNamespacesLocked() {
	needed := false
	for _, w := range m.running {
		needed = needed || w.res.NamespaceSelector != nil
	}
	switch {
	case needed && m.namespaces == nil:
		m.namespaces = m.watchLocked(namespacesGVR, "", nil, m.namespaceChanged, nil)
	case !needed && m.namespaces != nil:
		m.namespaces.stop()
		m.namespaces = nil
	}
}

// namespaceChanged re-evaluates the objects in a namespace whose labels
// changed, for resources that filter by namespace.
func (m *Manager) namespaceChanged(nsKey string) {
	prefix := inNamespaceKeyPrefix(parseStoreKey(nsKey))
	m.mu.Lock()
	defer m.mu.Unlock()
	for pr, w := range m.running {
		if w.res.NamespaceSelector == nil {
			continue
		}
		for _, k := range w.store.ListKeys() {
			if strings.HasPrefix(k, prefix) {
				m.queue.Add(item{pr: pr, key: k})
			}
		}
	}
}

// client returns a client for cluster at the endpoint that serves it
// (endpointSet.client).
func (m *Manager) client(cluster string) (dynamic.Interface, error) {
	return m.endpoints.client(cluster)
}

func (m *Manager) resourceClient(key *ferryv1.ObjectKey) (dynamic.ResourceInterface, error) {
	c, err := m.client(key.GetCluster())
	if err != nil {
		return nil, err
	}
	r := key.GetResource()
	return c.Resource(schema.GroupVersionResource{Group: r.GetGroup(), Version: r.GetVersion(), Resource: r.GetResource()}).Namespace(key.GetNamespace()), nil
}

// countLists counts the lists lw makes in lists.
func countLists(lists *atomic.Uint64, lw *cache.ListWatch) *cache.ListWatch {
	list := lw.ListWithContextFunc
	lw.ListWithContextFunc = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		lists.Add(1)
		return list(ctx, o)
	}
	return lw
}

// listed is called each time w, pr's watcher, has listed its objects at
// an endpoint (shardedWatch.onListed).
func (m *Manager) listed(pr string, w *watcher) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.running[pr] != w {
		return // replaced meanwhile
	}
	all := w.store.listed()
	m.opts.Log.Info("published resource listed", logging.KeyPublishedResource, pr, logging.KeyObjects, w.store.Len(), "everyEndpoint", all)
	// The edge's inventory is compared only once every endpoint has
	// listed: before, a copy whose workspace's shard has not listed would
	// look gone.
	if entries, ok := m.unlisted[pr]; ok && all {
		delete(m.unlisted, pr)
		m.compareInventoryLocked(pr, w, entries)
	}
	// Objects that went while nobody watched are known gone now (on the
	// shards that have listed: see listedFor).
	m.queueCopiesLocked(pr)
}

// Objects is the number of published objects in the manager's caches.
func (m *Manager) Objects() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, w := range m.running {
		n += w.store.Len()
	}
	return n
}

// ObjectsByResource is Objects per PublishedResource.
func (m *Manager) ObjectsByResource() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]int, len(m.running))
	for pr, w := range m.running {
		out[pr] = w.store.Len()
	}
	return out
}

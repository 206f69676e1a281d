package replication

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"

	"github.com/ferry-dev/ferry/pkg/logging"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/watching"
)

// The watch set: which published resources are watched in the virtual
// workspace (one unfiltered watch and cache per PublishedResource, plus the
// namespaces while a resource filters by them), their clients, and what
// starts, restarts and stops them.

type watcher struct {
	res    Resource
	store  cache.Indexer
	cancel context.CancelFunc
	synced atomic.Bool // the initial list is in store
}

// SetVirtualWorkspace sets the APIExport's virtual workspace URL ("" while
// there is none); watches (re)start accordingly.
func (m *Manager) SetVirtualWorkspace(url string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.vwKnown = true
	if url == m.vwURL {
		return
	}
	m.vwURL = url
	for pr := range m.running {
		m.stopLocked(pr)
	}
	for gvr, rw := range m.relWatchers {
		rw.cancel()
		delete(m.relWatchers, gvr)
	}
	clear(m.clients)
	m.reconcileLocked()
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
		selectorString(a.NamespaceSelector) == selectorString(b.NamespaceSelector)
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
		w.cancel()
		delete(m.running, pr)
	}
}

func (m *Manager) reconcileLocked() {
	if m.ctx == nil || m.vwURL == "" {
		return
	}
	for pr, res := range m.desired {
		if _, ok := m.running[pr]; ok {
			continue
		}
		w := &watcher{res: res, store: newStore()}
		// Unfiltered: an object that leaves spec.filter must still be seen
		// (as out of scope, not as deleted), or its finalizer would stay.
		// m.listed waits for m.mu: w is running before it is called.
		cancel, ok := m.watchLocked(res.GVR, "", w.store, func(key string) { m.queue.Add(item{pr: pr, key: key}) }, func() { m.listed(pr, w) })
		if !ok {
			return
		}
		w.cancel = cancel
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
	case needed && m.namespacesCancel == nil:
		store := newStore()
		if cancel, ok := m.watchLocked(namespacesGVR, "", store, m.namespaceChanged, nil); ok {
			m.namespaces, m.namespacesCancel = store, cancel
		}
	case !needed && m.namespacesCancel != nil:
		m.namespacesCancel()
		m.namespaces, m.namespacesCancel = nil, nil
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

// watchLocked starts a watch of gvr across all workspaces (objects whose
// labels match selector; "" is every object) into store, calling onChange
// and onSynced like runInformer, until the returned cancel or the
// manager's context ends; false when the virtual workspace client cannot
// be built (logged).
func (m *Manager) watchLocked(gvr schema.GroupVersionResource, selector string, store cache.Indexer, onChange func(key string), onSynced func()) (context.CancelFunc, bool) {
	dyn, err := m.clientLocked("*")
	if err != nil {
		m.opts.Log.Error(err, "cannot build a virtual workspace client")
		return nil, false
	}
	ctx, cancel := context.WithCancel(m.ctx)
	go runInformer(ctx, m.countLists(watching.ListWatch(dyn.Resource(gvr), selector)), store, onChange, onSynced)
	return cancel, true
}

// clientLocked returns a dynamic client for cluster ("*" for all) through
// the virtual workspace.
func (m *Manager) clientLocked(cluster string) (dynamic.Interface, error) {
	if c, ok := m.clients[cluster]; ok {
		return c, nil
	}
	cfg := rest.CopyConfig(m.opts.KCP)
	cfg.Host = m.vwURL + "/clusters/" + cluster
	var c dynamic.Interface
	var err error
	if m.opts.NewClient != nil {
		c, err = m.opts.NewClient(cfg)
	} else {
		c, err = dynamic.NewForConfig(cfg)
	}
	if err != nil {
		return nil, err
	}
	m.clients[cluster] = c
	return c, nil
}

func (m *Manager) client(cluster string) (dynamic.Interface, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.vwURL == "" {
		return nil, errors.New("the APIExport's virtual workspace is not served yet")
	}
	return m.clientLocked(cluster)
}

func (m *Manager) resourceClient(key *ferryv1.ObjectKey) (dynamic.ResourceInterface, error) {
	c, err := m.client(key.GetCluster())
	if err != nil {
		return nil, err
	}
	r := key.GetResource()
	return c.Resource(schema.GroupVersionResource{Group: r.GetGroup(), Version: r.GetVersion(), Resource: r.GetResource()}).Namespace(key.GetNamespace()), nil
}

// countLists counts the lists lw makes.
func (m *Manager) countLists(lw *cache.ListWatch) *cache.ListWatch {
	list := lw.ListWithContextFunc
	lw.ListWithContextFunc = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		m.lists.Add(1)
		return list(ctx, o)
	}
	return lw
}

// listed is called once w, pr's watcher, has listed its objects.
func (m *Manager) listed(pr string, w *watcher) {
	w.synced.Store(true)
	m.opts.Log.Info("published resource listed", logging.KeyPublishedResource, pr, logging.KeyObjects, len(w.store.ListKeys()))
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.running[pr] != w {
		return // replaced meanwhile
	}
	if entries, ok := m.unlisted[pr]; ok {
		delete(m.unlisted, pr)
		m.compareInventoryLocked(pr, w, entries)
	}
	// Objects that went while nobody watched are known gone now.
	m.queueCopiesLocked(pr)
}

// Objects is the number of published objects in the manager's caches.
func (m *Manager) Objects() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	n := 0
	for _, w := range m.running {
		n += len(w.store.ListKeys())
	}
	return n
}

// ObjectsByResource is Objects per PublishedResource.
func (m *Manager) ObjectsByResource() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[string]int, len(m.running))
	for pr, w := range m.running {
		out[pr] = len(w.store.ListKeys())
	}
	return out
}

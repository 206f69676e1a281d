// Package replication is the broker's half of object sync for one APIExport:
// for every published resource it watches the APIExport's virtual workspace
// across all bound workspaces (…/clusters/*), puts the broker's finalizer on
// each object, turns every object state into a sync intent in the export's
// Intents outbox, and applies what the edge reports back (status, deletion
// confirmations) to the objects in kcp.
//
// A Manager outlives the edge's streams: its caches, the outbox and what the
// edge is known to have applied (content hashes) stay when a stream ends, so
// a reconnect costs an inventory comparison, not a re-list from kcp.
//
// Watches start when the virtual workspace URL is known and the resource is
// published, and stop when it is withdrawn — no restart needed.
package replication

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/ferry-dev/ferry/pkg/logging"

	"github.com/go-logr/logr"
	"github.com/kcp-dev/logicalcluster/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/kcp"
	"github.com/ferry-dev/ferry/pkg/metrics"
	"github.com/ferry-dev/ferry/pkg/objects"
	"github.com/ferry-dev/ferry/pkg/refindex"
	"github.com/ferry-dev/ferry/pkg/related"
	"github.com/ferry-dev/ferry/pkg/watching"
)

// Resource is a published resource to sync.
type Resource struct {
	// PublishedResource is the edge's PublishedResource name.
	PublishedResource string
	// GVR is the resource as served in kcp.
	GVR schema.GroupVersionResource
	// HasStatus tells whether status is written back.
	HasStatus bool
	// Selector filters objects by their labels (spec.filter.resource).
	Selector labels.Selector
	// WorkspacePaths sends each object's workspace path along
	// (spec.enableWorkspacePaths).
	WorkspacePaths bool
	// NamespaceSelector, when set, syncs only objects whose namespace's
	// labels match (spec.filter.namespace).
	NamespaceSelector labels.Selector
	// Related are the compiled spec.related entries.
	Related []*related.Reference
}

// Options configure a Manager. All fields are required unless they say
// otherwise.
type Options struct {
	// KCP is the broker's kcp rest config; the host is replaced by the
	// virtual workspace URL.
	KCP *rest.Config
	// EdgeName is the edge's name in the broker's configuration; the
	// finalizer is "ferry.dev/<name>".
	EdgeName string
	// Outbox receives the intents.
	Outbox *Intents
	// Log receives logs.
	Log logr.Logger
	// InventoryGate, when positive, holds each resource's intents after a
	// stream attaches until the edge's inventory for it is complete, or for
	// at most this long.
	InventoryGate time.Duration
	// Metrics of the export; nil records none.
	Metrics *metrics.Export
	// RelatedListWait bounds how long the release of a deleted object
	// waits for the watch of a service-origin related kind to list;
	// zero is one minute.
	RelatedListWait time.Duration
	// NewClient makes the dynamic client for a virtual workspace
	// endpoint (KCP with the host replaced); nil is dynamic.NewForConfig.
	// Tests serve a fake kcp through it, so they reach the manager's
	// state through its real watches.
	NewClient func(*rest.Config) (dynamic.Interface, error)
}

// Manager runs one session's watches. Create with NewManager, then Run.
type Manager struct {
	opts      Options
	finalizer string
	// lists counts the initial lists (and re-lists) made in kcp.
	lists atomic.Uint64
	// refused counts edge messages refused because their claim did not
	// hold (see Refused).
	refused atomic.Uint64
	queue   workqueue.TypedRateLimitingInterface[item]
	// finalizers holds the primaries whose finalizer is to be written in
	// kcp: written by workers of their own, off the way of intents to the
	// edge (an upsert never waits for it, a delete never queues behind
	// it). Bounded: one entry per object.
	finalizers workqueue.TypedRateLimitingInterface[item]
	// nacks spaces out retries of intents the edge could not apply.
	nacks workqueue.TypedRateLimiter[item]

	mu    sync.Mutex
	ctx   context.Context
	vwURL string
	// vwKnown: the URL was observed at least once ("" included).
	vwKnown bool
	desired map[string]Resource
	running map[string]*watcher
	clients map[string]dynamic.Interface
	// open tells, per PublishedResource, whether its upserts may be sent
	// (inventory complete, or gating off or timed out).
	open map[string]bool
	// withdrawn holds the PublishedResources withdrawn for now (invalid, or
	// paused by the edge): their watch stays and deletions still flow, but
	// nothing new is synced.
	withdrawn map[string]bool
	// inventory collects, per PublishedResource, the chunks of the current
	// stream's inventory: object → applied content hash.
	inventory map[string]map[objectID]string
	// inventoried records PublishedResources whose inventory was complete on
	// the current stream: the edge sends it once, so a later re-Ensure must
	// not wait for it again.
	inventoried map[string]bool
	// unlisted holds complete inventories that arrived before their
	// PublishedResource's cache was listed (a restarted broker): compared
	// once it is, or every object would be sent again.
	unlisted map[string]map[objectID]string
	// attached tells whether an edge stream is attached; gates close on
	// every attach.
	attached bool
	// resyncSince is when the current comparison with the edge's inventory
	// began: the stream's attachment, or an admin Resync (resync duration).
	resyncSince time.Time
	// resyncing holds the objects compared with the edge's inventory and
	// not processed since, for the resync metrics (only with Metrics).
	resyncing map[item]struct{}
	// ledger records, per primary object (whole identity, UID included),
	// what the edge applied, what was queued, and whether the edge may hold
	// a copy; it outlives streams. An object that leaves kcp without a
	// confirmed deletion still gets a delete intent from it: kcp can delete
	// an object whose finalizer was added concurrently with the delete
	// (kubernetes/kubernetes#77988), and a copy of an object deleted while
	// the broker was down is only known from the inventory.
	ledger *ledger
	// paths caches workspace paths by logical cluster (they never change).
	paths map[string]string
	// namespaces holds the consumer workspaces' namespaces while any
	// resource filters by namespace labels.
	namespaces       cache.Indexer
	namespacesCancel context.CancelFunc

	// related objects (related.go)
	relWatchers map[schema.GroupVersionResource]*relatedWatcher
	relRefs     *refindex.Index[item] // where each kcp-origin reference points
	// relSent records what the edge holds or was sent per kcp-origin
	// reference on this stream (related_sent.go).
	relSent *relatedSent
	// rejected holds references whose last intent the edge refused with a
	// final error: not sent again until the kcp object or the
	// PublishedResource changes (Ensure). Primaries: the ledger.
	rejected map[item]struct{}
	relNotes map[item]string // last Event message per reference
	// relReports holds the latest report per service-origin reference and
	// relCopies which reference each copy in kcp belongs to: a copy changed
	// or deleted in kcp is written again from the report.
	relReports map[item]*ferryv1.RelatedObjectReport
	relCopies  map[string]item

	// resyncActive is the resync an admin asked for, while it runs;
	// resyncLast the last one (resync.go).
	resyncActive, resyncLast *Resync
}

// item is a primary object (related empty) or one of its related[]
// references.
type item struct{ pr, key, related string }

type watcher struct {
	res    Resource
	store  cache.Indexer
	cancel context.CancelFunc
	synced atomic.Bool // the initial list is in store
}

// NewManager returns a manager; nothing runs before Run.
func NewManager(o Options) *Manager {
	return &Manager{
		opts:      o,
		finalizer: config.FinalizerPrefix + o.EdgeName,
		queue:     workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[item](), workqueue.TypedRateLimitingQueueConfig[item]{Name: "replicate"}),
		finalizers: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.NewTypedItemExponentialFailureRateLimiter[item](10*time.Millisecond, 10*time.Second),
			workqueue.TypedRateLimitingQueueConfig[item]{Name: "finalizers"}),
		nacks:       workqueue.NewTypedItemExponentialFailureRateLimiter[item](time.Second, 5*time.Minute),
		desired:     map[string]Resource{},
		running:     map[string]*watcher{},
		clients:     map[string]dynamic.Interface{},
		open:        map[string]bool{},
		withdrawn:   map[string]bool{},
		inventory:   map[string]map[objectID]string{},
		ledger:      newLedger(),
		resyncing:   map[item]struct{}{},
		inventoried: map[string]bool{},
		unlisted:    map[string]map[objectID]string{},
		paths:       map[string]string{},
		relWatchers: map[schema.GroupVersionResource]*relatedWatcher{},
		relRefs:     refindex.New[item](),
		relSent:     newRelatedSent(),
		rejected:    map[item]struct{}{},
		relNotes:    map[item]string{},
		relReports:  map[item]*ferryv1.RelatedObjectReport{},
		relCopies:   map[string]item{},
	}
}

// Run processes objects with workers goroutines, and writes finalizers
// with as many others, until ctx ends; watches stop with it.
func (m *Manager) Run(ctx context.Context, workers int) {
	m.start(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		watching.RunWorkers(ctx, m.finalizers, workers, func() bool { return m.processNextFinalizer(ctx) })
	})
	watching.RunWorkers(ctx, m.queue, workers, func() bool { return m.processNext(ctx) })
	wg.Wait()
}

// start starts the watches under ctx (they stop with it); Run's workers
// process what they queue.
func (m *Manager) start(ctx context.Context) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.ctx = ctx
	m.reconcileLocked()
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

// gateLocked closes pr's gate until its inventory is complete or the gate
// times out (the timer ends with the manager's context).
func (m *Manager) gateLocked(pr string) {
	if m.opts.InventoryGate <= 0 || m.inventoried[pr] || !m.attached || m.ctx == nil {
		m.open[pr] = true
		return
	}
	m.open[pr] = false
	m.afterLocked(m.opts.InventoryGate, func() {
		if open, ok := m.open[pr]; ok && !open {
			m.opts.Log.Info("no complete inventory from the edge in time; comparing with what is known", logging.KeyPublishedResource, pr)
			m.openLocked(pr)
		}
	})
}

// afterLocked calls f, with m.mu held, once d has passed, unless the
// manager's context ends first (without a context, never).
func (m *Manager) afterLocked(d time.Duration, f func()) {
	if m.ctx == nil {
		return
	}
	ctx := m.ctx
	go func() {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.mu.Lock()
		defer m.mu.Unlock()
		f()
	}()
}

// Attach prepares for a new edge stream: unanswered intents are sent again,
// and every resource waits for the edge's inventory before anything else is
// sent (the edge may have lost or changed local copies meanwhile).
func (m *Manager) Attach() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.attached = true
	m.resyncSince = time.Now()
	clear(m.resyncing)
	clear(m.inventoried)
	clear(m.inventory)
	clear(m.unlisted)
	m.ledger.streamAttached()
	m.relSent.streamAttached()
	for pr := range m.desired {
		m.gateLocked(pr)
	}
	m.opts.Outbox.Reset()
}

// Detach records that the stream ended; state stays for the next one.
func (m *Manager) Detach() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.attached = false
	m.finishResyncLocked(ErrResyncAborted)
}

// CountRefused counts one more refused edge message (see Refused).
func (m *Manager) CountRefused() { m.refused.Add(1) }

// Refused is the number of edge messages the manager refused since it
// started because what they claimed did not hold in kcp.
func (m *Manager) Refused() uint64 { return m.refused.Load() }

// Lists is the number of lists the manager made in kcp since it started.
func (m *Manager) Lists() uint64 { return m.lists.Load() }

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

// openLocked opens pr's gate and re-evaluates all its objects, and the
// copies the edge may hold of objects that are gone.
func (m *Manager) openLocked(pr string) {
	m.open[pr] = true
	if w, ok := m.running[pr]; ok {
		for _, k := range w.store.ListKeys() {
			m.queue.Add(item{pr: pr, key: k})
		}
	}
	m.queueCopiesLocked(pr)
	m.resyncOpenedLocked(pr)
}

// queueCopiesLocked queues the objects of pr whose copies the edge may hold.
func (m *Manager) queueCopiesLocked(pr string) {
	for _, s := range m.ledger.slotsWithCopies(pr) {
		m.queue.Add(s)
	}
}

// Inventory records a chunk of the edge's inventory; the last chunk of a
// PublishedResource replaces what the manager knows the edge applied for it
// and opens its gate: every object is compared (in memory) and only those
// whose content hash differs are sent.
func (m *Manager) Inventory(inv *ferryv1.Inventory) {
	pr := inv.GetPublishedResource()
	m.mu.Lock()
	defer m.mu.Unlock()
	entries := m.inventory[pr]
	if entries == nil {
		entries = map[objectID]string{}
		m.inventory[pr] = entries
	}
	m.resyncInventoryLocked(pr, len(inv.GetEntries()))
	for _, e := range inv.GetEntries() {
		// The UID is part of the identity: a copy of an older object by
		// the same name does not count as applied.
		id := idOf(pr, e.GetKey())
		entries[id] = e.GetAppliedHash()
		// Every copy the edge holds, whether its object is still in kcp or
		// not: one that is gone gets a delete intent (see gone).
		m.ledger.copyListed(id, e.GetKey())
	}
	// The related copies it holds: not sent again while unchanged.
	m.relSent.inventoried(pr, inv.GetRelatedEntries(), inv.GetComplete() && inv.GetRelatedComplete())
	if !inv.GetComplete() {
		return
	}
	m.inventoried[pr] = true
	delete(m.inventory, pr)
	if w, ok := m.running[pr]; ok && w.synced.Load() {
		m.compareInventoryLocked(pr, w, entries)
		return
	}
	m.unlisted[pr] = entries
	m.opts.Log.Info("edge inventory received; compared once the published resource is listed", logging.KeyPublishedResource, pr, logging.KeyObjects, len(entries))
}

// compareInventoryLocked replaces what the manager knows the edge applied
// for pr with a complete inventory (entries: object key and UID → content
// hash) and opens pr's gate: every object is compared in memory and only
// those whose hash differs are sent. w's cache must be listed.
func (m *Manager) compareInventoryLocked(pr string, w *watcher, entries map[objectID]string) {
	m.ledger.inventoried(pr, entries)
	objects := w.store.List()
	for _, raw := range objects {
		if m.opts.Metrics != nil {
			m.resyncing[item{pr: pr, key: clusterKeyOf(raw.(*unstructured.Unstructured))}] = struct{}{}
		}
	}
	m.opts.Metrics.Resynced(m.resyncSince, len(objects))
	m.opts.Log.Info("edge inventory complete", logging.KeyPublishedResource, pr, logging.KeyObjects, len(entries))
	m.openLocked(pr)
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
	cluster, rest, _ := strings.Cut(nsKey, "|")
	prefix := cluster + "|" + strings.TrimPrefix(rest, "/") + "/"
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

func (m *Manager) processNext(ctx context.Context) bool {
	it, shutdown := m.queue.Get()
	if shutdown {
		return false
	}
	defer m.queue.Done(it)
	if err := m.process(ctx, it); err != nil {
		m.opts.Log.Error(err, "syncing object failed; retrying", logging.KeyPublishedResource, it.pr, logging.KeyObject, it.key)
		m.queue.AddRateLimited(it)
		return true
	}
	m.queue.Forget(it)
	m.resyncProcessed(it)
	return true
}

// process turns the current state of one object into the next step: an
// upsert (its finalizer is written alongside, on the finalizer queue), a
// delete once it is being deleted or out of scope. It makes no request to
// kcp for the primary: nothing on the way to the edge waits for kcp.
func (m *Manager) process(ctx context.Context, it item) error {
	if it.related != "" {
		return m.processRelated(ctx, it)
	}
	m.mu.Lock()
	w, ok := m.running[it.pr]
	m.mu.Unlock()
	if !ok {
		return nil
	}
	raw, exists, err := w.store.GetByKey(it.key)
	if err != nil {
		return err
	}
	m.mu.Lock()
	open, withdrawn := m.open[it.pr], m.withdrawn[it.pr]
	m.mu.Unlock()
	if !exists {
		m.mu.Lock()
		delete(m.resyncing, it)
		m.mu.Unlock()
		if open && w.synced.Load() {
			m.gone(it)
		}
		return nil
	}
	obj := raw.(*unstructured.Unstructured)
	key := objectKey(obj, w.res.GVR)
	id := idOf(it.pr, key)
	hasFinalizer := slices.Contains(obj.GetFinalizers(), m.finalizer)
	if !hasFinalizer && !withdrawn && m.wantsFinalizer(w.res, obj) {
		// Written off the way to the edge: the upsert below does not wait
		// for it. A copy sent before it lands is still deleted when the
		// object goes: its delete needs no finalizer (asksDelete), and
		// one that vanishes gets one from the ledger (gone).
		m.finalizers.Add(it)
	}
	if !open {
		// Held until the edge's inventory is complete (openLocked requeues):
		// the edge cannot act on this resource before it watches its copies.
		return nil
	}

	if m.asksDelete(w.res, obj, id) {
		// Deleted in kcp, or out of the filters: the edge deletes its copy,
		// confirms, and the finalizer is released (Release). Also while
		// the PublishedResource is withdrawn.
		m.deleteOlderCopies(id)
		m.mu.Lock()
		queue := m.ledger.deleteQueued(id, key)
		m.mu.Unlock()
		if queue {
			m.opts.Outbox.Put(m.intent(it.pr, key, obj, &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{}}))
		}
		return nil
	}
	if obj.GetDeletionTimestamp() != nil || m.scopeOf(w.res, obj) != inScope {
		return nil // not ours (any more), or its namespace is not known yet
	}
	if withdrawn {
		return nil // nothing new until it is published again
	}
	desired := objects.DesiredState(obj)
	data, err := json.Marshal(desired.Object)
	if err != nil {
		return fmt.Errorf("cannot encode %s: %w", it.key, err)
	}
	upsert := &ferryv1.UpsertIntent{Object: data}
	if w.res.WorkspacePaths {
		if upsert.WorkspacePath, err = m.workspacePath(ctx, key.GetCluster()); err != nil {
			return err
		}
	}
	upsert.ContentHash = ContentHash(upsert)
	if m.deleteOlderCopies(id) {
		// The edge keeps one copy per name: an older object's copy goes
		// first; its confirmation (Release) queues this object again.
		return nil
	}
	m.mu.Lock()
	applied := m.ledger.applied(id) == upsert.ContentHash
	if applied {
		m.queueRelatedLocked(it.pr, it.key)
		m.ledger.unchanged(id, upsert.ContentHash)
	}
	m.resyncedLocked(it, applied)
	queue := !applied && m.ledger.upsertQueued(id, key, upsert.ContentHash)
	m.mu.Unlock()
	if applied {
		// The edge has this state already: a status write or kcp-internal
		// metadata changed the object, not its desired state.
		m.opts.Outbox.Drop(key, nil)
		return nil
	}
	if queue {
		m.opts.Outbox.Put(m.intent(it.pr, key, obj, &ferryv1.SyncIntent_Upsert{Upsert: upsert}))
	}
	m.queueServiceRelated(it.pr, it.key)
	return nil
}

// deleteOlderCopies queues the deletion of the copies the edge may hold at
// id's place of other objects (older UIDs: the name was deleted and
// created again, possibly unseen) and tells whether there are any.
func (m *Manager) deleteOlderCopies(id objectID) bool {
	return m.deleteLedgerCopies(id.pr, func() []objectID { return m.ledger.olderCopies(id) },
		"an older object's copy is deleted before the new object's is sent")
}

// gone handles an object that left kcp (or is not there after the broker's
// list) while the edge may still hold a copy: without a confirmed deletion
// the copy would be left behind, so the edge is asked to delete it. The
// finalizer normally prevents this; it happens when kcp deletes an object
// whose finalizer was added concurrently with the delete, or when the
// object was deleted while the broker was down. The edge's confirmation
// releases nothing (Release finds no object).
func (m *Manager) gone(it item) {
	m.deleteLedgerCopies(it.pr, func() []objectID { return m.ledger.copiesAt(it) },
		"object gone from kcp without a confirmed deletion; deleting its copy")
}

// deleteLedgerCopies asks the edge to delete the copies of pr's objects
// that copies selects from the ledger (it runs with m.mu held): each gets
// a delete intent carrying its own key, UID included, unless one is queued
// already; why is logged. It tells whether copies selected any.
func (m *Manager) deleteLedgerCopies(pr string, copies func() []objectID, why string) bool {
	m.mu.Lock()
	ids := copies()
	var put []*ferryv1.ObjectKey
	for _, id := range ids {
		key := m.ledger.get(id).key
		if m.ledger.deleteQueued(id, key) {
			put = append(put, key)
		}
	}
	m.mu.Unlock()
	for _, key := range put {
		m.opts.Log.V(1).Info(why, logging.KeyObject, KeyString(key))
		m.opts.Outbox.Put(&ferryv1.SyncIntent{Key: key, PublishedResource: pr, Version: &ferryv1.ObjectVersion{},
			Operation: &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{}}})
	}
	return len(ids) > 0
}

// resyncedLocked counts the first comparison of it after an inventory
// comparison (see resyncing): unchanged when the edge has its desired state.
func (m *Manager) resyncedLocked(it item, unchanged bool) {
	if _, ok := m.resyncing[it]; !ok {
		return
	}
	delete(m.resyncing, it)
	m.opts.Metrics.ResyncObject(unchanged)
}

// ContentHash is the hash of an upsert's desired state: object and
// workspace path. Both sides compare it; it changes only when the state the
// edge applies changes.
func ContentHash(u *ferryv1.UpsertIntent) string {
	h := sha256.New()
	h.Write(u.GetObject())
	h.Write([]byte{0})
	h.Write([]byte(u.GetWorkspacePath()))
	return hex.EncodeToString(h.Sum(nil)[:16])
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

// workspacePath resolves a logical cluster name to its workspace path (the
// kcp.io/path annotation of the workspace's LogicalCluster object).
func (m *Manager) workspacePath(ctx context.Context, cluster string) (string, error) {
	m.mu.Lock()
	p, ok := m.paths[cluster]
	m.mu.Unlock()
	if ok {
		return p, nil
	}
	client, err := kcp.NewClient(m.opts.KCP)
	if err != nil {
		return "", err
	}
	lc, err := client.Cluster(logicalcluster.Name(cluster).Path()).CoreV1alpha1().LogicalClusters().Get(ctx, "cluster", metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("cannot resolve the workspace path of %s: %w", cluster, err)
	}
	p = lc.GetAnnotations()["kcp.io/path"]
	m.mu.Lock()
	m.paths[cluster] = p
	m.mu.Unlock()
	return p, nil
}

func (m *Manager) intent(pr string, key *ferryv1.ObjectKey, obj *unstructured.Unstructured, op any) *ferryv1.SyncIntent {
	in := &ferryv1.SyncIntent{
		Key:               key,
		PublishedResource: pr,
		Version:           &ferryv1.ObjectVersion{ResourceVersion: obj.GetResourceVersion(), Generation: obj.GetGeneration()},
	}
	switch o := op.(type) {
	case *ferryv1.SyncIntent_Upsert:
		in.Operation = o
	case *ferryv1.SyncIntent_Delete:
		in.Operation = o
	}
	return in
}

func objectKey(obj *unstructured.Unstructured, gvr schema.GroupVersionResource) *ferryv1.ObjectKey {
	return &ferryv1.ObjectKey{
		Cluster:   logicalcluster.From(obj).String(),
		Resource:  &ferryv1.GroupVersionResource{Group: gvr.Group, Version: gvr.Version, Resource: gvr.Resource},
		Namespace: obj.GetNamespace(),
		Name:      obj.GetName(),
		Uid:       string(obj.GetUID()),
	}
}

func (m *Manager) resourceClient(key *ferryv1.ObjectKey) (dynamic.ResourceInterface, error) {
	c, err := m.client(key.GetCluster())
	if err != nil {
		return nil, err
	}
	r := key.GetResource()
	return c.Resource(schema.GroupVersionResource{Group: r.GetGroup(), Version: r.GetVersion(), Resource: r.GetResource()}).Namespace(key.GetNamespace()), nil
}

// processNextFinalizer writes the next queued finalizer (blocking until
// there is one); false once the queue is shut down.
func (m *Manager) processNextFinalizer(ctx context.Context) bool {
	it, shutdown := m.finalizers.Get()
	if shutdown {
		return false
	}
	defer m.finalizers.Done(it)
	if err := m.writeFinalizer(ctx, it); err != nil {
		m.opts.Log.Error(err, "writing the finalizer failed; retrying", logging.KeyPublishedResource, it.pr, logging.KeyObject, it.key)
		m.finalizers.AddRateLimited(it)
		return true
	}
	m.finalizers.Forget(it)
	return true
}

// writeFinalizer puts the broker's finalizer on the cached object behind
// it unless it carries it already, is being deleted, is out of scope, or
// its PublishedResource is withdrawn or gone. One patch, no read: it is
// guarded by the cached object's resourceVersion and UID, so a stale cache
// costs a conflict (retried; the newer object's event queues it again),
// never a finalizer on an object that changed meanwhile (e.g. began its
// deletion, or left the filters).
func (m *Manager) writeFinalizer(ctx context.Context, it item) error {
	m.mu.Lock()
	w, ok := m.running[it.pr]
	withdrawn := m.withdrawn[it.pr]
	m.mu.Unlock()
	if !ok || withdrawn {
		return nil
	}
	raw, exists, err := w.store.GetByKey(it.key)
	if err != nil || !exists {
		return err
	}
	obj := raw.(*unstructured.Unstructured)
	if slices.Contains(obj.GetFinalizers(), m.finalizer) || !m.wantsFinalizer(w.res, obj) {
		return nil
	}
	ri, err := m.resourceClient(objectKey(obj, w.res.GVR))
	if err != nil {
		return err
	}
	return patchFinalizers(ctx, ri, obj, append(slices.Clone(obj.GetFinalizers()), m.finalizer))
}

// Retry re-sends the object behind key after an apply failed, with an
// exponential per-object delay (1 s doubling up to 5 min).
func (m *Manager) Retry(pr string, key *ferryv1.ObjectKey) time.Duration {
	it := item{pr: pr, key: storeKey(key)}
	m.mu.Lock()
	m.ledger.retry(idOf(pr, key))
	m.mu.Unlock()
	d := m.nacks.When(it)
	m.queue.AddAfter(it, d)
	return d
}

// Resend forgets what the edge applied for key and queues its desired state
// (or its delete) again: the edge's copy drifted and it does not hold the
// state. Checked against the cache like any intent: an object the engine
// does not sync sends nothing.
func (m *Manager) Resend(pr string, key *ferryv1.ObjectKey) {
	it := item{pr: pr, key: storeKey(key)}
	m.mu.Lock()
	m.ledger.resend(idOf(pr, key))
	m.mu.Unlock()
	m.queue.Add(it)
}

// Applied records that the edge applied in (an upsert) and forgets the
// failure history of its object.
func (m *Manager) Applied(pr string, in *ferryv1.SyncIntent) {
	it := item{pr: pr, key: storeKey(in.GetKey())}
	m.nacks.Forget(it)
	m.mu.Lock()
	defer m.mu.Unlock()
	if h := in.GetUpsert().GetContentHash(); h != "" {
		m.ledger.acked(idOf(pr, in.GetKey()), in.GetKey(), h)
	}
	m.queueRelatedLocked(pr, it.key)
}

// RetryRelated re-sends a related object after the edge could not apply it,
// with the same per-object backoff as Retry.
func (m *Manager) RetryRelated(pr string, rt *ferryv1.RelatedTo) time.Duration {
	it := item{pr: pr, key: storeKey(rt.GetPrimary()), related: rt.GetIdentifier()}
	m.mu.Lock()
	m.relSent.again(it)
	m.mu.Unlock()
	d := m.nacks.When(it)
	m.queue.AddAfter(it, d)
	return d
}

// Rejected records that the edge refused the object's (or, with related
// set, the reference's) intent with a final error (invalid, forbidden, a
// failing mutation): it is sent again only when the kcp object changes
// (its desired state differs) or its PublishedResource does.
func (m *Manager) Rejected(pr string, key *ferryv1.ObjectKey, related string) {
	it := item{pr: pr, key: storeKey(key), related: related}
	m.mu.Lock()
	defer m.mu.Unlock()
	if related == "" {
		m.ledger.rejectedFinal(idOf(pr, key), key)
	} else {
		m.rejected[it] = struct{}{}
	}
	m.nacks.Forget(it)
}

// AppliedRelated forgets the failure history of a related object.
func (m *Manager) AppliedRelated(pr string, rt *ferryv1.RelatedTo) {
	m.nacks.Forget(item{pr: pr, key: storeKey(rt.GetPrimary()), related: rt.GetIdentifier()})
}

func storeKey(key *ferryv1.ObjectKey) string {
	return key.GetCluster() + "|" + key.GetNamespace() + "/" + key.GetName()
}

// RecordFailure records that the edge could not apply the object behind key
// as a Warning Event on the kcp object, so the kcp user sees why it is not
// synced (through the APIExport's "events" permission claim).
// related tells that the failure is about one of the object's related
// objects. A refusal by the edge (where the object would land) has its own
// reason, SyncForbidden or RelatedForbidden.
func (m *Manager) RecordFailure(ctx context.Context, pr string, key *ferryv1.ObjectKey, applyErr *ferryv1.ApplyError, related bool) error {
	reason := "SyncFailed"
	if applyErr.GetReason() == ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN {
		reason = "SyncForbidden"
		if related {
			reason = "RelatedForbidden"
		}
		return m.recordEvent(ctx, pr, key, "Warning", reason, "the service cluster's edge refused: "+applyErr.GetMessage())
	}
	return m.recordEvent(ctx, pr, key, "Warning", reason, fmt.Sprintf("the service cluster did not accept this object (%s): %s",
		reasonText(applyErr.GetReason()), applyErr.GetMessage()))
}

// RecordStatusFailure records, as a Warning Event on the kcp object, that
// its local status could not be synced back (e.g. too large for the stream).
func (m *Manager) RecordStatusFailure(ctx context.Context, pr string, key *ferryv1.ObjectKey, applyErr *ferryv1.ApplyError) error {
	return m.recordEvent(ctx, pr, key, "Warning", "StatusNotSynced", fmt.Sprintf("the status of the local copy was not synced back (%s): %s",
		reasonText(applyErr.GetReason()), applyErr.GetMessage()))
}

func reasonText(r ferryv1.ApplyErrorReason) string {
	switch r {
	case ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_REJECTED:
		return "rejected"
	case ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_PUBLISHED:
		return "not published"
	case ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_INVALID:
		return "invalid"
	case ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_TOO_LARGE:
		return "too large"
	case ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_UNAVAILABLE:
		return "service cluster unavailable"
	case ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT:
		return "conflict"
	case ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN:
		return "forbidden"
	default:
		return "error"
	}
}

// PublishedResourceFor finds the PublishedResource serving key's resource.
func (m *Manager) PublishedResourceFor(key *ferryv1.ObjectKey) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := key.GetResource()
	for pr, res := range m.desired {
		if res.GVR.Group == r.GetGroup() && res.GVR.Resource == r.GetResource() {
			return pr, true
		}
	}
	return "", false
}

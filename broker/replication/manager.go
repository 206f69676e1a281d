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
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/workqueue"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
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
	// NamespaceName, when set, syncs only objects in the kcp namespace of
	// that name, in every workspace (spec.filter.namespace written as a
	// name, the seeds' spelling).
	NamespaceName string
	// Related are the compiled spec.related entries.
	Related []*related.Reference
	// ConsumerOrphan honours the consumer's ferry.dev/deletion-policy:
	// Orphan on deleted objects (spec.consumerDeletionPolicy Allow).
	ConsumerOrphan bool
	// AdoptFinalizer is the finalizer of the sync agent whose copies the
	// edge adopts (spec.adopt; SyncAgentFinalizer), "" for none: an object
	// deleted in kcp before its copy was adopted is still asked to be
	// deleted, and that finalizer released with the broker's
	// (adoption.go).
	AdoptFinalizer string
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
	// Metrics learns the outcomes of inventory comparisons (the engine's
	// Observer); nil records none.
	Metrics ResyncObserver
	// RelatedListWait bounds how long the release of a deleted object
	// waits for the watch of a service-origin related kind to list;
	// zero is one minute.
	RelatedListWait time.Duration
	// EndpointsChanged, when set, is called (without locks, from a watch's
	// goroutine) when a virtual workspace endpoint becomes reachable or
	// unreachable (Manager.Endpoints).
	EndpointsChanged func()
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

	// endpoints are the virtual workspace's endpoints, their clients and
	// where each workspace lives (endpoints.go).
	endpoints *endpointSet

	mu      sync.Mutex
	ctx     context.Context
	desired map[string]Resource
	running map[string]*watcher
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
	namespaces *shardedWatch

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
	relCopies  map[relatedPlace]item

	// adopted holds the objects whose copy the edge adopted from another
	// sync agent, with that agent's finalizer, until it is replaced by
	// the broker's (adoption.go).
	adopted map[objectID]string

	// resyncActive is the resync an admin asked for, while it runs;
	// resyncLast the last one (resync.go).
	resyncActive, resyncLast *Resync
}

// item is a primary object (related empty) or one of its related[]
// references.
type item struct{ pr, key, related string }

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
		endpoints:   newEndpointSet(o.Log, o.KCP, o.NewClient, o.EndpointsChanged),
		open:        map[string]bool{},
		withdrawn:   map[string]bool{},
		inventory:   map[string]map[objectID]string{},
		ledger:      newLedger(),
		resyncing:   map[item]struct{}{},
		adopted:     map[objectID]string{},
		inventoried: map[string]bool{},
		unlisted:    map[string]map[objectID]string{},
		paths:       map[string]string{},
		relWatchers: map[schema.GroupVersionResource]*relatedWatcher{},
		relRefs:     refindex.New[item](),
		relSent:     newRelatedSent(),
		rejected:    map[item]struct{}{},
		relNotes:    map[item]string{},
		relReports:  map[item]*ferryv1.RelatedObjectReport{},
		relCopies:   map[relatedPlace]item{},
	}
}

// Run processes objects with workers goroutines, and writes finalizers
// with finalizerWorkers others, until ctx ends; watches stop with it.
func (m *Manager) Run(ctx context.Context, workers, finalizerWorkers int) {
	m.start(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		watching.RunWorkers(ctx, m.finalizers, finalizerWorkers, func() bool { return m.processNextFinalizer(ctx) })
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

// CountRefused counts one more refused edge message (see Refused).
func (m *Manager) CountRefused() { m.refused.Add(1) }

// Refused is the number of edge messages the manager refused since it
// started because what they claimed did not hold in kcp.
func (m *Manager) Refused() uint64 { return m.refused.Load() }

// Lists is the number of lists the manager made in kcp since it started.
func (m *Manager) Lists() uint64 { return m.lists.Load() }

// storeKey is the informer store key of the object behind key.
func storeKey(key *ferryv1.ObjectKey) string { return nameOfKey(key).storeKey() }

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

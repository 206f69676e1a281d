// Package replication is the edge's half of object sync. It applies the
// broker's sync intents to the service cluster (reverse projection, naming,
// namespaces, labels pointing back to kcp, adoption of an existing object at
// the target name) with server-side apply, and reports back: a result per
// intent, the local status when it changes, and a deletion confirmation once
// a local copy is known to be gone.
//
// The engine outlives streams: its watches, its ledger (ledger.go: content
// hash, shape, place and generation of every copy it applied, never the
// content) and its report outbox stay when the stream ends; unanswered
// reports are re-sent on the next stream. A copy edited in fields ferry owns
// or deleted by someone else is repaired within seconds: the edge asks the
// broker for its desired state and applies it (drift.go).
//
// Why server-side apply: the edge's field manager owns exactly the fields the
// kcp object sets. Fields that other service-cluster controllers or webhooks
// set are kept (they own them), and a field removed in kcp is removed locally
// because the next apply no longer contains it — the three-way merge the
// sync semantics ask for, kept by the API server instead of a last-applied
// record on every object.
package replication

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/ferry-dev/ferry/pkg/logging"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/fieldpath"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/objects"
	"github.com/ferry-dev/ferry/pkg/outbox"
	"github.com/ferry-dev/ferry/pkg/protocol"
	"github.com/ferry-dev/ferry/pkg/refindex"
	"github.com/ferry-dev/ferry/pkg/watching"
)

// FieldManager is the edge's server-side apply identity.
const FieldManager = "ferry-edge"

// remoteIndex indexes local copies by the kcp object they belong to.
const remoteIndex = "ferry.dev/remote"

// Options configure an Engine. All fields are required.
type Options struct {
	Agent   string
	Dynamic dynamic.Interface
	Kube    kubernetes.Interface
	// Wake is called (it must not block) when Next may have something.
	Wake func()
	Log  logr.Logger
	// ReportWindow is how many reports may await the broker's answer.
	ReportWindow int
	// RelatedClusterWide caches related kinds in the whole cluster instead
	// of per namespace ferry may use (relatedwatch.go).
	RelatedClusterWide bool
	// Observer learns the engine's transitions (the admin API's records,
	// metrics: see Observers); nil observes nothing.
	Observer Observer
}

// Sink is the attached stream's control lane (link.Loop.Control): it never
// blocks and fails only when the stream is overrun.
type Sink interface {
	Control(*ferryv1.ConnectRequest) error
}

// Engine applies intents and produces reports. Safe for concurrent use.
type Engine struct {
	opts    Options
	queue   workqueue.TypedRateLimitingInterface[queueKey]
	reports *outbox.Outbox[reportKey, *ferryv1.ConnectRequest]
	// reportEpoch is the reports outbox's epoch, stamped on every report
	// (reports.go).
	reportEpoch uint64

	mu        sync.Mutex
	ctx       context.Context
	published map[string]*Published // by PublishedResource name
	watches   map[string]*localWatch
	// ledger is the per-object bookkeeping: intents awaiting apply, what
	// was applied where, resends asked, statuses reported, deletes in
	// flight, conflicts (ledger.go).
	ledger *ledger
	// pre holds this stream's inventory chunks, sent before reports.
	pre  []*ferryv1.ConnectRequest
	sink Sink
	// Namespaces (placement.go): those this agent created, from an informer
	// on its label, plus what this process created or read since (created:
	// name → workspace label; foreign: exist, not created by ferry).
	nsStore  cache.Indexer
	nsSynced bool
	created  map[string]string
	foreign  map[string]bool
	// related objects (related.go)
	relWatches map[schema.GroupVersionResource]*relatedWatch
	relRefs    *refindex.Index[relKey] // which local related object each reference points at
	relSum     map[relKey][32]byte     // last report per reference
	// relMembers: which local objects each label-selected reference found
	// (related_selector.go), so that a change of one, and an object found
	// for two primaries, are noticed without scanning.
	relMembers *refindex.Index[memberKey]
	relFound   map[relKey][]string // the member keys per reference
	// relWaiting holds references waiting for a related informer to list
	// (by informer).
	relWaiting map[waitKey]map[relKey]struct{}
	// relParked holds, per primary (object key), the related upserts
	// waiting for the cache to hold the primary as applied, since when
	// (related_placement.go).
	relParked map[ledgerKey]map[queueKey]time.Time
	// stateCleared holds the adopted api-syncagent copies whose state
	// Secret this process saw gone (syncagent.go): not looked for again.
	stateCleared map[ledgerKey]struct{}
}

type localWatch struct {
	pub   *Published
	store cache.Indexer
	// legacy holds this agent's copies made by earlier versions (no kcp
	// resource label), adopted when their own object's upsert is applied
	// (identity.go).
	legacy cache.Indexer
	cancel context.CancelFunc
	synced bool // the informer has listed the local copies
	// lastErr is the watch's last list/watch error, while not synced.
	lastErr error
	// condition is the Synced condition last written for the resource.
	condition *syncedCondition
	// withdrawn: the PublishedResource is invalid; only deletes are applied.
	withdrawn bool
}

// NewEngine returns an engine; Run starts it.
func NewEngine(o Options) *Engine {
	if o.ReportWindow <= 0 {
		o.ReportWindow = 256
	}
	return &Engine{
		opts: o,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[queueKey](),
			workqueue.TypedRateLimitingQueueConfig[queueKey]{Name: "apply"}),
		reports:     outbox.New[reportKey, *ferryv1.ConnectRequest](o.ReportWindow, o.Wake),
		reportEpoch: newReportEpoch(),
		published:   map[string]*Published{},
		watches:     map[string]*localWatch{},
		ledger:      newLedger(),
		created:     map[string]string{},
		foreign:     map[string]bool{},
		relWatches:  map[schema.GroupVersionResource]*relatedWatch{},
		relRefs:     refindex.New[relKey](),
		relSum:      map[relKey][32]byte{},
		relMembers:  refindex.New[memberKey](),
		relFound:    map[relKey][]string{},
		relWaiting:  map[waitKey]map[relKey]struct{}{},
		relParked:   map[ledgerKey]map[queueKey]time.Time{},

		stateCleared: map[ledgerKey]struct{}{},
	}
}

// Run applies intents with workers goroutines until ctx ends.
func (e *Engine) Run(ctx context.Context, workers int) error {
	e.mu.Lock()
	e.ctx = ctx
	e.watchNamespacesLocked()
	for _, p := range e.published {
		e.watchLocked(p)
	}
	e.ensureRelatedWatchesLocked()
	e.mu.Unlock()
	watching.RunWorkers(ctx, e.queue, workers, func() bool { return e.next(ctx) })
	return nil
}

// SetPublished registers p for syncing (replacing an older registration).
func (e *Engine) SetPublished(p *Published) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if old, ok := e.published[p.Name]; ok && old.Revision == p.Revision {
		if w := e.watches[p.Name]; w != nil {
			w.withdrawn = false
		}
		return
	}
	if w, ok := e.watches[p.Name]; ok {
		w.cancel()
		delete(e.watches, p.Name)
	}
	// The new revision's answers count its refusals again.
	e.ledger.resetRefusals(p.Name)
	e.published[p.Name] = p
	e.watchLocked(p)
	e.ensureRelatedWatchesLocked()
}

// WithdrawPublished stops applying a PublishedResource's objects while it
// is invalid, but keeps its watch and registration: deletions of existing
// copies still go through (the broker still sends them), so no kcp object
// stays Terminating because its PublishedResource broke. SetPublished with
// the same revision, or a new one, publishes it again.
func (e *Engine) WithdrawPublished(name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if w, ok := e.watches[name]; ok {
		w.withdrawn = true
	}
}

func (e *Engine) withdrawn(w *localWatch) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return w.withdrawn
}

// RemovePublished stops syncing a PublishedResource's objects (local copies
// stay).
func (e *Engine) RemovePublished(name string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.published, name)
	if w, ok := e.watches[name]; ok {
		w.cancel()
		delete(e.watches, name)
	}
	// No watch sees its copies any more: nothing recorded of them could be
	// repaired or confirmed.
	e.ledger.forget(name)
	e.ensureRelatedWatchesLocked()
}

func (e *Engine) forRemote(gvr *ferryv1.GroupVersionResource) (*Published, *localWatch) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.forRemoteLocked(gvr)
}

func (e *Engine) forRemoteLocked(gvr *ferryv1.GroupVersionResource) (*Published, *localWatch) {
	for name, p := range e.published {
		if p.Remote.Group == gvr.GetGroup() && p.Remote.Resource == gvr.GetResource() && p.Remote.Version == gvr.GetVersion() {
			return p, e.watches[name]
		}
	}
	return nil, nil
}

// watchLocked starts the informer on p's local copies (this agent's copies
// of p's kcp resource only), and one on this agent's copies made by earlier
// versions, to adopt (identity.go).
func (e *Engine) watchLocked(p *Published) {
	if e.ctx == nil {
		return
	}
	ctx, cancel := context.WithCancel(e.ctx)
	w := &localWatch{pub: p, cancel: cancel}
	e.watches[p.Name] = w
	legacy := cache.NewSharedIndexInformer(watching.ListWatch(e.opts.Dynamic.Resource(p.Local), naming.LegacyCopySelector(e.opts.Agent)),
		&unstructured.Unstructured{}, 0, copyIndexers())
	_ = legacy.SetTransform(dropManagedFields)
	w.legacy = legacy.GetIndexer()
	go legacy.RunWithContext(ctx)
	lw := watching.ListWatch(e.opts.Dynamic.Resource(p.Local), naming.CopySelector(e.opts.Agent, p.Remote.GroupResource()))
	informer := cache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, 0, copyIndexers())
	_ = informer.SetTransform(dropManagedFields)
	_ = informer.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		e.mu.Lock()
		w.lastErr = err
		e.mu.Unlock()
		e.queue.Add(conditionKey(p.Name))
		e.opts.Log.Error(err, "cannot watch local copies", logging.KeyPublishedResource, p.Name, "resource", p.Local.String())
	})
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			e.localChanged(w, nil, obj)
			e.copiesChanged(w)
		},
		UpdateFunc: func(old, obj any) { e.localChanged(w, old, obj) },
		DeleteFunc: func(obj any) {
			e.localGone(w, obj)
			e.copiesChanged(w)
		},
	})
	w.store = informer.GetIndexer()
	go informer.RunWithContext(ctx)
	go func() {
		// The legacy cache too: until it has listed, a copy an earlier
		// version made could be missed and a second copy made.
		if cache.WaitForCacheSync(ctx.Done(), informer.HasSynced, legacy.HasSynced) {
			e.mu.Lock()
			defer e.mu.Unlock()
			w.synced, w.lastErr = true, nil
			e.queue.Add(conditionKey(p.Name))
			if e.watches[p.Name] == w {
				e.sendInventoryLocked(w)
			}
		}
	}()
}

func indexByRemote(obj any) ([]string, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, nil
	}
	l := u.GetLabels()
	return []string{remoteIndexValue(l[naming.LabelRemoteCluster], l[naming.LabelNamespaceHash], l[naming.LabelNameHash])}, nil
}

// remoteIndexValue is remoteIndex's value: the kcp object's cluster and the
// hashes of its namespace and name, as its copy's labels carry them.
func remoteIndexValue(cluster, namespaceHash, nameHash string) string {
	return cluster + "|" + namespaceHash + "|" + nameHash
}

// remoteUIDIndex indexes local copies by the kcp UID they were applied
// from (kcp-origin related copies name their primary by it).
const remoteUIDIndex = "ferry.dev/remote-uid"

func indexByRemoteUID(obj any) ([]string, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok || u.GetAnnotations()[naming.AnnotationUID] == "" {
		return nil, nil
	}
	return []string{u.GetAnnotations()[naming.AnnotationUID]}, nil
}

// copyIndexers are the indexes of the local copies' caches.
func copyIndexers() cache.Indexers {
	return cache.Indexers{remoteIndex: indexByRemote, remoteUIDIndex: indexByRemoteUID}
}

func remoteIndexKey(remote naming.Remote) string {
	return remoteIndexValue(remote.ClusterName, naming.Hash(remote.Namespace), naming.Hash(remote.Name))
}

// Handle takes a sync intent from the broker (latest wins per object).
func (e *Engine) Handle(in *ferryv1.SyncIntent) {
	e.observer().IntentReceived(in)
	e.mu.Lock()
	q := e.queueKeyLocked(in)
	e.ledger.received(q, in)
	e.mu.Unlock()
	e.queue.Add(q)
}

// queueKeyLocked is in's slot in the apply queue: its object, or for a
// related object its primary and related[] entry (one slot per reference,
// whichever object it points at).
func (e *Engine) queueKeyLocked(in *ferryv1.SyncIntent) queueKey {
	if rel := in.GetRelatedTo(); rel != nil {
		return queueKey{object: e.keyLocked(rel.GetPrimary()), related: rel.GetIdentifier()}
	}
	return queueKey{object: e.keyLocked(in.GetKey())}
}

// keyLocked is the ledger key of key's object, routed by the
// PublishedResource that publishes its kcp resource on this edge (none:
// the intent is refused).
func (e *Engine) keyLocked(key *ferryv1.ObjectKey) ledgerKey {
	pr := ""
	if p, _ := e.forRemoteLocked(key.GetResource()); p != nil {
		pr = p.Name
	}
	return keyFor(pr, key)
}

// Attach attaches a new stream: unanswered reports go out again (the
// broker answers each; reports it already wrote cost it a comparison, not a
// write), and each synced resource's inventory is sent.
func (e *Engine) Attach(sink Sink) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sink = sink
	e.pre = nil
	e.reports.Reset()
	for _, w := range e.watches {
		e.sendInventoryLocked(w)
	}
}

// Detach drops what only made sense on the stream; intents not yet
// applied are re-sent by the broker on the next stream.
func (e *Engine) Detach() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.sink = nil
	e.pre = nil
	e.ledger.streamEnded()
	clear(e.relParked) // the broker re-sends them
}

// result sends an intent's answer on the control lane; without a stream it
// is dropped (the broker re-sends the intent on the next stream).
func (e *Engine) result(res *ferryv1.IntentResult) {
	e.mu.Lock()
	sink := e.sink
	e.mu.Unlock()
	if sink == nil {
		return
	}
	if err := sink.Control(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_IntentResult{IntentResult: res}}); err != nil {
		e.opts.Log.Error(err, "cannot queue an intent result; the stream ends")
	}
}

func (e *Engine) next(ctx context.Context) bool {
	k, shutdown := e.queue.Get()
	if shutdown {
		return false
	}
	defer e.queue.Done(k)
	e.mu.Lock()
	in := e.ledger.take(k)
	e.mu.Unlock()
	if name := k.condition; name != "" {
		if err := e.writeSyncedCondition(ctx, name); err != nil {
			e.opts.Log.Error(err, "retrying")
			e.queue.AddRateLimited(k)
			return true
		}
		e.queue.Forget(k)
		return true
	}
	if in == nil {
		if k.related == "" {
			e.checkCopy(k.object)
		}
		e.queue.Forget(k)
		return true
	}
	e.queue.Forget(k)
	if ready, why := e.ready(in); !ready {
		// Answered at once, so this resource's intents never fill the
		// broker's window; the broker retries with backoff.
		res := nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_READY, true, "%s", why)
		e.observer().IntentDone(in, res)
		e.result(res)
		return true
	}
	var res *ferryv1.IntentResult
	if in.GetRelatedTo() != nil {
		wait, answer := e.waitForPrimary(k, in)
		switch {
		case wait:
			return true // processed again on the primary's informer event
		case answer != nil:
			res = answer
		default:
			res = e.applyRelated(ctx, in)
		}
		res.RelatedTo = in.GetRelatedTo()
	} else {
		res = e.apply(ctx, in)
	}
	if log := e.opts.Log.V(4); log.Enabled() {
		log.Info("intent handled", logging.KeyObject, k.object.String(), "related", k.related, "delete", in.GetDelete() != nil, "sequence", in.GetVersion().GetSequence(),
			"local", nsName(res.GetLocalNamespace(), res.GetLocalName()), "error", res.GetError().GetMessage())
	}
	e.observer().IntentDone(in, res)
	e.countRefusal(in, res)
	e.result(res)
	return true
}

// ready tells whether the local watch of in's resource has synced, and if
// not why; intents for resources this edge does not publish are ready (they
// are refused).
func (e *Engine) ready(in *ferryv1.SyncIntent) (bool, string) {
	e.mu.Lock()
	nsSynced := e.nsSynced
	e.mu.Unlock()
	if !nsSynced {
		return false, "the edge has not listed the namespaces it created yet"
	}
	if in.GetRelatedTo() != nil {
		if !e.relatedReady(in) {
			return false, "the edge's watches of the related objects have not listed yet"
		}
		return true, ""
	}
	pub, w := e.forRemote(in.GetKey().GetResource())
	if w == nil {
		return true, ""
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if w.synced {
		return true, ""
	}
	why := fmt.Sprintf("the edge has not listed its local %s yet", pub.Local.String())
	if w.lastErr != nil {
		why += ": " + w.lastErr.Error()
	}
	return false, why
}

// nack answers in with an error. It carries in's related_to: the broker
// matches answers by key and related_to, and an answer it cannot match
// leaves the intent in flight, never retried.
func nack(in *ferryv1.SyncIntent, reason ferryv1.ApplyErrorReason, retryable bool, format string, args ...any) *ferryv1.IntentResult {
	return &ferryv1.IntentResult{Key: in.GetKey(), Version: in.GetVersion(), RelatedTo: in.GetRelatedTo(), Error: &ferryv1.ApplyError{
		Reason: reason, Message: fmt.Sprintf(format, args...), Retryable: retryable,
	}}
}

// apply applies an upsert (or routes a delete) and records what it applied.
func (e *Engine) apply(ctx context.Context, in *ferryv1.SyncIntent) *ferryv1.IntentResult {
	pub, w := e.forRemote(in.GetKey().GetResource())
	if pub == nil || w == nil {
		return nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_PUBLISHED, true,
			"no PublishedResource of this edge publishes %s.%s", in.GetKey().GetResource().GetResource(), in.GetKey().GetResource().GetGroup())
	}
	key := in.GetKey()
	remote := remoteOf(key)
	existing := e.findLocal(w, remote)

	if in.GetDelete() != nil {
		return e.delete(ctx, in, w, existing)
	}

	if e.withdrawn(w) {
		return nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_PUBLISHED, true,
			"PublishedResource %s is not valid at the moment (see its Published condition); only deletions are carried out", pub.Name)
	}
	if existing == nil {
		// A copy an earlier version made of exactly this object (its kcp
		// UID) is adopted: applied where it is, with the identity labels.
		if existing = findLegacy(w, remote); existing != nil {
			e.opts.Log.Info("adopting a local copy made by an earlier version of ferry", logging.KeyPublishedResource, pub.Name,
				"local", nsName(existing.GetNamespace(), existing.GetName()), logging.KeyObject, protocol.ObjectKeyString(key))
		}
	}
	// adopting is a local object ferry did not create that this apply
	// takes over in place (adopt.go): api-syncagent's copy of exactly this
	// object (spec.adopt), wherever it is, or, below, an unmarked object at
	// the copy's place (conflictPolicy Adopt).
	var adopting *adoption
	if existing == nil {
		a, refusal, err := e.findSyncAgentCopy(ctx, pub, remote)
		switch {
		case err != nil:
			return nack(in, classify(err), true, "%v", err)
		case refusal != "":
			return nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT, false, "%s", refusal)
		case a != nil:
			existing, adopting = a.obj, a
		}
	}
	k := keyFor(pub.Name, key)
	hash := in.GetUpsert().GetContentHash()
	if existing != nil && hash != "" && existing.GetAnnotations()[naming.AnnotationContentHash] == hash &&
		existing.GetAnnotations()[naming.AnnotationUID] == key.GetUid() && existing.GetAnnotations()[naming.AnnotationShape] == pub.Shape &&
		labelledFor(existing, pub) && !e.drifted(k, existing) && !e.resendPending(k) {
		// The copy holds this state already (a re-sent intent after a
		// reconnect): nothing to write.
		e.record(k, hash, pub.Shape, existing.GetNamespace(), existing.GetName(), copyGeneration(existing))
		return &ferryv1.IntentResult{Key: key, Version: in.GetVersion(), LocalNamespace: existing.GetNamespace(), LocalName: existing.GetName(),
			AdoptedFrom: adoptedFrom(existing.GetAnnotations())}
	}
	var obj unstructured.Unstructured
	// Kubernetes' JSON decoding keeps whole numbers int64 (as CEL and the
	// API server expect), unlike encoding/json's float64.
	if err := utiljson.Unmarshal(in.GetUpsert().GetObject(), &obj.Object); err != nil {
		return nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_INVALID, false, "the object is not valid JSON: %v", err)
	}
	remote.WorkspacePath = in.GetUpsert().GetWorkspacePath()
	ns, name, err := pub.Naming.LocalOf(remote, obj.Object, pub.Namespaced)
	if err != nil {
		return nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_INVALID, false, "naming: %v", err)
	}
	// ownUID is the UID of the copy being written (none for a new one): the
	// apply carries it as a precondition, so an object created at the name
	// since it was checked is never written.
	var ownUID types.UID
	if existing != nil {
		// Keep the object where it is even if naming rules changed since.
		ns, name, ownUID = existing.GetNamespace(), existing.GetName(), existing.GetUID()
	} else {
		claimed, a, refusal, err := e.claim(ctx, pub, ns, name, remote)
		ownUID, adopting = claimed, a
		if err != nil {
			return nack(in, classify(err), true, "%v", err)
		}
		if refusal != "" {
			return nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT, false, "%s", refusal)
		}
	}
	if ns != "" {
		if err := e.place(ctx, pub.placement(key.GetCluster()), ns); err != nil {
			if errors.Is(err, errForbidden) {
				return nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN, false, "the edge does not write %s %s: %v", pub.LocalKind, nsName(ns, name), err)
			}
			return nack(in, classify(err), true, "%v", err)
		}
	}
	var existingObj map[string]any
	if existing != nil {
		existingObj = existing.Object
	}
	local, err := pub.DesiredCopy(&obj, Copy{
		Agent: e.opts.Agent, Remote: remote, Namespace: ns, Name: name, Existing: existingObj,
		ResourceVersion: in.GetVersion().GetResourceVersion(), ContentHash: hash,
	})
	if err != nil {
		return nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_INVALID, false, "%v", err)
	}
	// Service-owned paths (serviceowned.go) are handed over on an existing
	// copy whose hand-over does not cover them yet, and left out.
	owned := pub.ServiceOwned
	if err := e.serviceOwnedBefore(ctx, pub, existing, local); err != nil {
		return nack(in, classify(err), true, "%v", err)
	}
	var removed []fieldpath.Path
	if pub.KeepLocalEdits {
		if removed, err = keepLocalEdits(local, existing, owned); err != nil {
			return nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_INVALID, false, "%v", err)
		}
	}
	local.SetAnnotations(objects.MergeStrings(local.GetAnnotations(), adoptionAnnotations(existing, adopting, time.Now())))

	local.SetUID(ownUID)
	got, err := e.opts.Dynamic.Resource(pub.Local).Namespace(ns).Apply(ctx, name, local, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	if apierrors.IsNotFound(err) && ns != "" {
		e.forgetNamespace(ns) // deleted behind our back; recreated on retry
	}
	if err != nil {
		return nack(in, classify(err), retryable(err), "the service cluster refused %s %s: %v", pub.LocalKind, nsName(ns, name), err)
	}
	if len(removed) > 0 {
		if got, err = e.removeFields(ctx, pub, got, removed); err != nil {
			return nack(in, classify(err), true, "%v", err)
		}
	}
	if got, err = e.serviceOwnedAfter(ctx, pub, existing, local, got); err != nil {
		return nack(in, classify(err), true, "%v", err)
	}
	if adopting != nil {
		got = e.ownAdoptedFields(ctx, pub, got)
		e.recordAdoption(ctx, pub, got, adopting, remote)
	}
	from := adoptedFrom(local.GetAnnotations())
	if from == ferryv1.AdoptedFrom_ADOPTED_FROM_API_SYNCAGENT {
		// Its last-known state goes once the copy is ferry's; retried
		// (the copy stays adopted) until it is gone.
		if err := e.clearSyncAgentState(ctx, pub, k, key.GetCluster(), &obj); err != nil {
			return nack(in, classify(err), true, "the copy %s %s is adopted: %v", pub.LocalKind, nsName(ns, name), err)
		}
	}
	e.record(k, hash, pub.Shape, ns, name, copyGeneration(got))
	return &ferryv1.IntentResult{Key: key, Version: in.GetVersion(), LocalNamespace: ns, LocalName: name, AdoptedFrom: from}
}

// findLocal returns the local copy of remote, found by its labels (those of
// w's kcp resource only); a copy whose annotations contradict its labels
// (tampered) is not trusted.
func (e *Engine) findLocal(w *localWatch, remote naming.Remote) *unstructured.Unstructured {
	for _, u := range cachedCopies(w.store, remote) {
		if u.GetLabels()[naming.LabelRemoteResource] == w.pub.resourceLabel() {
			return u
		}
	}
	return nil
}

// cachedCopies returns the objects of a copies' cache whose labels name
// remote's workspace, namespace and name and whose annotations agree (a
// copy whose annotations contradict its labels is tampered: not trusted).
func cachedCopies(store cache.Indexer, remote naming.Remote) []*unstructured.Unstructured {
	if store == nil {
		return nil
	}
	objs, err := store.ByIndex(remoteIndex, remoteIndexKey(remote))
	if err != nil {
		return nil
	}
	var out []*unstructured.Unstructured
	for _, o := range objs {
		u := o.(*unstructured.Unstructured)
		if got, ok := naming.RemoteFrom(u.GetLabels(), u.GetAnnotations()); ok && got.Namespace == remote.Namespace && got.Name == remote.Name {
			out = append(out, u)
		}
	}
	return out
}

// localChanged reports the status of a local copy when it changed, and
// queues a repair when someone else changed what ferry applied (old is nil
// for an added copy).
func (e *Engine) localChanged(w *localWatch, old, obj any) {
	e.repairIfDrifted(w, old, obj)
	e.mu.Lock()
	defer e.mu.Unlock()
	if u, ok := obj.(*unstructured.Unstructured); ok {
		e.primaryCachedLocked(w, u)
		if before, ok := old.(*unstructured.Unstructured); ok && !sameIdentity(w.pub, before, u) {
			// Applied for another kcp object (recreated with a new UID):
			// the references are kept by the kcp object's identity, and
			// the old one's would count as a second referrer.
			e.forgetRelatedLocked(w, before)
		}
	}
	e.reportStatusLocked(w, obj)
	e.reportRelatedLocked(w, obj)
}

func remoteKey(p *Published, remote naming.Remote) *ferryv1.ObjectKey {
	return &ferryv1.ObjectKey{
		Cluster:   remote.ClusterName,
		Resource:  &ferryv1.GroupVersionResource{Group: p.Remote.Group, Version: p.Remote.Version, Resource: p.Remote.Resource},
		Namespace: remote.Namespace,
		Name:      remote.Name,
		Uid:       remote.UID,
	}
}

func nsName(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

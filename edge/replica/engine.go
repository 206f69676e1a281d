// Package replica is the edge's half of object sync. It applies the
// broker's sync intents to the service cluster (reverse projection, naming,
// namespaces, labels pointing back to kcp, adoption of an existing object at
// the target name) with server-side apply, and reports back: a result per
// intent, the local status when it changes, and a deletion confirmation once
// a local copy is gone.
//
// Why server-side apply: the edge's field manager owns exactly the fields the
// kcp object sets. Fields that other service-cluster controllers or webhooks
// set are kept (they own them), and a field removed in kcp is removed locally
// because the next apply no longer contains it — the three-way merge the
// sync semantics ask for, kept by the API server instead of a last-applied
// record on every object.
package replica

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/mutation"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/objects"
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
	Wake    func()
	Log     logr.Logger
}

// Engine applies intents and produces reports. Safe for concurrent use.
type Engine struct {
	opts  Options
	queue workqueue.TypedRateLimitingInterface[string]

	mu        sync.Mutex
	ctx       context.Context
	published map[string]*Published // by PublishedResource name
	watches   map[string]*localWatch
	latest    map[string]*ferryv1.SyncIntent // by object key, awaiting apply
	deleting  map[string]*ferryv1.SyncIntent // by object key, delete issued, awaiting gone
	statusSum map[string][32]byte            // by object key, last status reported
	out       []*ferryv1.ConnectRequest
	reportID  uint64
	connected bool
	// namespaces this engine has seen to exist; avoids a request per apply.
	namespaces map[string]bool
	// related objects (related.go)
	relWatches map[schema.GroupVersionResource]*relatedWatch
	relRefs    *refindex.Index[relKey] // which local related object each reference points at
	relSum     map[relKey][32]byte     // last report per reference
}

type localWatch struct {
	pub    *Published
	store  cache.Indexer
	cancel context.CancelFunc
	synced bool // the informer has listed the local copies
}

// NewEngine returns an engine; Run starts it.
func NewEngine(o Options) *Engine {
	return &Engine{
		opts: o,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "apply"}),
		published:  map[string]*Published{},
		watches:    map[string]*localWatch{},
		latest:     map[string]*ferryv1.SyncIntent{},
		deleting:   map[string]*ferryv1.SyncIntent{},
		statusSum:  map[string][32]byte{},
		namespaces: map[string]bool{},
		relWatches: map[schema.GroupVersionResource]*relatedWatch{},
		relRefs:    refindex.New[relKey](),
		relSum:     map[relKey][32]byte{},
	}
}

// Run applies intents with workers goroutines until ctx ends.
func (e *Engine) Run(ctx context.Context, workers int) error {
	e.mu.Lock()
	e.ctx = ctx
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
		return
	}
	if w, ok := e.watches[p.Name]; ok {
		w.cancel()
		delete(e.watches, p.Name)
	}
	e.published[p.Name] = p
	e.watchLocked(p)
	e.ensureRelatedWatchesLocked()
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
	e.ensureRelatedWatchesLocked()
}

func (e *Engine) forRemote(gvr *ferryv1.GroupVersionResource) (*Published, *localWatch) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for name, p := range e.published {
		if p.Remote.Group == gvr.GetGroup() && p.Remote.Resource == gvr.GetResource() && p.Remote.Version == gvr.GetVersion() {
			return p, e.watches[name]
		}
	}
	return nil, nil
}

// watchLocked starts the informer on p's local copies (this agent's only).
func (e *Engine) watchLocked(p *Published) {
	if e.ctx == nil {
		return
	}
	ctx, cancel := context.WithCancel(e.ctx)
	w := &localWatch{pub: p, cancel: cancel}
	e.watches[p.Name] = w
	lw := watching.ListWatch(e.opts.Dynamic.Resource(p.Local), naming.LabelAgent+"="+e.opts.Agent)
	informer := cache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, 0, cache.Indexers{remoteIndex: indexByRemote})
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { e.localChanged(w, obj) },
		UpdateFunc: func(_, obj any) { e.localChanged(w, obj) },
		DeleteFunc: func(obj any) { e.localGone(w, obj) },
	})
	w.store = informer.GetIndexer()
	go informer.RunWithContext(ctx)
	go func() {
		if cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
			e.mu.Lock()
			defer e.mu.Unlock()
			w.synced = true
			if e.watches[p.Name] == w {
				e.sendInventoryLocked(w)
			}
		}
	}()
}

// inventoryChunk bounds the entries per Inventory message.
const inventoryChunk = 500

// sendInventoryLocked tells the broker which kcp states this agent's local
// copies of w's resource were applied from, so it re-sends only what
// differs. Sent once the local watch is synced, on every stream.
func (e *Engine) sendInventoryLocked(w *localWatch) {
	if !e.connected || !w.synced {
		return
	}
	var entries []*ferryv1.InventoryEntry
	for _, o := range w.store.List() {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		remote, ok := naming.RemoteFrom(u.GetLabels(), u.GetAnnotations())
		if !ok {
			continue
		}
		entries = append(entries, &ferryv1.InventoryEntry{
			Key:                    remoteKey(w.pub, remote),
			AppliedResourceVersion: u.GetAnnotations()[naming.AnnotationResourceVersion],
			PublishedResource:      w.pub.Name,
		})
	}
	for {
		n := min(len(entries), inventoryChunk)
		e.emitLocked(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_Inventory{Inventory: &ferryv1.Inventory{
			PublishedResource: w.pub.Name, Entries: entries[:n], Complete: n == len(entries),
		}}})
		entries = entries[n:]
		if len(entries) == 0 {
			return
		}
	}
}

func indexByRemote(obj any) ([]string, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, nil
	}
	l := u.GetLabels()
	return []string{l[naming.LabelRemoteCluster] + "|" + l[naming.LabelNamespaceHash] + "|" + l[naming.LabelNameHash]}, nil
}

func remoteIndexKey(remote naming.Remote) string {
	return remote.ClusterName + "|" + naming.Hash(remote.Namespace) + "|" + naming.Hash(remote.Name)
}

// Handle takes a sync intent from the broker (latest wins per object).
func (e *Engine) Handle(in *ferryv1.SyncIntent) {
	k := protocol.IntentKey(in.GetKey(), in.GetRelatedTo())
	e.mu.Lock()
	e.latest[k] = in
	e.mu.Unlock()
	e.queue.Add(k)
}

// Connected resets per-stream state: report ids restart, and every local
// status is reported again (the broker keeps nothing across streams).
func (e *Engine) Connected() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.connected = true
	e.reportID = 0
	clear(e.statusSum)
	clear(e.relSum)
	for _, w := range e.watches {
		e.sendInventoryLocked(w)
		if !w.synced {
			continue
		}
		for _, obj := range w.store.List() {
			e.reportStatusLocked(w, obj)
			e.reportRelatedLocked(w, obj)
		}
	}
}

// Disconnected drops what only made sense on the stream.
func (e *Engine) Disconnected() {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.connected = false
	e.out = nil
	clear(e.latest)
}

// Outgoing returns the reports to send now.
func (e *Engine) Outgoing() []*ferryv1.ConnectRequest {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := e.out
	e.out = nil
	return out
}

func (e *Engine) emitLocked(m *ferryv1.ConnectRequest) {
	if !e.connected {
		return
	}
	e.out = append(e.out, m)
	e.opts.Wake()
}

func (e *Engine) next(ctx context.Context) bool {
	k, shutdown := e.queue.Get()
	if shutdown {
		return false
	}
	defer e.queue.Done(k)
	e.mu.Lock()
	in := e.latest[k]
	delete(e.latest, k)
	e.mu.Unlock()
	if in == nil {
		return true
	}
	if !e.ready(in) {
		// The local copies are not listed yet: applying now could miss an
		// existing copy (a delete would be confirmed without deleting it).
		// Keep the intent unless a newer one arrived and try again shortly.
		e.mu.Lock()
		if _, newer := e.latest[k]; !newer {
			e.latest[k] = in
		}
		e.mu.Unlock()
		e.queue.AddRateLimited(k)
		return true
	}
	e.queue.Forget(k)
	var res *ferryv1.IntentResult
	if in.GetRelatedTo() != nil {
		res = e.applyRelated(ctx, in)
		res.RelatedTo = in.GetRelatedTo()
	} else {
		res = e.apply(ctx, in)
	}
	e.mu.Lock()
	e.emitLocked(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_IntentResult{IntentResult: res}})
	e.mu.Unlock()
	return true
}

// ready tells whether the local watch of in's resource has synced; intents
// for resources this edge does not publish are ready (they are refused).
func (e *Engine) ready(in *ferryv1.SyncIntent) bool {
	if in.GetRelatedTo() != nil {
		return e.relatedReady(in)
	}
	_, w := e.forRemote(in.GetKey().GetResource())
	if w == nil {
		return true
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return w.synced
}

func nack(in *ferryv1.SyncIntent, reason ferryv1.ApplyErrorReason, retryable bool, format string, args ...any) *ferryv1.IntentResult {
	return &ferryv1.IntentResult{Key: in.GetKey(), Version: in.GetVersion(), Error: &ferryv1.ApplyError{
		Reason: reason, Message: fmt.Sprintf(format, args...), Retryable: retryable,
	}}
}

func (e *Engine) apply(ctx context.Context, in *ferryv1.SyncIntent) *ferryv1.IntentResult {
	pub, w := e.forRemote(in.GetKey().GetResource())
	if pub == nil || w == nil {
		return nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_PUBLISHED, true,
			"no PublishedResource of this edge publishes %s.%s", in.GetKey().GetResource().GetResource(), in.GetKey().GetResource().GetGroup())
	}
	key := in.GetKey()
	remote := naming.Remote{ClusterName: key.GetCluster(), Namespace: key.GetNamespace(), Name: key.GetName(), UID: key.GetUid()}
	existing := e.findLocal(w, remote)

	if in.GetDelete() != nil {
		return e.delete(ctx, in, w, existing)
	}
	var obj unstructured.Unstructured
	// Kubernetes' JSON decoding keeps whole numbers int64 (as CEL and the
	// API server expect), unlike encoding/json's float64.
	if err := utiljson.Unmarshal(in.GetUpsert().GetObject(), &obj.Object); err != nil {
		return nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_INVALID, false, "the object is not valid JSON: %v", err)
	}
	remote.WorkspacePath = in.GetUpsert().GetWorkspacePath()
	ns, name, err := pub.Naming.Local(remote, pub.Namespaced)
	if err != nil {
		return nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_INVALID, false, "naming: %v", err)
	}
	if existing != nil {
		// Keep the object where it is even if naming rules changed since.
		ns, name = existing.GetNamespace(), existing.GetName()
	}
	if ns != "" {
		if err := e.ensureNamespace(ctx, ns); err != nil {
			return nack(in, classify(err), true, "cannot create namespace %s: %v", ns, err)
		}
	}
	local := objects.DesiredState(&obj)
	objects.Retype(local, pub.LocalGVK())
	var existingObj map[string]any
	if existing != nil {
		existingObj = existing.Object
	}
	if err := pub.SpecMutator.Apply(local.Object, mutation.Objects{Local: existingObj, Remote: obj.Object}); err != nil {
		return nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_INVALID, false, "mutation failed: %v", err)
	}
	// Identity and bookkeeping are set after mutations, which cannot change them.
	local.SetNamespace(ns)
	local.SetName(name)
	local.SetLabels(objects.MergeStrings(local.GetLabels(), naming.Labels(e.opts.Agent, remote)))
	ann := objects.MergeStrings(local.GetAnnotations(), naming.Annotations(remote))
	ann[naming.AnnotationResourceVersion] = in.GetVersion().GetResourceVersion()
	local.SetAnnotations(ann)

	_, err = e.opts.Dynamic.Resource(pub.Local).Namespace(ns).Apply(ctx, name, local, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	if apierrors.IsNotFound(err) && ns != "" {
		e.mu.Lock()
		delete(e.namespaces, ns) // deleted behind our back; recreated on retry
		e.mu.Unlock()
	}
	if err != nil {
		return nack(in, classify(err), true, "the service cluster refused %s %s: %v", pub.LocalKind, nsName(ns, name), err)
	}
	return &ferryv1.IntentResult{Key: key, Version: in.GetVersion(), LocalNamespace: ns, LocalName: name}
}

func (e *Engine) delete(ctx context.Context, in *ferryv1.SyncIntent, w *localWatch, existing *unstructured.Unstructured) *ferryv1.IntentResult {
	k := protocol.ObjectKeyString(in.GetKey())
	if existing == nil {
		e.mu.Lock()
		e.confirmLocked(in)
		e.mu.Unlock()
		return &ferryv1.IntentResult{Key: in.GetKey(), Version: in.GetVersion()}
	}
	if err := e.deleteRelatedCopies(ctx, w.pub, in.GetKey().GetUid()); err != nil {
		return nack(in, classify(err), true, "%v", err)
	}
	e.mu.Lock()
	e.deleting[k] = in
	e.mu.Unlock()
	policy := metav1.DeletePropagationBackground
	err := e.opts.Dynamic.Resource(w.pub.Local).Namespace(existing.GetNamespace()).Delete(ctx, existing.GetName(), metav1.DeleteOptions{PropagationPolicy: &policy})
	switch {
	case apierrors.IsNotFound(err):
		e.mu.Lock()
		delete(e.deleting, k)
		e.confirmLocked(in)
		e.mu.Unlock()
	case err != nil:
		return nack(in, classify(err), true, "cannot delete %s %s: %v", w.pub.LocalKind, nsName(existing.GetNamespace(), existing.GetName()), err)
	}
	// Confirmed when the informer sees the object gone (it may have
	// finalizers of its own).
	return &ferryv1.IntentResult{Key: in.GetKey(), Version: in.GetVersion(), LocalNamespace: existing.GetNamespace(), LocalName: existing.GetName()}
}

func (e *Engine) confirmLocked(in *ferryv1.SyncIntent) {
	e.reportID++
	e.emitLocked(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_DeletionConfirmation{DeletionConfirmation: &ferryv1.DeletionConfirmation{
		ReportId: e.reportID, Key: in.GetKey(), Version: in.GetVersion(),
	}}})
}

// findLocal returns the local copy of remote, found by its labels; a copy
// whose annotations contradict its labels (tampered) is not trusted.
func (e *Engine) findLocal(w *localWatch, remote naming.Remote) *unstructured.Unstructured {
	objs, err := w.store.ByIndex(remoteIndex, remoteIndexKey(remote))
	if err != nil {
		return nil
	}
	for _, o := range objs {
		u := o.(*unstructured.Unstructured)
		got, ok := naming.RemoteFrom(u.GetLabels(), u.GetAnnotations())
		if ok && got.Namespace == remote.Namespace && got.Name == remote.Name {
			return u
		}
	}
	return nil
}

// ensureNamespace creates ns unless this engine already saw it. A
// namespace deleted later makes the apply fail (NotFound), which forgets it
// here, and the broker's retry creates it again.
func (e *Engine) ensureNamespace(ctx context.Context, ns string) error {
	e.mu.Lock()
	known := e.namespaces[ns]
	e.mu.Unlock()
	if known {
		return nil
	}
	_, err := e.opts.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: ns, Labels: map[string]string{naming.LabelAgent: e.opts.Agent},
	}}, metav1.CreateOptions{FieldManager: FieldManager})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	e.mu.Lock()
	e.namespaces[ns] = true
	e.mu.Unlock()
	return nil
}

// localChanged reports the status of a local copy when it changed.
func (e *Engine) localChanged(w *localWatch, obj any) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.reportStatusLocked(w, obj)
	e.reportRelatedLocked(w, obj)
}

func (e *Engine) reportStatusLocked(w *localWatch, obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok || !w.pub.HasStatus {
		return
	}
	remote, ok := naming.RemoteFrom(u.GetLabels(), u.GetAnnotations())
	if !ok {
		return
	}
	if !w.pub.StatusMutator.Empty() {
		mutated := u.DeepCopy()
		if err := w.pub.StatusMutator.Apply(mutated.Object, mutation.Objects{Local: u.Object}); err != nil {
			e.opts.Log.Error(err, "status mutation failed; status not reported", "object", u.GetNamespace()+"/"+u.GetName())
			return
		}
		u = mutated
	}
	status, found := u.Object["status"]
	if !found {
		return
	}
	data, err := json.Marshal(status)
	if err != nil {
		return
	}
	key := remoteKey(w.pub, remote)
	k := protocol.ObjectKeyString(key)
	sum := sha256.Sum256(data)
	if prev, ok := e.statusSum[k]; ok && prev == sum {
		return
	}
	e.statusSum[k] = sum
	e.reportID++
	e.emitLocked(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_StatusReport{StatusReport: &ferryv1.StatusReport{
		ReportId: e.reportID, Key: key, Status: data, LocalResourceVersion: u.GetResourceVersion(),
	}}})
}

// localGone confirms a deletion the broker asked for.
func (e *Engine) localGone(w *localWatch, obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	remote, ok := naming.RemoteFrom(u.GetLabels(), u.GetAnnotations())
	if !ok {
		return
	}
	k := protocol.ObjectKeyString(remoteKey(w.pub, remote))
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.statusSum, k)
	e.forgetRelatedLocked(w, u)
	if in, ok := e.deleting[k]; ok {
		delete(e.deleting, k)
		e.confirmLocked(in)
	}
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

func classify(err error) ferryv1.ApplyErrorReason {
	switch {
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err), apierrors.IsForbidden(err), apierrors.IsNotFound(err):
		return ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_REJECTED
	case apierrors.IsConflict(err), apierrors.IsAlreadyExists(err):
		return ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT
	default:
		return ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_UNAVAILABLE
	}
}

func nsName(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

package replication

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/ferry-dev/ferry/pkg/logging"

	"github.com/kcp-dev/logicalcluster/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/workqueue"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/kcp"
	"github.com/ferry-dev/ferry/pkg/objects"
)

// The per-object decision: what one cached object (or one that left the
// cache) asks of the edge, as intents in the outbox.

// processNext turns the next queued object into intents (blocking until
// there is one); false once the queue is shut down.
func (m *Manager) processNext(ctx context.Context) bool {
	return m.processNextOf(m.queue, "syncing object failed; retrying", func(it item) error {
		if err := m.process(ctx, it); err != nil {
			return err
		}
		m.resyncProcessed(it)
		return nil
	})
}

// processNextOf takes q's next item (blocking until there is one) and
// handles it with f; when f fails, failed is logged and the item retried
// with q's backoff. false once q is shut down.
func (m *Manager) processNextOf(q workqueue.TypedRateLimitingInterface[item], failed string, f func(item) error) bool {
	it, shutdown := q.Get()
	if shutdown {
		return false
	}
	defer q.Done(it)
	if err := f(it); err != nil {
		m.opts.Log.Error(err, failed, logging.KeyPublishedResource, it.pr, logging.KeyObject, it.key)
		q.AddRateLimited(it)
		return true
	}
	q.Forget(it)
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

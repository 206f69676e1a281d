package replication

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
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
// kcp for the primary: nothing on the way to the edge waits for kcp. The
// decision itself is the ordered steps of steps.go.
func (m *Manager) process(ctx context.Context, it item) error {
	if it.related != "" {
		return m.processRelated(ctx, it)
	}
	s, ok, err := m.objectState(it)
	if err != nil || !ok {
		return err
	}
	_, err = decide(ctx, s, m.effects())
	return err
}

// objectState reads what the steps decide on for the primary it from the
// manager; false when its PublishedResource is not watched.
func (m *Manager) objectState(it item) (objectState, bool, error) {
	m.mu.Lock()
	w, ok := m.running[it.pr]
	m.mu.Unlock()
	if !ok {
		return objectState{}, false, nil
	}
	raw, exists, err := w.store.GetByKey(it.key)
	if err != nil {
		return objectState{}, false, err
	}
	listed := m.listedFor(w.store, parseStoreKey(it.key).cluster)
	m.mu.Lock()
	s := objectState{it: it, res: w.res, listed: listed, open: m.open[it.pr], withdrawn: m.withdrawn[it.pr]}
	m.mu.Unlock()
	if exists {
		m.setObject(&s, raw.(*unstructured.Unstructured))
	}
	return s, true, nil
}

// setObject sets s's object (of s.res) and what the broker derives from it.
func (m *Manager) setObject(s *objectState, obj *unstructured.Unstructured) {
	s.obj = obj
	s.hasFinalizer = slices.Contains(obj.GetFinalizers(), m.finalizer)
	s.hasAdoptFinalizer = s.res.AdoptFinalizer != "" && slices.Contains(obj.GetFinalizers(), s.res.AdoptFinalizer)
	s.scope = m.scopeOf(s.res, obj)
}

// effects are the steps' effects on the manager: its ledger under m.mu,
// its outbox and its queues.
func (m *Manager) effects() *stepEffects {
	return &stepEffects{
		withLedger: func(f func(*ledger)) {
			m.mu.Lock()
			defer m.mu.Unlock()
			f(m.ledger)
		},
		put:                 m.opts.Outbox.Put,
		drop:                func(key *ferryv1.ObjectKey) { m.opts.Outbox.Drop(key, nil) },
		queueFinalizer:      m.finalizers.Add,
		queueRelated:        func(it item) { m.queueRelatedLocked(it.pr, it.key) },
		queueServiceRelated: func(it item) { m.queueServiceRelated(it.pr, it.key) },
		resynced:            m.resyncedLocked,
		forgetResync:        func(it item) { delete(m.resyncing, it) },
		workspacePath:       m.workspacePath,
		warn: func(ctx context.Context, pr string, key *ferryv1.ObjectKey, reason, message string) {
			if err := m.recordEvent(ctx, pr, key, "Warning", reason, message); err != nil {
				m.opts.Log.Error(err, "cannot record an Event in kcp", logging.KeyObject, KeyString(key), "reason", reason)
			}
		},
		log: m.opts.Log,
	}
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

func objectKey(obj *unstructured.Unstructured, gvr schema.GroupVersionResource) *ferryv1.ObjectKey {
	return &ferryv1.ObjectKey{
		Cluster:   logicalcluster.From(obj).String(),
		Resource:  &ferryv1.GroupVersionResource{Group: gvr.Group, Version: gvr.Version, Resource: gvr.Resource},
		Namespace: obj.GetNamespace(),
		Name:      obj.GetName(),
		Uid:       string(obj.GetUID()),
	}
}

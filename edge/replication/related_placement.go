package replication

import (
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// Placement of kcp-origin related copies reads the reference on the local
// primary, from the informer cache. The broker sends a related object once
// the edge acknowledged the primary's apply, which can be before the cache
// holds that version: placed by the version before, the copy would land
// where the old reference pointed and stay there. So a related upsert waits
// — unanswered, in the intent queue — until the cache holds the primary
// this engine applied last (its content hash), and is processed again on
// the primary's informer event; never polled. The wait is bounded
// (relatedPrimaryWait, one delayed requeue): then it is answered
// NOT_READY and the broker retries it with backoff.

// relatedPrimaryWait bounds the wait for the cache to hold the primary
// this engine applied.
const relatedPrimaryWait = 10 * time.Second

// waitForPrimary tells whether the related upsert in (queue key k) must
// wait for the cache to hold its primary's applied version (then it is
// queued again on the primary's informer event, or after
// relatedPrimaryWait), or, when it waited that long already, answers it.
func (e *Engine) waitForPrimary(k queueKey, in *ferryv1.SyncIntent) (wait bool, answer *ferryv1.IntentResult) {
	if in.GetUpsert() == nil {
		return false, nil
	}
	pk := in.GetRelatedTo().GetPrimary()
	e.mu.Lock()
	defer e.mu.Unlock()
	primaryKey := k.object
	rec := e.ledger.get(primaryKey)
	pub := e.published[in.GetPublishedResource()]
	if rec == nil || !rec.applied || pub == nil || e.watches[pub.Name] == nil {
		// Applied by an earlier process (the cache is all there is), or
		// refused by applyRelated.
		return false, nil
	}
	primary := e.findLocal(e.watches[pub.Name], remoteOf(pk))
	if cachedApplied(primary, pk, rec.hash) {
		e.unparkLocked(primaryKey, k)
		return false, nil
	}
	since, parked := e.relParked[primaryKey][k]
	if parked && time.Since(since) >= relatedPrimaryWait {
		e.unparkLocked(primaryKey, k)
		return false, nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_READY, true,
			"related %q: the edge's cache does not hold the primary object as applied after %s", in.GetRelatedTo().GetIdentifier(), relatedPrimaryWait)
	}
	if !parked {
		if e.relParked[primaryKey] == nil {
			e.relParked[primaryKey] = map[queueKey]time.Time{}
		}
		e.relParked[primaryKey][k] = time.Now()
		e.queue.AddAfter(k, relatedPrimaryWait) // the bound
	}
	if e.ledger.pending[k] == nil {
		e.ledger.received(k, in) // kept unless a newer one arrived meanwhile
	}
	return true, nil
}

// unparkLocked forgets that k waits for primary.
func (e *Engine) unparkLocked(primary ledgerKey, k queueKey) {
	delete(e.relParked[primary], k)
	if len(e.relParked[primary]) == 0 {
		delete(e.relParked, primary)
	}
}

// cachedApplied tells whether primary, the cache's copy of pk, is exactly
// that object (UID) at the version applied with content hash hash.
func cachedApplied(primary *unstructured.Unstructured, pk *ferryv1.ObjectKey, hash string) bool {
	return primary != nil && sameObject(primary, pk) && primary.GetAnnotations()[naming.AnnotationContentHash] == hash
}

// primaryCachedLocked queues the related upserts that wait for the cache
// to hold primary, a local copy the informer just delivered (they check
// again).
func (e *Engine) primaryCachedLocked(w *localWatch, primary *unstructured.Unstructured) {
	if len(e.relParked) == 0 {
		return
	}
	remote, ok := naming.RemoteFrom(primary.GetLabels(), primary.GetAnnotations())
	if !ok {
		return
	}
	for k := range e.relParked[keyFor(w.pub.Name, remoteKey(w.pub, remote))] {
		e.queue.Add(k)
	}
}

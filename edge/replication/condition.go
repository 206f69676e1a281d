package replication

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

// conditionFieldManager owns the Synced condition of PublishedResources;
// the publish controller owns Published.
const conditionFieldManager = "ferry-edge-replica"

// syncedCondition is what the Synced condition and the object counts of a
// PublishedResource's status say.
type syncedCondition struct {
	status  metav1.ConditionStatus
	reason  string
	message string
	// copies, failing, conflicting and relatedFailing are status.objects.
	copies, failing, conflicting, relatedFailing int
}

// copiesStatusDelay batches the status writes that only a changed number of
// copies calls for: a burst of creations writes the count once per delay,
// not once per copy. Refusals and the watch's state are written at once.
const copiesStatusDelay = 2 * time.Second

// syncedConditionLocked is the Synced condition w's state calls for, with
// refused the objects refused for good.
func syncedConditionLocked(w *localWatch, refused refusalCounts) syncedCondition {
	if !w.synced {
		if w.lastErr != nil {
			return syncedCondition{status: metav1.ConditionFalse, reason: ferryv1alpha1.ReasonLocalWatchFailed,
				message: "the edge cannot watch the local copies (its objects are not synced until it can): " + w.lastErr.Error()}
		}
		return syncedCondition{status: metav1.ConditionUnknown, reason: "Listing", message: "the edge is listing the local copies"}
	}
	msg := "the edge watches the local copies"
	switch n := refused.conflicting; n {
	case 0:
	case 1:
		msg += "; 1 object is refused because its local name is taken by an object that is not its copy (see the SyncFailed Event on the kcp object; " +
			"spec.conflictPolicy Adopt takes such an object over)"
	default:
		msg += fmt.Sprintf("; %d objects are refused because their local names are taken by objects that are not their copies (see the SyncFailed Events "+
			"on the kcp objects; spec.conflictPolicy Adopt takes such objects over)", n)
	}
	switch n := refused.failing; n {
	case 0:
	case 1:
		msg += "; 1 object fails to sync (see the SyncFailed Event on the kcp object)"
	default:
		msg += fmt.Sprintf("; %d objects fail to sync (see the SyncFailed Events on the kcp objects)", n)
	}
	switch n := refused.relatedFailing; n {
	case 0:
	case 1:
		msg += "; 1 related object is refused (see the Related* Event on its primary in kcp)"
	default:
		msg += fmt.Sprintf("; %d related objects are refused (see the Related* Events on their primaries in kcp)", n)
	}
	if refused.failing+refused.conflicting+refused.relatedFailing > 0 && refused.latest != "" {
		msg += "; latest: " + refused.latest
	}
	return syncedCondition{status: metav1.ConditionTrue, reason: ferryv1alpha1.ReasonWatching, message: msg,
		copies: len(w.store.ListKeys()), failing: refused.failing, conflicting: refused.conflicting, relatedFailing: refused.relatedFailing}
}

// writeSyncedCondition applies the Synced condition and status.objects of
// PublishedResource name when they differ from what was last written.
func (e *Engine) writeSyncedCondition(ctx context.Context, name string) error {
	e.mu.Lock()
	w, ok := e.watches[name]
	if !ok {
		e.mu.Unlock()
		return nil
	}
	want := syncedConditionLocked(w, e.ledger.refusals(name))
	written := w.condition
	e.mu.Unlock()
	if written != nil && *written == want {
		return nil
	}
	status := map[string]any{"conditions": []any{map[string]any{
		"type": ferryv1alpha1.ConditionSynced, "status": string(want.status), "reason": want.reason,
		"message": want.message, "lastTransitionTime": time.Now().UTC().Format(time.RFC3339),
	}}}
	if want.status == metav1.ConditionTrue {
		// Counted only while the edge watches the copies: the last counts
		// written stay meanwhile (this field manager keeps owning them).
		status["objects"] = want.objects()
	} else if written != nil {
		want.copies, want.failing, want.conflicting, want.relatedFailing = written.copies, written.failing, written.conflicting, written.relatedFailing
		status["objects"] = want.objects()
	}
	pr := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": ferryv1alpha1.GroupVersion.String(), "kind": "PublishedResource",
		"metadata": map[string]any{"name": name},
		"status":   status,
	}}
	_, err := e.opts.Dynamic.Resource(ferryv1alpha1.GroupVersion.WithResource("publishedresources")).
		ApplyStatus(ctx, name, pr, metav1.ApplyOptions{FieldManager: conditionFieldManager, Force: true})
	if err != nil {
		return fmt.Errorf("cannot write the Synced condition of PublishedResource %s: %w", name, err)
	}
	e.mu.Lock()
	if e.watches[name] == w {
		w.condition = &want
	}
	e.mu.Unlock()
	return nil
}

// objects is status.objects as c counts them.
func (c syncedCondition) objects() map[string]any {
	return map[string]any{
		"synced": int64(c.copies), "failing": int64(c.failing), "conflicting": int64(c.conflicting), "relatedFailing": int64(c.relatedFailing),
	}
}

// copiesChanged queues the status of w's PublishedResource after a copy
// appeared or left (batched, copiesStatusDelay).
func (e *Engine) copiesChanged(w *localWatch) {
	e.queue.AddAfter(conditionKey(w.pub.Name), copiesStatusDelay)
}

// conditionKey is the apply-queue item that writes PublishedResource
// name's Synced condition (the queue serializes and retries it like
// applies).
func conditionKey(name string) queueKey { return queueKey{condition: name} }

// countRefusal keeps the counts of objects refused for good up to date
// with res, the answer to in, and queues the PublishedResource's status
// when they changed.
func (e *Engine) countRefusal(in *ferryv1.SyncIntent, res *ferryv1.IntentResult) {
	if rt := in.GetRelatedTo(); rt != nil {
		// A kcp-origin related object: routed by its primary's resource.
		pub, w := e.forRemote(rt.GetPrimary().GetResource())
		if w == nil {
			return
		}
		rk := relKey{primary: keyFor(pub.Name, rt.GetPrimary()), id: rt.GetIdentifier()}
		refused := refusalOf(res.GetError()) != refusalNone
		if !refused && res.GetError() != nil && in.GetDelete() == nil {
			return // retryable: neither refused nor cleared
		}
		e.mu.Lock()
		changed := e.ledger.relatedAnswered(rk, refused, res.GetError().GetMessage())
		e.mu.Unlock()
		if changed {
			e.queue.Add(conditionKey(pub.Name))
		}
		return
	}
	pub, w := e.forRemote(in.GetKey().GetResource())
	if w == nil {
		return
	}
	kind := refusalOf(res.GetError())
	e.mu.Lock()
	changed := e.ledger.answered(keyFor(pub.Name, in.GetKey()), kind, res.GetError().GetMessage(), res.GetError() == nil || in.GetDelete() != nil)
	e.mu.Unlock()
	if changed {
		e.queue.Add(conditionKey(pub.Name))
	}
}

// refusalOf classifies an answer's error. Only final refusals count: a
// retryable one (the service cluster unreachable, a 409 of the API server,
// a cache not ready) is the broker's to retry, and a withdrawn
// PublishedResource (NOT_PUBLISHED) is told by its Published condition.
func refusalOf(err *ferryv1.ApplyError) refusalKind {
	switch {
	case err == nil || err.GetRetryable():
		return refusalNone
	case err.GetReason() == ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT:
		return refusalConflict
	case err.GetReason() == ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_PUBLISHED:
		return refusalNone
	default:
		return refusalFailing
	}
}

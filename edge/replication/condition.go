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

// syncedCondition is what the Synced condition says.
type syncedCondition struct {
	status  metav1.ConditionStatus
	reason  string
	message string
}

// syncedConditionLocked is the Synced condition w's state calls for, with
// conflicts objects refused because their local name is taken.
func syncedConditionLocked(w *localWatch, conflicts int) syncedCondition {
	if w.synced {
		msg := "the edge watches the local copies"
		switch n := conflicts; n {
		case 0:
		case 1:
			msg += "; 1 object is refused because its local name is taken by an object that is not its copy (see the SyncFailed Event on the kcp object; " +
				"spec.conflictPolicy Adopt takes such an object over)"
		default:
			msg += fmt.Sprintf("; %d objects are refused because their local names are taken by objects that are not their copies (see the SyncFailed Events "+
				"on the kcp objects; spec.conflictPolicy Adopt takes such objects over)", n)
		}
		return syncedCondition{metav1.ConditionTrue, ferryv1alpha1.ReasonWatching, msg}
	}
	if w.lastErr != nil {
		return syncedCondition{metav1.ConditionFalse, ferryv1alpha1.ReasonLocalWatchFailed,
			"the edge cannot watch the local copies (its objects are not synced until it can): " + w.lastErr.Error()}
	}
	return syncedCondition{metav1.ConditionUnknown, "Listing", "the edge is listing the local copies"}
}

// writeSyncedCondition applies the Synced condition of PublishedResource
// name when it differs from what was last written.
func (e *Engine) writeSyncedCondition(ctx context.Context, name string) error {
	e.mu.Lock()
	w, ok := e.watches[name]
	if !ok {
		e.mu.Unlock()
		return nil
	}
	conflicts := e.ledger.conflicts(name)
	want := syncedConditionLocked(w, conflicts)
	written := w.condition
	e.mu.Unlock()
	if written != nil && *written == want {
		return nil
	}
	// status.conflicts goes with the condition that tells of them (one
	// apply; the message changes whenever the count does).
	pr := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": ferryv1alpha1.GroupVersion.String(), "kind": "PublishedResource",
		"metadata": map[string]any{"name": name},
		"status": map[string]any{"conditions": []any{map[string]any{
			"type": ferryv1alpha1.ConditionSynced, "status": string(want.status), "reason": want.reason,
			"message": want.message, "lastTransitionTime": time.Now().UTC().Format(time.RFC3339),
		}}, "conflicts": int64(conflicts)},
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

// conditionKey is the apply-queue item that writes PublishedResource
// name's Synced condition (the queue serializes and retries it like
// applies).
func conditionKey(name string) queueKey { return queueKey{condition: name} }

// countConflict keeps w's count of objects refused with a CONFLICT (their
// local name is taken) up to date with res, the answer to in, and queues
// the Synced condition when it changed.
func (e *Engine) countConflict(in *ferryv1.SyncIntent, res *ferryv1.IntentResult) {
	if in.GetRelatedTo() != nil {
		return
	}
	pub, w := e.forRemote(in.GetKey().GetResource())
	if w == nil {
		return
	}
	// Final CONFLICTs only: the refusals of a taken name (claim); a 409 of
	// the API server (retryable) is not one.
	conflict := res.GetError().GetReason() == ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT && !res.GetError().GetRetryable()
	e.mu.Lock()
	changed := e.ledger.answered(keyFor(pub.Name, in.GetKey()), conflict, res.GetError() == nil || in.GetDelete() != nil)
	e.mu.Unlock()
	if changed {
		e.queue.Add(conditionKey(pub.Name))
	}
}

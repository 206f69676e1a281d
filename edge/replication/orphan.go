package replication

import (
	"context"
	"encoding/json"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/logging"
)

// Orphaning a copy: the consumer deleted its kcp object with
// ferry.dev/deletion-policy: Orphan, and the PublishedResource allows it
// (the broker decides both and sets DeleteIntent.orphan). The copy stays in
// the service cluster but stops being ferry's: every ferry.dev/ label and
// annotation is removed and ferry.dev/orphaned-from names the kcp object it
// came from. Without the labels it leaves the local watch (the API server
// sends the watch a deletion with the labelled state), which confirms the
// deletion exactly as for a deleted copy, and the broker releases the
// finalizer. ferry never finds it again: no watch, inventory or delete
// selects it, and a new kcp object at its name meets a conflict. The
// kcp-origin related copies it uses are released before it
// (deleteRelatedCopies), so they stay with it.

// orphan strips ferry's labels and annotations from existing, k's copy
// (marked deleting by the caller). One merge patch, guarded by the copy's
// UID and resourceVersion: a copy changed since the cache saw it is
// retried, never patched blind.
func (e *Engine) orphan(ctx context.Context, in *ferryv1.SyncIntent, w *localWatch, existing *unstructured.Unstructured) *ferryv1.IntentResult {
	k := keyFor(w.pub.Name, in.GetKey())
	labels := map[string]any{}
	for l := range existing.GetLabels() {
		if strings.HasPrefix(l, "ferry.dev/") {
			labels[l] = nil
		}
	}
	annotations := map[string]any{}
	for a := range existing.GetAnnotations() {
		if strings.HasPrefix(a, "ferry.dev/") {
			annotations[a] = nil
		}
	}
	annotations[ferryv1alpha1.AnnotationOrphanedFrom] = k.String()
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid": existing.GetUID(), "resourceVersion": existing.GetResourceVersion(),
		"labels": labels, "annotations": annotations,
	}})
	if err == nil {
		_, err = e.opts.Dynamic.Resource(w.pub.Local).Namespace(existing.GetNamespace()).Patch(ctx, existing.GetName(), types.MergePatchType, patch,
			metav1.PatchOptions{FieldManager: FieldManager})
	}
	switch {
	case apierrors.IsNotFound(err):
		// Gone already: nothing is left to orphan.
		e.mu.Lock()
		e.confirmLocked(k, in.GetVersion())
		e.mu.Unlock()
	case err != nil:
		e.mu.Lock()
		e.ledger.deleteFailed(k)
		e.mu.Unlock()
		return nack(in, classify(err), true, "cannot orphan %s %s: %v", w.pub.LocalKind, nsName(existing.GetNamespace(), existing.GetName()), err)
	default:
		e.opts.Log.Info("local copy orphaned: its kcp object was deleted with deletion policy Orphan", logging.KeyPublishedResource, w.pub.Name,
			"local", nsName(existing.GetNamespace(), existing.GetName()), logging.KeyObject, k.String())
	}
	// Confirmed when the informer sees the copy leave the watch.
	return &ferryv1.IntentResult{Key: in.GetKey(), Version: in.GetVersion(), LocalNamespace: existing.GetNamespace(), LocalName: existing.GetName()}
}

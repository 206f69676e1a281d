package replication

import (
	"context"
	"fmt"

	"github.com/ferry-dev/ferry/pkg/logging"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// Deleting local copies: a deletion is confirmed only once the copy is
// known to be gone.

// delete deletes a local copy. Its deletion is confirmed only when the copy
// is known to be gone: on a cache miss for a copy this engine applied (the
// informer may not have seen its own apply yet), the copy is read live.
func (e *Engine) delete(ctx context.Context, in *ferryv1.SyncIntent, w *localWatch, existing *unstructured.Unstructured) *ferryv1.IntentResult {
	k := keyFor(w.pub.Name, in.GetKey())
	if existing == nil {
		e.mu.Lock()
		ns, name, known := e.ledger.appliedAt(k)
		e.mu.Unlock()
		if known {
			got, err := e.opts.Dynamic.Resource(w.pub.Local).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
			case err != nil:
				return nack(in, classify(err), true, "cannot read %s %s: %v", w.pub.LocalKind, nsName(ns, name), err)
			case isCopyOf(got, remoteOf(in.GetKey())) && got.GetLabels()[naming.LabelRemoteResource] == w.pub.resourceLabel():
				existing = got
			}
		}
	}
	if existing != nil && !sameObject(existing, in.GetKey()) {
		// The copy was taken over by the kcp object that replaced this one
		// (same name, new UID): this object's copy is gone.
		existing = nil
	}
	if existing == nil {
		// Not this agent's (by label), not applied by this process: a copy
		// an edge of another agent name made (the edge was renamed) sits
		// where the naming rules put it; it is this edge's to delete.
		other, err := e.copyOfAnotherAgent(ctx, w.pub, in.GetKey())
		if err != nil {
			return nack(in, classify(err), true, "%v", err)
		}
		if other != nil {
			return e.deleteUnwatched(ctx, in, w.pub, other)
		}
		// api-syncagent's copy of exactly this object, not adopted before
		// the kcp object's deletion (spec.adopt): ferry finishes what
		// api-syncagent would have done, and the broker then releases
		// api-syncagent's finalizer with its own (syncagent.go).
		sa, refusal, err := e.findSyncAgentCopy(ctx, w.pub, remoteOf(in.GetKey()))
		switch {
		case err != nil:
			return nack(in, classify(err), true, "%v", err)
		case refusal != "":
			// Not provable which copy is this object's: none is deleted;
			// they stay for a person to remove, like a legacy copy, and
			// the kcp object's deletion is not held up.
			e.opts.Log.Info("not deleting api-syncagent's copies of a deleted object; remove them by hand if they are no longer wanted",
				logging.KeyPublishedResource, w.pub.Name, "why", refusal)
		case sa != nil:
			return e.deleteUnwatched(ctx, in, w.pub, sa.obj)
		}
		e.legacyLeft(w, remoteOf(in.GetKey()))
		e.mu.Lock()
		e.confirmLocked(k, in.GetVersion())
		e.mu.Unlock()
		return &ferryv1.IntentResult{Key: in.GetKey(), Version: in.GetVersion()}
	}
	// Marked deleting first: the related copies deleted here are not
	// drift to repair (relatedGone), and a copy orphaned leaving the watch
	// confirms the deletion (localGone).
	e.mu.Lock()
	e.ledger.deleteIssued(k, in.GetVersion())
	e.mu.Unlock()
	// An orphaned copy keeps the kcp-origin related copies it uses (a
	// database its credentials Secret), released like those of cleanup:
	// false; otherwise they go before it.
	orphan := in.GetDelete().GetOrphan()
	if err := e.deleteRelatedCopies(ctx, w.pub, in.GetKey().GetUid(), orphan); err != nil {
		e.mu.Lock()
		e.ledger.deleteFailed(k)
		e.mu.Unlock()
		return nack(in, classify(err), true, "%v", err)
	}
	if orphan {
		return e.orphan(ctx, in, w, existing)
	}
	// The UID precondition: exactly the copy checked above, never an object
	// created at its name since the cache saw it.
	policy := metav1.DeletePropagationBackground
	opts := metav1.DeleteOptions{PropagationPolicy: &policy}
	if uid := existing.GetUID(); uid != "" {
		opts.Preconditions = &metav1.Preconditions{UID: &uid}
	}
	err := e.opts.Dynamic.Resource(w.pub.Local).Namespace(existing.GetNamespace()).Delete(ctx, existing.GetName(), opts)
	switch {
	case apierrors.IsNotFound(err), apierrors.IsConflict(err):
		// Gone, or replaced by another object (the UID precondition failed):
		// this object's copy is gone either way.
		e.mu.Lock()
		e.confirmLocked(k, in.GetVersion())
		e.mu.Unlock()
	case err != nil:
		return nack(in, classify(err), true, "cannot delete %s %s: %v", w.pub.LocalKind, nsName(existing.GetNamespace(), existing.GetName()), err)
	}
	// Confirmed when the informer sees the object gone (it may have
	// finalizers of its own).
	return &ferryv1.IntentResult{Key: in.GetKey(), Version: in.GetVersion(), LocalNamespace: existing.GetNamespace(), LocalName: existing.GetName()}
}

// copyOfAnotherAgent returns the local copy of key at the place the naming
// rules give it when its ferry labels name key under another agent name
// (one GET, only for deletes of copies this edge does not watch).
func (e *Engine) copyOfAnotherAgent(ctx context.Context, pub *Published, key *ferryv1.ObjectKey) (*unstructured.Unstructured, error) {
	remote := naming.Remote{ClusterName: key.GetCluster(), Namespace: key.GetNamespace(), Name: key.GetName(), UID: key.GetUid()}
	ns, name, err := pub.Naming.Local(remote, pub.Namespaced)
	if err != nil {
		return nil, nil // no place: nothing can be there
	}
	got, err := e.opts.Dynamic.Resource(pub.Local).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("cannot read %s %s: %w", pub.LocalKind, nsName(ns, name), err)
	}
	if r, ok := naming.RemoteFrom(got.GetLabels(), got.GetAnnotations()); !ok || r.ClusterName != remote.ClusterName ||
		r.Namespace != remote.Namespace || r.Name != remote.Name || got.GetLabels()[naming.LabelAgent] == e.opts.Agent || !sameObject(got, key) ||
		got.GetLabels()[naming.LabelRemoteResource] != pub.resourceLabel() {
		// Someone else's object, this agent's (the watch decides), another
		// kcp resource's copy, or one an earlier version made (which does
		// not record its kcp resource: never deleted, see identity.go).
		return nil, nil
	}
	return got, nil
}

// deleteUnwatched deletes a copy the local watch does not see (another
// agent name's, or api-syncagent's) and confirms once a read finds it gone; until then the
// broker retries.
func (e *Engine) deleteUnwatched(ctx context.Context, in *ferryv1.SyncIntent, pub *Published, u *unstructured.Unstructured) *ferryv1.IntentResult {
	ri := e.opts.Dynamic.Resource(pub.Local).Namespace(u.GetNamespace())
	uid := u.GetUID()
	policy := metav1.DeletePropagationBackground
	if u.GetDeletionTimestamp() == nil {
		err := ri.Delete(ctx, u.GetName(), metav1.DeleteOptions{PropagationPolicy: &policy, Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return nack(in, classify(err), true, "cannot delete %s %s: %v", pub.LocalKind, nsName(u.GetNamespace(), u.GetName()), err)
		}
		e.opts.Log.Info("deleted a local copy the edge does not watch (made under another agent name, or by api-syncagent)",
			"local", nsName(u.GetNamespace(), u.GetName()), "agent", u.GetLabels()[naming.LabelAgent], "syncAgent", u.GetLabels()[saLabelAgent])
	}
	got, err := ri.Get(ctx, u.GetName(), metav1.GetOptions{})
	if apierrors.IsNotFound(err) || (err == nil && got.GetUID() != uid) {
		e.mu.Lock()
		e.confirmLocked(keyFor(pub.Name, in.GetKey()), in.GetVersion())
		e.mu.Unlock()
		return &ferryv1.IntentResult{Key: in.GetKey(), Version: in.GetVersion()}
	}
	return nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_UNAVAILABLE, true, "waiting for %s %s to be deleted in the service cluster",
		pub.LocalKind, nsName(u.GetNamespace(), u.GetName()))
}

// confirmLocked confirms the deletion of k's copy, asked for by the delete
// intent of version.
func (e *Engine) confirmLocked(k ledgerKey, version *ferryv1.ObjectVersion) {
	e.opts.Log.V(4).Info("confirming a deletion", logging.KeyObject, k.String(), "sequence", version.GetSequence())
	e.ledger.confirmed(k)
	delete(e.stateCleared, k)
	e.report(reportKey{kind: reportDeleted, object: k}, &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_DeletionConfirmation{DeletionConfirmation: &ferryv1.DeletionConfirmation{
		Key: k.objectKey(), Version: version,
	}}})
}

// localGone confirms a deletion the broker asked for.
func (e *Engine) localGone(w *localWatch, obj any) {
	u, ok := informerObject(obj)
	if !ok {
		return
	}
	remote, ok := naming.RemoteFrom(u.GetLabels(), u.GetAnnotations())
	if !ok {
		return
	}
	k := keyFor(w.pub.Name, remoteKey(w.pub, remote))
	e.opts.Log.V(4).Info("local copy gone", logging.KeyObject, k.String(), "local", nsName(u.GetNamespace(), u.GetName()))
	e.mu.Lock()
	defer e.mu.Unlock()
	e.forgetRelatedLocked(w, u)
	if version, deleting := e.ledger.gone(k); deleting {
		e.confirmLocked(k, version)
		return
	}
	// Deleted by someone else: checked from the apply queue (after any
	// apply of the object in progress), which asks the broker for it.
	e.queue.Add(queueKey{object: k})
}

// remoteOf is the kcp object key names.
func remoteOf(key *ferryv1.ObjectKey) naming.Remote {
	return naming.Remote{ClusterName: key.GetCluster(), Namespace: key.GetNamespace(), Name: key.GetName(), UID: key.GetUid()}
}

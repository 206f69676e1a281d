package replication

import (
	"context"
	"fmt"

	"github.com/ferry-dev/ferry/pkg/logging"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/protocol"
)

// Drift repair: a copy deleted or changed in fields ferry owns by someone
// else is applied again (from memory, or from the broker for copies an
// earlier process applied).

// record remembers what was applied for k.
func (e *Engine) record(k string, in *ferryv1.SyncIntent, ns, name string, generation int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.applied[k] = appliedCopy{intent: in, namespace: ns, name: name, generation: generation}
	delete(e.resend, k)
}

func (e *Engine) resendAsked(k string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.resend[k]
	return ok
}

// askResendLocked asks the broker for the desired state of a copy that
// drifted (deleted or changed by someone else) but was applied by an
// earlier edge process, so this one cannot repair it from memory.
func (e *Engine) askResendLocked(k string, key *ferryv1.ObjectKey, what string) {
	if _, ok := e.applied[k]; ok {
		return
	}
	if _, ok := e.deleting[k]; ok {
		return
	}
	e.resend[k] = struct{}{}
	e.opts.Log.Info("local copy "+what+" outside ferry; asking the broker for its desired state", logging.KeyObject, k)
	e.report("resend|"+k, &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_ResendRequest{ResendRequest: &ferryv1.ResendRequest{
		Key: key, Reason: what,
	}}})
}

// drifted tells whether a local copy was changed by someone else since this
// engine applied it: its generation moved (a spec change; status writes do
// not move it when the CRD has a status subresource) or its content hash
// annotation is not the applied one. Unknown copies (applied by an earlier
// process) are trusted.
func (e *Engine) drifted(k string, u *unstructured.Unstructured) bool {
	e.mu.Lock()
	rec, ok := e.applied[k]
	e.mu.Unlock()
	if !ok {
		return false
	}
	return u.GetGeneration() != rec.generation ||
		u.GetAnnotations()[naming.AnnotationContentHash] != rec.intent.GetUpsert().GetContentHash()
}

// repair re-applies the recorded desired state of k when its local copy is
// gone or drifted (called from the apply queue, so it never races an intent
// of the same object). Server-side apply resets only the fields ferry owns;
// fields other managers set stay.
func (e *Engine) repair(ctx context.Context, k string) error {
	e.mu.Lock()
	rec, ok := e.applied[k]
	_, deleting := e.deleting[k]
	e.mu.Unlock()
	if !ok || deleting {
		return nil
	}
	pub, w := e.forRemote(rec.intent.GetKey().GetResource())
	if pub == nil || w == nil || e.withdrawn(w) {
		return nil
	}
	key := rec.intent.GetKey()
	existing := e.findLocal(w, naming.Remote{ClusterName: key.GetCluster(), Namespace: key.GetNamespace(), Name: key.GetName(), UID: key.GetUid()})
	if existing != nil && !e.drifted(k, existing) {
		return nil
	}
	what := "deleted"
	if existing != nil {
		what = "changed"
	}
	e.opts.Log.Info("local copy "+what+" outside ferry; applying the desired state again", logging.KeyObject, k, "local", nsName(rec.namespace, rec.name))
	if res := e.apply(ctx, rec.intent); res.GetError() != nil {
		return fmt.Errorf("%s", res.GetError().GetMessage())
	}
	return nil
}

// repairIfDrifted queues the repair of a copy this engine applied whose
// spec someone else changed, or asks the broker for the desired state of
// one an earlier process applied (its spec changed: the generation moved).
func (e *Engine) repairIfDrifted(w *localWatch, old, obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	remote, ok := naming.RemoteFrom(u.GetLabels(), u.GetAnnotations())
	if !ok {
		return
	}
	key := remoteKey(w.pub, remote)
	k := protocol.ObjectKeyString(key)
	if e.drifted(k, u) {
		e.queue.Add(k)
		return
	}
	// A moved generation under unchanged hash and shape annotations is
	// someone else's spec change (this edge's own applies change one).
	if o, ok := old.(*unstructured.Unstructured); ok && o.GetGeneration() != u.GetGeneration() &&
		o.GetAnnotations()[naming.AnnotationContentHash] == u.GetAnnotations()[naming.AnnotationContentHash] &&
		o.GetAnnotations()[naming.AnnotationShape] == u.GetAnnotations()[naming.AnnotationShape] {
		e.mu.Lock()
		e.askResendLocked(k, key, "changed")
		e.mu.Unlock()
	}
}

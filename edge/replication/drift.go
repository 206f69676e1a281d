package replication

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"

	"github.com/ferry-dev/ferry/pkg/logging"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// Drift repair: a copy deleted or changed in fields ferry owns by someone
// else is applied again with the desired state the broker sends on request
// (a ResendRequest). The edge keeps no content of what it applied (its
// ledger holds hashes and places), so a repair costs a round trip to the
// broker, not the memory of every object's content; the upsert that comes
// back is applied even when its hash matches the copy's.

// record remembers what was applied for k (hash and shape, place, and the
// copy's generation right after).
func (e *Engine) record(k ledgerKey, hash, shape, ns, name string, generation int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ledger.applied(k, hash, shape, ns, name, generation)
}

func (e *Engine) resendPending(k ledgerKey) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ledger.resendPending(k)
}

// askResendLocked asks the broker for the desired state of k's copy, which
// drifted (deleted or changed by someone else), unless its delete is in
// flight. The report is the latest per object: asking again while a
// request is unanswered sends one.
func (e *Engine) askResendLocked(k ledgerKey, what string) {
	if !e.ledger.askResend(k) {
		return
	}
	e.opts.Log.Info("local copy "+what+" outside ferry; asking the broker for its desired state", logging.KeyObject, k.String())
	e.report(reportKey{kind: reportResend, object: k}, &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_ResendRequest{ResendRequest: &ferryv1.ResendRequest{
		Key: k.objectKey(), Reason: what,
	}}})
}

// drifted tells whether a local copy was changed by someone else since this
// engine applied it (ledger.drifted). Unknown copies (applied by an earlier
// process) are trusted.
func (e *Engine) drifted(k ledgerKey, u *unstructured.Unstructured) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.driftedLocked(k, u)
}

func (e *Engine) driftedLocked(k ledgerKey, u *unstructured.Unstructured) bool {
	ann := u.GetAnnotations()
	return e.ledger.drifted(k, copyGeneration(u), ann[naming.AnnotationContentHash], ann[naming.AnnotationShape])
}

// checkCopy looks at k's copy again from the apply queue — after any apply
// of the same object, which the queue serializes, so the engine's own
// writes are never taken for drift — and asks the broker for the desired
// state when the copy is gone or drifted. Nothing is asked while the
// object's delete is in flight. While the PublishedResource is withdrawn
// the request still goes: the broker's upsert is refused as retryable until
// it is published again, and then applied.
func (e *Engine) checkCopy(k ledgerKey) {
	pub, w := e.forRemote(k.objectKey().GetResource())
	if pub == nil || w == nil || pub.Name != k.pr {
		return
	}
	existing := e.findLocal(w, remoteOf(k.objectKey()))
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ledger.deleting(k) {
		return
	}
	switch {
	case existing == nil:
		e.askResendLocked(k, "deleted")
	case !sameObject(existing, k.objectKey()):
		// Another kcp object's copy at the name: not this one's to repair.
	case e.driftedLocked(k, existing):
		e.askResendLocked(k, "changed")
	}
}

// repairIfDrifted queues a check of a copy this engine applied whose spec
// someone else changed, or asks the broker for the desired state of one an
// earlier process applied (its spec changed: the generation moved).
func (e *Engine) repairIfDrifted(w *localWatch, old, obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	remote, ok := naming.RemoteFrom(u.GetLabels(), u.GetAnnotations())
	if !ok {
		return
	}
	k := keyFor(w.pub.Name, remoteKey(w.pub, remote))
	if e.drifted(k, u) {
		e.queue.Add(queueKey{object: k})
		return
	}
	// A moved generation under unchanged hash and shape annotations is
	// someone else's spec change (this edge's own applies change one).
	if o, ok := old.(*unstructured.Unstructured); ok && copyGeneration(o) != copyGeneration(u) &&
		o.GetAnnotations()[naming.AnnotationContentHash] == u.GetAnnotations()[naming.AnnotationContentHash] &&
		o.GetAnnotations()[naming.AnnotationShape] == u.GetAnnotations()[naming.AnnotationShape] {
		e.mu.Lock()
		defer e.mu.Unlock()
		if _, _, applied := e.ledger.appliedAt(k); applied {
			// Known copies are judged by drifted above; this is the
			// engine's own apply (a forced one keeps the hash).
			return
		}
		e.askResendLocked(k, "changed")
	}
}

// copyGeneration is what tells a copy's content changed: its generation,
// or, for kinds whose API server keeps none (ConfigMap, Secret, rbac Role:
// generation stays 0), a fingerprint of everything but metadata and status.
// A metadata-only write by someone else then changes nothing; a change of
// data or rules is drift like a spec change of a CRD's object.
func copyGeneration(u *unstructured.Unstructured) int64 {
	if g := u.GetGeneration(); g != 0 {
		return g
	}
	content := make(map[string]any, len(u.Object))
	for k, v := range u.Object {
		if k != "metadata" && k != "status" {
			content[k] = v
		}
	}
	data, err := json.Marshal(content) // sorted keys: a stable fingerprint
	if err != nil {
		return 0
	}
	sum := sha256.Sum256(data)
	// Never 0 (a kind's "no generation"), never negative.
	return int64(binary.BigEndian.Uint64(sum[:8])>>1) | 1
}

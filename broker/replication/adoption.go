package replication

import (
	"context"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/logging"
)

// Finalizer swap after an adoption. When the edge takes over the local
// copy another sync agent made (IntentResult.adopted_from), that agent's
// finalizer on the kcp object would block its deletion for good: the agent
// is gone. The broker, which owns every write in kcp, replaces it with its
// own, in one patch guarded by the object's resourceVersion and UID, so
// the object is never without a finalizer that guards its copy.
//
// Only a finalizer the protocol names is removed (the edge cannot name
// one), and only from an object the broker sent the edge and the edge
// applied (the ack of the broker's own intent, UID included).

// SyncAgentFinalizer is kcp-dev/api-syncagent's finalizer on kcp objects.
const SyncAgentFinalizer = "syncagent.kcp.io/cleanup"

// foreignFinalizer is the finalizer of the agent whose copy was adopted;
// "" for none or an agent this broker does not know.
func foreignFinalizer(from ferryv1.AdoptedFrom) string {
	if from == ferryv1.AdoptedFrom_ADOPTED_FROM_API_SYNCAGENT {
		return SyncAgentFinalizer
	}
	return ""
}

// Adopted records that the edge applied in (the broker's upsert intent)
// over a copy another agent made (from), and queues the swap of that
// agent's finalizer on the kcp object for the broker's.
func (m *Manager) Adopted(pr string, in *ferryv1.SyncIntent, from ferryv1.AdoptedFrom) {
	f := foreignFinalizer(from)
	if f == "" || in.GetUpsert() == nil {
		return
	}
	m.mu.Lock()
	m.adopted[idOf(pr, in.GetKey())] = f
	m.mu.Unlock()
	m.finalizers.Add(item{pr: pr, key: storeKey(in.GetKey())})
}

// adoptedFinalizerLocked is the foreign finalizer to remove from obj (of
// PublishedResource pr): recorded for exactly this object (its UID) and
// still on it; "" otherwise (a record whose finalizer is gone is dropped).
func (m *Manager) adoptedFinalizerLocked(pr string, res Resource, obj *unstructured.Unstructured) (objectID, string) {
	id := idOf(pr, objectKey(obj, res.GVR))
	f, ok := m.adopted[id]
	if !ok {
		return id, ""
	}
	if !slices.Contains(obj.GetFinalizers(), f) {
		delete(m.adopted, id)
		return id, ""
	}
	return id, f
}

// finalizersWanted is the finalizer list s's object is to carry: the
// broker's added when it wants one, the adopted agent's (foreign) removed
// unless that would leave the object unguarded while it is to be guarded
// (withdrawn: the broker's finalizer waits, and so does the swap; the next
// ack of the edge queues it again). It tells whether that differs from the
// object's list.
func (m *Manager) finalizersWanted(s objectState, foreign string) ([]string, bool) {
	list := slices.Clone(s.obj.GetFinalizers())
	add := !s.hasFinalizer && !s.withdrawn && s.wantsFinalizer()
	changed := false
	if add {
		list = append(list, m.finalizer)
		changed = true
	}
	if foreign != "" && (s.hasFinalizer || add || !s.wantsFinalizer()) {
		list = slices.DeleteFunc(list, func(f string) bool { return f == foreign })
		changed = true
	}
	return list, changed
}

// writeFinalizers writes s's finalizers (finalizersWanted), and forgets the
// adoption once its agent's finalizer is gone.
func (m *Manager) writeFinalizers(ctx context.Context, s objectState) error {
	m.mu.Lock()
	id, foreign := m.adoptedFinalizerLocked(s.it.pr, s.res, s.obj)
	m.mu.Unlock()
	list, changed := m.finalizersWanted(s, foreign)
	if !changed {
		return nil
	}
	ri, err := m.resourceClient(objectKey(s.obj, s.res.GVR))
	if err != nil {
		return err
	}
	if err := patchFinalizers(ctx, ri, s.obj, list); err != nil {
		return err
	}
	if foreign != "" && !slices.Contains(list, foreign) {
		m.mu.Lock()
		delete(m.adopted, id)
		m.mu.Unlock()
		m.opts.Log.Info("replaced another sync agent's finalizer on an object whose copy the edge adopted",
			logging.KeyObject, KeyString(objectKey(s.obj, s.res.GVR)), "removed", foreign, "guardedBy", m.finalizer)
	}
	return nil
}

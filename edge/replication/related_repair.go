package replication

import (
	"bytes"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
	"sigs.k8s.io/structured-merge-diff/v6/typed"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/logging"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/objects"
)

// Repair of kcp-origin related copies. The edge keeps no content of related
// objects (a Secret's data stays in the informer cache it needs anyway,
// never in a second copy): a copy deleted or edited by someone else is
// asked for again from the broker, which sends it again although it did not
// change in kcp.
//
// An edit is noticed without remembering what was written: each copy
// carries the hash of the content ferry applied (ferry.dev/content-hash,
// objects.RelatedHash), and the cache computes, from the copy's
// managedFields, the same hash over exactly the fields ferry's field manager
// still owns with their current values (observedHashKey). Someone who
// changes or removes such a field takes it over (or it is gone), so the
// hashes differ; fields other managers added are not ferry's and change
// nothing, so they stay — server-side apply's semantics, which the repair
// (a forced apply of the same content) keeps.

// observedHashKey is an annotation that exists only in the edge's cache of
// related objects, never in the service cluster: the hash of the fields
// ferry's field manager owns on one of its copies, as the copy holds them
// (relatedTransform). Like every ferry.dev/ key it never crosses to kcp
// (objects.RelatedContent).
const observedHashKey = "ferry.dev/observed-content-hash"

// relatedTransform prepares related objects for the cache: managedFields
// are dropped (never read, and large), after the hash of what ferry owns
// was taken from them for this agent's own copies.
func (e *Engine) relatedTransform(obj any) (any, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return obj, nil
	}
	ann := u.GetAnnotations()
	if l := u.GetLabels(); l[naming.LabelRelatedTo] != "" && l[naming.LabelAgent] == e.opts.Agent && ann[naming.AnnotationContentHash] != "" {
		ann[observedHashKey] = ownedHash(u, FieldManager)
		u.SetAnnotations(ann)
	}
	u.SetManagedFields(nil)
	return u, nil
}

// ownedHash is objects.RelatedHash of the fields manager applied on u, with
// their current values (none when it owns nothing any more).
func ownedHash(u *unstructured.Unstructured, manager string) string {
	owned := &unstructured.Unstructured{Object: map[string]any{}}
	for _, mf := range u.GetManagedFields() {
		if mf.Manager != manager || mf.Operation != metav1.ManagedFieldsOperationApply || mf.Subresource != "" || mf.FieldsV1 == nil {
			continue
		}
		set := &fieldpath.Set{}
		if err := set.FromJSON(bytes.NewReader(mf.FieldsV1.Raw)); err != nil {
			break // unreadable: counts as owning nothing, so the copy is written again
		}
		// Deduced types: maps are granular (a Secret's data keys), lists
		// atomic. A list the API server merges by key is not found in the
		// deduced shape: such a copy counts as changed after each write,
		// and its repair is a no-op apply (no write, so no new event).
		tv, err := typed.DeducedParseableType.FromUnstructured(u.Object)
		if err != nil {
			break
		}
		if m, ok := tv.ExtractItems(set.Leaves()).AsValue().Unstructured().(map[string]any); ok {
			owned.Object = m
		}
		break
	}
	return objects.RelatedHash(owned)
}

// relatedDrifted tells whether one of ferry's related copies in the cache
// no longer holds, in the fields ferry owns, the content ferry applied.
// Copies written before content hashes were recorded are trusted.
func relatedDrifted(u *unstructured.Unstructured) bool {
	ann := u.GetAnnotations()
	observed, ok := ann[observedHashKey]
	return ok && ann[naming.AnnotationContentHash] != "" && observed != ann[naming.AnnotationContentHash]
}

// relatedUpdated handles a related object that was added or changed in the
// service cluster: references to it are reported again (service origin),
// and when it is this edge's copy of a kcp-origin related object whose
// fields were changed by someone else, the edge asks the broker for it
// again.
func (e *Engine) relatedUpdated(rw *relatedWatch, obj any) {
	e.relatedChanged(rw, obj)
	u, ok := informerObject(obj)
	if !ok || !relatedDrifted(u) {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.askRelatedAgainLocked(rw, u, "changed")
}

// relatedGone handles a related object that left the service cluster:
// references to it are reported again (service origin), and when it was
// this edge's copy of a kcp-origin related object whose primary copy stays,
// someone else deleted it: the edge asks the broker for it again.
func (e *Engine) relatedGone(rw *relatedWatch, obj any) {
	e.relatedChanged(rw, obj)
	u, ok := informerObject(obj)
	if !ok {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.askRelatedAgainLocked(rw, u, "deleted")
}

// askRelatedAgainLocked asks the broker to send again the kcp object u (one
// of this agent's related copies) is a copy of, for every primary copy
// that still stands and names u by its UID and entry (what: why, "deleted"
// or "changed").
func (e *Engine) askRelatedAgainLocked(rw *relatedWatch, u *unstructured.Unstructured, what string) {
	l := u.GetLabels()
	uid, id := l[naming.LabelRelatedTo], l[naming.LabelRelatedIdentifier]
	if uid == "" || id == "" || l[naming.LabelAgent] != e.opts.Agent {
		return
	}
	for _, w := range e.watches {
		ref := w.pub.related(id)
		if w.withdrawn || ref == nil || ref.Origin != ferryv1alpha1.OriginKCP || ref.Local != rw.gvr {
			continue
		}
		primaries, err := w.store.ByIndex(remoteUIDIndex, uid)
		if err != nil {
			continue
		}
		for _, p := range primaries {
			primary, ok := informerObject(p)
			if !ok || primary.GetDeletionTimestamp() != nil {
				continue
			}
			remote, ok := naming.RemoteFrom(primary.GetLabels(), primary.GetAnnotations())
			if !ok {
				continue
			}
			key := remoteKey(w.pub, remote)
			k := keyFor(w.pub.Name, key)
			if e.ledger.deleting(k) {
				continue
			}
			e.opts.Log.Info("related copy "+what+" outside ferry; asking the broker for it again", logging.KeyObject, k.String(),
				"related", id, "local", nsName(u.GetNamespace(), u.GetName()))
			e.report(reportKey{kind: reportResendRelated, object: k, identifier: id}, &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_ResendRequest{ResendRequest: &ferryv1.ResendRequest{
				Key: key, Reason: what, RelatedTo: &ferryv1.RelatedTo{Primary: key, Identifier: id},
			}}})
		}
	}
}

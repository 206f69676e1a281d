package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/ferry-dev/ferry/pkg/logging"

	"github.com/kcp-dev/logicalcluster/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// What ends an object's sync, and which edge claims the broker checks: an
// object leaving the filters, a deletion the edge confirms, a withdrawn
// PublishedResource. Nothing is released that the broker did not ask for.

// ReleaseAll stops syncing pr and releases the broker's finalizer on every
// object of gvr, so that kcp objects can be deleted without ferry: the
// PublishedResource was deleted or its synchronization disabled. The objects
// are listed live through the virtual workspace, at every endpoint (after a
// restart the broker may not watch gvr any more), and each is released at
// the endpoint that listed it. With deleteRelated, the service-origin
// related copies of those objects are deleted first (when pr's related
// entries are known). It is idempotent: a failure (an endpoint that cannot
// be reached included) is retried as a whole.
func (m *Manager) ReleaseAll(ctx context.Context, pr string, gvr schema.GroupVersionResource, deleteRelated bool) (released int, err error) {
	m.mu.Lock()
	res, known := m.desired[pr]
	m.mu.Unlock()
	urls, urlsKnown := m.endpoints.current()
	// No new finalizer from here on.
	m.Remove(pr)
	if !urlsKnown {
		return 0, errors.New("the APIExport's virtual workspace is not known yet")
	}
	// No endpoint: no workspace binds the export, no object carries the
	// finalizer.
	for _, url := range urls {
		n, err := m.releaseAllAt(ctx, url, gvr, res, deleteRelated && known)
		released += n
		if err != nil {
			return released, fmt.Errorf("at virtual workspace endpoint %s: %w", url, err)
		}
	}
	m.opts.Log.Info("released every object of a withdrawn PublishedResource", logging.KeyPublishedResource, pr, "resource", gvr.String(),
		"released", released, "relatedCopiesDeleted", deleteRelated && known)
	return released, nil
}

// releaseAllAt is ReleaseAll at one endpoint: the objects it lists are
// released there.
func (m *Manager) releaseAllAt(ctx context.Context, url string, gvr schema.GroupVersionResource, res Resource, deleteRelated bool) (released int, err error) {
	clients := func(cluster string) (dynamic.Interface, error) { return m.endpoints.clientAt(url, cluster) }
	objs, err := ListFinalized(ctx, clients, gvr, m.finalizer)
	if err != nil {
		return 0, err
	}
	if deleteRelated {
		dyn, err := clients("*")
		if err != nil {
			return 0, err
		}
		if err := m.deleteAllRelatedCopies(ctx, dyn, res, objs); err != nil {
			return 0, err
		}
	}
	for i := range objs {
		o := &objs[i]
		if err := RemoveFinalizer(ctx, clients, "", gvr, o, m.finalizer); err != nil {
			return released, fmt.Errorf("cannot release %s: %w", KeyString(objectKey(o, gvr)), err)
		}
		m.opts.Outbox.Forget(objectKey(o, gvr), nil)
		released++
	}
	return released, nil
}

// deleteAllRelatedCopies deletes the service-origin related copies in kcp
// of objs: one list per related kind (by ferry's labels), not one per object.
func (m *Manager) deleteAllRelatedCopies(ctx context.Context, dyn dynamic.Interface, res Resource, objs []unstructured.Unstructured) error {
	uids := make(map[string]bool, len(objs))
	for i := range objs {
		uids[string(objs[i].GetUID())] = true
	}
	for _, ref := range res.Related {
		if ref.Origin != ferryv1alpha1.OriginService {
			continue
		}
		list, err := dyn.Resource(ref.Resource).List(ctx, metav1.ListOptions{
			LabelSelector: naming.LabelRelatedTo + "," + naming.LabelRelatedIdentifier + "=" + ref.Identifier,
		})
		if err != nil {
			return fmt.Errorf("cannot list related %s in kcp: %w", ref.Resource, err)
		}
		for _, c := range list.Items {
			if !uids[c.GetLabels()[naming.LabelRelatedTo]] {
				continue
			}
			uid := c.GetUID()
			err := dyn.Resource(ref.Resource).Namespace(c.GetNamespace()).Delete(ctx, c.GetName(), metav1.DeleteOptions{
				Preconditions: &metav1.Preconditions{UID: &uid},
			})
			if err != nil && !objectGone(err, c.GetName()) {
				return fmt.Errorf("cannot delete related %s %s/%s in kcp: %w", ref.Resource, c.GetNamespace(), c.GetName(), notServedIsTransient(err))
			}
		}
	}
	return nil
}

// scope is whether an object is one the PublishedResource syncs.
type scope int

const (
	// inScope: the object passes spec.filter.
	inScope scope = iota
	// outOfScope: the object does not pass spec.filter (any more); a copy
	// the edge holds is deleted and the finalizer released.
	outOfScope
	// scopeUnknown: its namespace is not in the cache yet; nothing is done
	// until the namespace watch requeues the object.
	scopeUnknown
)

// scopeOf evaluates res's filters on obj.
func (m *Manager) scopeOf(res Resource, obj *unstructured.Unstructured) scope {
	if res.Selector != nil && !res.Selector.Matches(labels.Set(obj.GetLabels())) {
		return outOfScope
	}
	if res.NamespaceName != "" && obj.GetNamespace() != "" && obj.GetNamespace() != res.NamespaceName {
		return outOfScope
	}
	if res.NamespaceSelector == nil || obj.GetNamespace() == "" {
		return inScope
	}
	m.mu.Lock()
	store := m.namespaces
	m.mu.Unlock()
	if store == nil {
		return scopeUnknown
	}
	raw, ok, err := store.GetByKey(namespaceName(logicalcluster.From(obj).String(), obj.GetNamespace()).storeKey())
	if err != nil || !ok {
		return scopeUnknown
	}
	ns, ok := raw.(*unstructured.Unstructured)
	if !ok || !res.NamespaceSelector.Matches(labels.Set(ns.GetLabels())) {
		return outOfScope
	}
	return inScope
}

// namespaceCached tells whether the namespaces watch holds a workspace's
// namespace.
func (m *Manager) namespaceCached(cluster, name string) bool {
	m.mu.Lock()
	store := m.namespaces
	m.mu.Unlock()
	if store == nil {
		return false
	}
	_, ok, err := store.GetByKey(namespaceName(cluster, name).storeKey())
	return err == nil && ok
}

// holds tells whether the broker syncs obj (of pr) for this edge: it has
// not left the filters, and it carries the edge's finalizer or the ledger
// records that the edge may hold its copy (sent before the finalizer
// landed). Reports about any other object are refused: the edge cannot
// write into objects it was not sent.
func (m *Manager) holds(pr string, res Resource, obj *unstructured.Unstructured) bool {
	if m.scopeOf(res, obj) == outOfScope {
		return false
	}
	return slices.Contains(obj.GetFinalizers(), m.finalizer) || m.mayHold(idOf(pr, objectKey(obj, res.GVR)))
}

// mayHold tells whether the ledger records that the edge may hold a copy
// of exactly id (UID included).
func (m *Manager) mayHold(id objectID) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.ledger.mayHold(id)
}

// asksDelete tells whether the broker asks the edge to delete the copy of
// obj (identity id, of resource res): the decision steps' test
// (objectState.asksDelete), for the edge's deletion confirmations.
func (m *Manager) asksDelete(res Resource, obj *unstructured.Unstructured, id objectID) bool {
	s := objectState{res: res}
	m.setObject(&s, obj)
	return s.asksDelete(func() bool { return m.mayHold(id) })
}

// Release finishes a deletion the edge confirmed: the primary's
// service-origin related copies in kcp are deleted, then its finalizer is
// released. The confirmation is checked first against the broker's own view:
// it is accepted only while the broker asks for the copy's deletion (the
// object is being deleted in kcp or has left the filters); an object that is
// gone or was replaced needs nothing.
func (m *Manager) Release(ctx context.Context, pr string, key *ferryv1.ObjectKey) error {
	if err := m.checkKey(pr, key); err != nil {
		return err
	}
	obj, err := m.cached(pr, key)
	if err != nil {
		return err
	}
	if obj != nil {
		m.mu.Lock()
		res := m.desired[pr]
		m.mu.Unlock()
		if !m.asksDelete(res, obj, idOf(pr, key)) {
			m.refused.Add(1)
			return fmt.Errorf("%w: %s", ErrNotDeleting, KeyString(key))
		}
	}
	// The related copies in kcp are found by the primary's UID: only when
	// no cached object holds that UID (the edge names a UID, and a name
	// that is not its object's, and the copies are a live object's).
	if obj != nil || !m.uidCached(pr, key.GetUid()) {
		if err := m.deleteRelatedCopies(ctx, pr, key); err != nil {
			return err
		}
	}
	if err := m.releaseFinalizer(ctx, pr, key, obj); err != nil {
		return err
	}
	it := item{pr: pr, key: storeKey(key)}
	m.mu.Lock()
	// Only this object's record (UID included): not a newer object's of
	// the same name.
	m.ledger.confirmed(idOf(pr, key))
	// A waiting inventory (see Applied) no longer lists this copy.
	delete(m.unlisted[pr], idOf(pr, key))
	w, running := m.running[pr]
	m.mu.Unlock()
	m.opts.Outbox.Forget(key, nil)
	if running {
		// A newer object of the same name waited for this copy to go.
		if raw, ok, err := w.store.GetByKey(it.key); err == nil && ok && string(raw.(*unstructured.Unstructured).GetUID()) != key.GetUid() {
			m.queue.Add(it)
		}
	}
	return nil
}

// checkKey refuses a key that cannot name an object pr syncs: every part
// must be set, and the resource must be pr's (the edge cannot make the
// broker write into another resource of the export).
func (m *Manager) checkKey(pr string, key *ferryv1.ObjectKey) error {
	m.mu.Lock()
	res, ok := m.desired[pr]
	m.mu.Unlock()
	r := key.GetResource()
	switch {
	case !ok:
		return fmt.Errorf("%w: PublishedResource %q is not synced", ErrRefused, pr)
	case key.GetCluster() == "" || key.GetName() == "" || key.GetUid() == "":
		m.refused.Add(1)
		return fmt.Errorf("%w: the object key needs cluster, name and uid", ErrRefused)
	case r.GetGroup() != res.GVR.Group || r.GetResource() != res.GVR.Resource:
		m.refused.Add(1)
		return fmt.Errorf("%w: %s is not the resource of PublishedResource %q (%s)", ErrRefused, KeyString(key), pr, res.GVR.GroupResource())
	}
	return nil
}

// ErrNotDeleting refuses a deletion confirmation for an object the broker
// did not ask to delete.
var ErrNotDeleting = errors.New("refused: the broker did not ask to delete this object's copy (it is not being deleted in kcp and is in the PublishedResource's scope)")

// releaseFinalizer removes the broker's finalizer from obj, the kcp object
// behind key, once the edge confirmed its local copy is gone (the caller
// checked that the broker asked for that). obj comes from the cache (no
// extra read in kcp); the patch is guarded by its resourceVersion, so a
// stale cache only costs a retry. A missing object or finalizer is fine
// (already released).
func (m *Manager) releaseFinalizer(ctx context.Context, pr string, key *ferryv1.ObjectKey, obj *unstructured.Unstructured) error {
	if obj == nil {
		return nil
	}
	r := key.GetResource()
	gvr := schema.GroupVersionResource{Group: r.GetGroup(), Version: r.GetVersion(), Resource: r.GetResource()}
	// The finalizer of an agent whose copy the edge adopted goes too (its
	// swap may not have landed before the deletion): the copy it guarded
	// is gone.
	m.mu.Lock()
	id, foreign := m.adoptedFinalizerLocked(pr, Resource{GVR: gvr}, obj)
	res := m.desired[pr]
	m.mu.Unlock()
	if foreign == "" && obj.GetDeletionTimestamp() != nil && res.AdoptFinalizer != "" && slices.Contains(obj.GetFinalizers(), res.AdoptFinalizer) {
		// Deleted before its copy was adopted: the edge deleted the
		// adopted agent's copy (asksDelete).
		foreign = res.AdoptFinalizer
	}
	if foreign == "" {
		return RemoveFinalizer(ctx, m.client, key.GetCluster(), gvr, obj, m.finalizer)
	}
	c, err := m.client(key.GetCluster())
	if err != nil {
		return err
	}
	list := slices.DeleteFunc(slices.Clone(obj.GetFinalizers()), func(f string) bool { return f == m.finalizer || f == foreign })
	if err := patchFinalizers(ctx, c.Resource(gvr).Namespace(obj.GetNamespace()), obj, list); err != nil {
		return err
	}
	m.mu.Lock()
	delete(m.adopted, id)
	m.mu.Unlock()
	return nil
}

// uidCached tells whether pr's cache holds an object with uid (under any
// name).
func (m *Manager) uidCached(pr, uid string) bool {
	m.mu.Lock()
	w, ok := m.running[pr]
	m.mu.Unlock()
	if !ok || uid == "" {
		return false
	}
	objs, err := w.store.ByIndex(uidIndex, uid)
	return err == nil && len(objs) > 0
}

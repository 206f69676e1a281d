package replication

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// Label-selected related objects (object.selector, origin service) on the
// edge. Such a reference names no object: it points at its namespace
// (gvrKey with an empty name) in relRefs, so that any change of the kind
// in that namespace — from the related informer the edge runs anyway —
// re-evaluates it, and a Secret labelled later appears by itself, without
// polling. The objects it found are its members (relMembers), so that an
// object found for two primaries is noticed: like a referenced object, it
// is copied for none of them while shared.

// memberKey is one object a label-selected reference found (its gvrKey).
type memberKey struct {
	rk  relKey
	key string
}

// reportSelectedLocked sends what the label-selected ref finds for
// primary when it differs from the last report.
func (e *Engine) reportSelectedLocked(primary *unstructured.Unstructured, ref *Related, rw *relatedWatch, rk relKey, remote naming.Remote, report *ferryv1.RelatedObjectReport) {
	env := serviceEnv(remote)
	ns, err := ref.LocateNamespace(primary.Object, env)
	if err == nil {
		_, err = e.mayRelateLocked(remote.ClusterName, primary.GetNamespace(), ns, ref)
	}
	var sel labels.Selector
	if err == nil {
		sel, err = ref.Selector(primary.Object, env)
	}
	at := ""
	var members []string
	switch {
	case reportLocateError(report, primary, err):
		if errors.Is(err, errForbidden) {
			// Never read: the consumer wrote what the namespace is located by.
			report.LocalNamespace = ns
		}
	default:
		if !rw.readyIn(ns) {
			e.waitForSpaceLocked(rw, ns, rk)
			return
		}
		at = gvrKey(ref.Local, ns, "")
		report.LocalNamespace = ns
		set, found, err := selectRelated(rw, ref, primary, ns, sel, remote)
		if err != nil {
			report.State = &ferryv1.RelatedObjectReport_Unresolved{Unresolved: &ferryv1.RelatedObjectUnresolved{
				Message: fmt.Sprintf("on the service cluster's copy %s: %v", nsName(primary.GetNamespace(), primary.GetName()), err),
			}}
		} else {
			report.State = &ferryv1.RelatedObjectReport_Objects{Objects: set}
			members = found
		}
	}
	e.relRefs.Point(rk, at)
	changed := e.setMembersLocked(rk, members)
	for _, k := range members {
		if n := e.relRefs.Count(k) + e.relMembers.Count(k); n > 1 {
			// Never copied while shared: one workspace would receive what
			// was made for another.
			report.State = &ferryv1.RelatedObjectReport_Error{Error: &ferryv1.ApplyError{
				Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT,
				Message: fmt.Sprintf("related %q: a %s the selector finds in namespace %s of the service cluster is also related to %d other objects synced by ferry; "+
					"none is copied until each object is found for one primary only (select by a label unique per primary, e.g. one holding its local name)",
					ref.Identifier, ref.ServiceKind, ns, n-1),
			}}
			break
		}
	}
	for _, k := range changed {
		// Whether the others finding (or naming) these objects conflict
		// has changed.
		e.rereportLocked(k, rk)
	}
	e.sendRelatedLocked(rk, report)
}

// setMembersLocked records that rk now finds the objects keys (nil: none)
// and returns the keys it found before or finds now but not both.
func (e *Engine) setMembersLocked(rk relKey, keys []string) []string {
	old := e.relFound[rk]
	var changed []string
	for _, k := range old {
		if !slices.Contains(keys, k) {
			e.relMembers.Point(memberKey{rk: rk, key: k}, "")
			changed = append(changed, k)
		}
	}
	for _, k := range keys {
		if !slices.Contains(old, k) {
			e.relMembers.Point(memberKey{rk: rk, key: k}, k)
			changed = append(changed, k)
		}
	}
	if len(keys) == 0 {
		delete(e.relFound, rk)
	} else {
		e.relFound[rk] = keys
	}
	return changed
}

// selectRelated lists the objects in ns of rw that sel and the entry's
// watch.labelSelector match — never ferry's own copies of kcp-origin
// related objects — with their kcp names, and their member keys.
func selectRelated(rw *relatedWatch, ref *Related, primary *unstructured.Unstructured, ns string, sel labels.Selector, remote naming.Remote) (*ferryv1.RelatedObjectSet, []string, error) {
	s := rw.space(ns)
	set := &ferryv1.RelatedObjectSet{}
	var keys []string
	byName := map[string]string{}
	for _, raw := range s.store.List() {
		u, ok := raw.(*unstructured.Unstructured)
		if !ok || u.GetNamespace() != ns || u.GetLabels()[naming.LabelRelatedTo] != "" || !sel.Matches(labels.Set(u.GetLabels())) || !ref.Watches(u.GetLabels()) {
			continue
		}
		content := relatedPayload(ref, u)
		name, err := ref.Rewrite(content.Object, primary.Object, u.GetName(), serviceEnv(remote))
		if err != nil {
			return nil, nil, err
		}
		if other, dup := byName[name]; dup {
			return nil, nil, fmt.Errorf("related %q: object.selector.rewrite gives %s and %s the same name %q in kcp; it must keep names apart", ref.Identifier, other, u.GetName(), name)
		}
		byName[name] = u.GetName()
		data, err := json.Marshal(content.Object)
		if err != nil {
			return nil, nil, fmt.Errorf("cannot encode %s %s: %w", ref.ServiceKind, nsName(ns, u.GetName()), err)
		}
		set.Entries = append(set.Entries, &ferryv1.RelatedObjectSetEntry{LocalName: u.GetName(), Name: name, Object: data})
		keys = append(keys, gvrKey(ref.Local, ns, u.GetName()))
	}
	slices.SortFunc(set.Entries, func(a, b *ferryv1.RelatedObjectSetEntry) int {
		switch {
		case a.LocalName < b.LocalName:
			return -1
		case a.LocalName > b.LocalName:
			return 1
		}
		return 0
	})
	slices.Sort(keys)
	return set, keys, nil
}

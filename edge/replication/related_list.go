package replication

import (
	"encoding/json"
	"errors"
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// List references (a name path with "#", origin service) on the edge. The
// edge evaluates the list on the local primary and reports one set entry
// per item, in the list's order — the object, or that it does not exist —
// and the broker matches them by position with the list it evaluates on
// the kcp primary. Each named object is a member of the reference
// (relMembers, as for a label selector), whether it exists or not: its
// creation, change or deletion re-reports the reference, and an object
// that another primary names too is copied for none of them.

// reportListedLocked sends what the list reference ref names for primary
// when it differs from the last report.
func (e *Engine) reportListedLocked(primary *unstructured.Unstructured, ref *Related, rw *relatedWatch, rk relKey, remote naming.Remote, report *ferryv1.RelatedObjectReport) {
	ns, names, err := ref.LocateList(primary.Object, serviceEnv(remote))
	if err == nil {
		_, err = e.mayRelateLocked(remote.ClusterName, primary.GetNamespace(), ns, ref)
	}
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
		report.LocalNamespace = ns
		set := &ferryv1.RelatedObjectSet{Entries: make([]*ferryv1.RelatedObjectSetEntry, 0, len(names))}
		for _, name := range names {
			entry := &ferryv1.RelatedObjectSetEntry{LocalName: name}
			if u, exists := rw.get(ns, name); exists {
				data, err := json.Marshal(relatedPayload(ref, u).Object)
				if err != nil {
					return
				}
				entry.Object = data
			} else {
				entry.Gone = true
			}
			set.Entries = append(set.Entries, entry)
			members = append(members, gvrKey(ref.Local, ns, name))
		}
		report.State = &ferryv1.RelatedObjectReport_Objects{Objects: set}
	}
	// The reference points at no single object: its members stand for it.
	e.relRefs.Point(rk, "")
	changed := e.setMembersLocked(rk, members)
	for i, k := range members {
		if n := e.relRefs.Count(k) + e.relMembers.Count(k); n > 1 {
			// Never copied while shared: one workspace would receive what
			// was made for another.
			report.State = &ferryv1.RelatedObjectReport_Error{Error: &ferryv1.ApplyError{
				Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT,
				Message: fmt.Sprintf("related %q: %s %s in the service cluster, named by this object's list, is also related to %d other objects synced by ferry; "+
					"none is copied until each object is named for one primary only (give each its own name, e.g. with a spec mutation that uses the local name)",
					ref.Identifier, ref.Kind.Kind, nsName(ns, names[i]), n-1),
			}}
			break
		}
	}
	for _, k := range changed {
		// Whether the others naming these objects conflict has changed.
		e.rereportLocked(k, rk)
	}
	e.sendRelatedLocked(rk, report)
}

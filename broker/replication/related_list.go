package replication

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/related"
)

// writeRelatedList writes the objects a list reference (a name path with
// "#", origin service) names for primary. The edge reports one entry per
// item of the list on the local primary, in its order; the broker
// evaluates the same list on the kcp primary and matches them by
// position: item i's object is copied to the i-th kcp name. Copies of
// items whose object is gone, and of names no longer listed, go. Lists of
// different lengths cannot be matched: nothing is written or deleted
// until they agree (the primary's edit may not have reached the service
// cluster yet), and the kcp primary gets a Warning Event saying so.
func (m *Manager) writeRelatedList(ctx context.Context, it item, pk *ferryv1.ObjectKey, primary *unstructured.Unstructured, ref *related.Reference, copies []*unstructured.Unstructured, set *ferryv1.RelatedObjectSet) error {
	env, err := m.relatedEnv(ctx, ref, pk.GetCluster())
	if err != nil {
		return err
	}
	ns, names, err := ref.LocateList(primary.Object, env)
	if err != nil {
		m.note(ctx, it, pk, "Warning", "RelatedUnresolved", err.Error())
		return nil
	}
	entries := set.GetEntries()
	if len(entries) != len(names) {
		m.note(ctx, it, pk, "Warning", "RelatedUnresolved", fmt.Sprintf(
			"related %q: the list names %d objects on this object but %d on its copy in the service cluster; its items are matched by position, "+
				"so no copy is written or deleted until both lists have the same length", ref.Identifier, len(names), len(entries)))
		return nil
	}
	type write struct {
		name     string
		content  map[string]any
		existing *unstructured.Unstructured
	}
	var writes []write
	keep := map[string]bool{}
	for i, e := range entries {
		if e.GetGone() {
			continue // its copy goes (below), as for a reference to one object
		}
		var content map[string]any
		if err := json.Unmarshal(e.GetObject(), &content); err != nil {
			return fmt.Errorf("%w: related object %s is not JSON: %v", ErrRefused, e.GetLocalName(), err)
		}
		keep[names[i]] = true
		writes = append(writes, write{name: names[i], content: content, existing: findCopy(copies, ns, names[i])})
	}
	stale := slices.DeleteFunc(slices.Clone(copies), func(c *unstructured.Unstructured) bool {
		return c.GetNamespace() == ns && keep[c.GetName()]
	})
	if err := m.deleteCopies(ctx, ref.Resource, stale, nil); err != nil {
		return err
	}
	for _, w := range writes {
		if err := m.writeCopy(ctx, it, pk, primary, ref, ns, w.name, w.content, w.existing); err != nil {
			return err
		}
	}
	if len(writes) == 0 && len(entries) > 0 {
		// (A partial list is not noted: each written copy clears the note.)
		m.note(ctx, it, pk, "Normal", "RelatedMissing", fmt.Sprintf("related %q: waiting for the %d listed %s in the service cluster",
			ref.Identifier, len(entries), ref.Kind.Kind))
	}
	return nil
}

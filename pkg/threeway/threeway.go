// Package threeway merges a desired state into a live object the way
// kubectl's last-applied annotation does: a field the live object changed
// locally keeps its local value until the desired side changes that field.
//
// It is pure: it reads three JSON-like objects (map[string]any) and returns
// a new one; it never modifies its arguments.
package threeway

import (
	"reflect"
	"sort"

	"github.com/ferry-dev/ferry/pkg/fieldpath"
	"github.com/ferry-dev/ferry/pkg/objects"
)

// Merge decides, field by field, what the writer of desired should apply to
// current, given last, the desired state it applied before (nil when none
// is known):
//
//   - a field desired changed, added or removed since last: desired's value
//     (or its absence) wins;
//   - a field desired did not change: current's value is kept, including
//     its absence (removed locally);
//   - fields outside desired and last (set by someone else) are not in the
//     result: the writer does not claim them.
//
// Maps are merged key by key; lists and scalars are single values (a list
// changed on both sides is desired's). With no last state every field of
// desired counts as changed: desired wins everywhere.
//
// removed lists the fields desired removed since last that current still
// holds: absent from the result, they are deleted only if the writer owns
// them alone, so the caller removes them explicitly. Sorted, for stable
// output.
func Merge(last, desired, current map[string]any) (merged map[string]any, removed []fieldpath.Path) {
	merged = map[string]any{}
	merge(nil, last, desired, current, merged, &removed)
	sort.Slice(removed, func(i, j int) bool { return removed[i].String() < removed[j].String() })
	return merged, removed
}

func merge(at fieldpath.Path, last, desired, current, out map[string]any, removed *[]fieldpath.Path) {
	for k, d := range desired {
		l, inLast := last[k]
		c, inCurrent := current[k]
		dm, dIsMap := d.(map[string]any)
		lm, lIsMap := l.(map[string]any)
		cm, cIsMap := c.(map[string]any)
		switch {
		case inLast && dIsMap && lIsMap && (cIsMap || !inCurrent):
			// Merged key by key, so keys others set inside the map are not
			// claimed; a map removed locally counts as an empty one (only
			// the keys desired changed come back).
			sub := map[string]any{}
			merge(append(at[:len(at):len(at)], k), lm, dm, cm, sub, removed)
			if len(sub) > 0 || inCurrent {
				out[k] = sub
			}
		case inLast && reflect.DeepEqual(l, d):
			// Not changed by the desired side: the live value stands,
			// including its absence.
			if inCurrent {
				out[k] = objects.DeepCopyValue(c)
			}
		default:
			out[k] = objects.DeepCopyValue(d)
		}
	}
	for k := range last {
		if _, inDesired := desired[k]; inDesired {
			continue
		}
		// Removed by the desired side.
		if _, inCurrent := current[k]; inCurrent {
			*removed = append(*removed, append(at[:len(at):len(at)], k))
		}
	}
}

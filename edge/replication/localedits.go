package replication

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	utiljson "k8s.io/apimachinery/pkg/util/json"

	"github.com/ferry-dev/ferry/pkg/fieldpath"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/threeway"
)

// Local edits kept (spec.localEdits Keep): a field of a copy edited in the
// service cluster keeps its local value until kcp changes that field.
//
// Where the last state applied from kcp is kept: in an annotation on the
// copy (naming.AnnotationLastApplied), as kubectl apply and the seeds'
// agent do, not in the edge's ledger. The ledger lives in memory and keeps
// no content on purpose (ledger.go); a base lost with an edge restart would
// turn every kept edit into a kcp change at the next apply and undo it.
// The annotation survives restarts, moves with the copy (a backup and
// restore keeps it), goes away with it, and is written in the same apply as
// the content it describes, so the two can never disagree. The cost is the
// copy's size; a state too large for an annotation is not recorded, and
// that copy is repaired as under Repair.
//
// A local user can edit the annotation too; that only changes which of the
// copy's own fields count as edited, never where the edge writes.

// maxLastApplied bounds the recorded state: an object's annotations may
// hold 256 KiB in all, and the copy's own annotations need room.
const maxLastApplied = 128 << 10

// contentOf is what of a copy localEdits governs: every top-level field
// outside apiVersion, kind, metadata and status.
func contentOf(obj map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range obj {
		switch k {
		case "apiVersion", "kind", "metadata", "status":
		default:
			out[k] = v
		}
	}
	return out
}

// keepLocalEdits rewrites local, the desired copy, so that the fields of
// existing (nil for a new copy) edited locally since the last apply keep
// their local values unless kcp changed them, and records the new base on
// local. It returns the fields kcp removed that existing still holds (an
// apply alone leaves those that another manager co-owns).
//
// Service-owned paths (owned) are no part of the base: kcp's changes to
// them are not applied, so their absence from a later desired state is no
// removal.
func keepLocalEdits(local, existing *unstructured.Unstructured, owned []fieldpath.Path) (removed []fieldpath.Path, err error) {
	desired := contentOf(local.Object)
	var last, current map[string]any
	if existing != nil {
		current = contentOf(existing.Object)
		if raw := existing.GetAnnotations()[naming.AnnotationLastApplied]; raw != "" {
			if err := utiljson.Unmarshal([]byte(raw), &last); err != nil {
				// No usable base: kcp's state wins everywhere, and the
				// base is written again below.
				last = nil
			}
			stripPaths(last, owned)
		}
	}
	merged, removed := threeway.Merge(last, desired, current)
	for k := range desired {
		delete(local.Object, k)
	}
	for k, v := range merged {
		local.Object[k] = v
	}
	base, err := withoutPaths(desired, owned)
	if err != nil {
		return nil, fmt.Errorf("cannot encode the applied state: %w", err)
	}
	if len(base) <= maxLastApplied {
		ann := local.GetAnnotations()
		if ann == nil {
			ann = map[string]string{}
		}
		ann[naming.AnnotationLastApplied] = string(base)
		local.SetAnnotations(ann)
	}
	return removed, nil
}

// removeFields deletes from the copy got the fields kcp removed that an
// apply could not (another manager co-owns them: the local edit that was
// kept). A JSON patch tests the resourceVersion, so a copy changed since
// the apply is never patched blind; the retry applies again.
func (e *Engine) removeFields(ctx context.Context, pub *Published, got *unstructured.Unstructured, paths []fieldpath.Path) (*unstructured.Unstructured, error) {
	ops := []map[string]any{{"op": "test", "path": "/metadata/resourceVersion", "value": got.GetResourceVersion()}}
	for _, p := range paths {
		if _, err := p.Get(got.Object); err != nil {
			continue // gone already
		}
		ops = append(ops, map[string]any{"op": "remove", "path": pointer(p)})
	}
	if len(ops) == 1 {
		return got, nil
	}
	patch, err := json.Marshal(ops)
	if err != nil {
		return nil, fmt.Errorf("cannot encode a patch: %w", err)
	}
	out, err := e.opts.Dynamic.Resource(pub.Local).Namespace(got.GetNamespace()).Patch(ctx, got.GetName(), types.JSONPatchType, patch,
		metav1.PatchOptions{FieldManager: FieldManager})
	if err != nil {
		if apierrors.IsInvalid(err) || apierrors.IsConflict(err) {
			return nil, fmt.Errorf("%s changed while fields kcp removed were removed (retrying): %w", nsName(got.GetNamespace(), got.GetName()), err)
		}
		return nil, fmt.Errorf("cannot remove fields kcp removed from %s: %w", nsName(got.GetNamespace(), got.GetName()), err)
	}
	return out, nil
}

// pointer is p as a JSON pointer (RFC 6901).
func pointer(p fieldpath.Path) string {
	var b strings.Builder
	for _, seg := range p {
		b.WriteString("/")
		b.WriteString(strings.NewReplacer("~", "~0", "/", "~1").Replace(seg))
	}
	return b.String()
}

// withoutPaths is obj without paths, encoded (a copy: obj is not touched).
func withoutPaths(obj map[string]any, paths []fieldpath.Path) ([]byte, error) {
	data, err := json.Marshal(obj)
	if err != nil || len(paths) == 0 {
		return data, err
	}
	var out map[string]any
	if err := utiljson.Unmarshal(data, &out); err != nil {
		return nil, err
	}
	stripPaths(out, paths)
	return json.Marshal(out)
}

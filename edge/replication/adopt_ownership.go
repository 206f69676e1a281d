package replication

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/structured-merge-diff/v6/fieldpath"
)

// Field ownership after an adoption.
//
// The apply that adopts an object makes ferry's field manager an owner of
// every field it sets, but where the previous writer (api-syncagent, kubectl,
// a chart) set the same value the ownership is shared: server-side apply
// forces ownership only where values conflict. A field that stays co-owned
// is not removed when ferry's next apply leaves it out, so a field the kcp
// user later removes would survive in the adopted copy. After the adopting
// apply, the fields ferry's apply owns are taken out of the other writers'
// entries, so ferry owns them alone — what it would own had it created the
// copy. Fields ferry does not set, the status subresource and the
// service-owned paths' manager are left as they are.

// withoutAdoptedFields returns managed with manager's fields (its Apply
// entry of the main resource) removed from every other entry of the main
// resource except keep's; entries left empty are dropped. changed is false
// when nothing else owned any of manager's fields.
func withoutAdoptedFields(managed []metav1.ManagedFieldsEntry, manager string, keep ...string) (out []metav1.ManagedFieldsEntry, changed bool, err error) {
	var own *fieldpath.Set
	for _, mf := range managed {
		if mf.Manager == manager && mf.Operation == metav1.ManagedFieldsOperationApply && mf.Subresource == "" && mf.FieldsV1 != nil {
			own = &fieldpath.Set{}
			if err := own.FromJSON(bytes.NewReader(mf.FieldsV1.Raw)); err != nil {
				return nil, false, fmt.Errorf("cannot read the fields %s owns: %w", manager, err)
			}
			break
		}
	}
	if own == nil {
		return managed, false, nil
	}
	for _, mf := range managed {
		if mf.Manager == manager || mf.Subresource != "" || mf.FieldsV1 == nil || slices.Contains(keep, mf.Manager) {
			out = append(out, mf)
			continue
		}
		set := &fieldpath.Set{}
		if err := set.FromJSON(bytes.NewReader(mf.FieldsV1.Raw)); err != nil {
			return nil, false, fmt.Errorf("cannot read the fields %s owns: %w", mf.Manager, err)
		}
		rest := set.Difference(own)
		if rest.Equals(set) {
			out = append(out, mf)
			continue
		}
		changed = true
		if rest.Empty() {
			continue
		}
		raw, err := rest.ToJSON()
		if err != nil {
			return nil, false, fmt.Errorf("cannot encode the fields %s owns: %w", mf.Manager, err)
		}
		mf.FieldsV1 = &metav1.FieldsV1{Raw: raw}
		out = append(out, mf)
	}
	return out, changed, nil
}

// ownAdoptedFields makes ferry the only owner of the fields it applied on
// got, an object it has just adopted (see above). The write carries got's
// UID and resourceVersion: an object changed since is left as it is (the
// adoption stands; the fields stay co-owned) and said so in the log, as
// the next change of such a field in kcp is still applied.
func (e *Engine) ownAdoptedFields(ctx context.Context, pub *Published, got *unstructured.Unstructured) *unstructured.Unstructured {
	managed, changed, err := withoutAdoptedFields(got.GetManagedFields(), FieldManager, ServiceOwnedFieldManager)
	if err != nil || !changed {
		if err != nil {
			e.opts.Log.Error(err, "cannot take sole ownership of an adopted copy's fields", "local", nsName(got.GetNamespace(), got.GetName()))
		}
		return got
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid": got.GetUID(), "resourceVersion": got.GetResourceVersion(), "managedFields": managed,
	}})
	if err != nil {
		e.opts.Log.Error(err, "cannot encode the adopted copy's field ownership", "local", nsName(got.GetNamespace(), got.GetName()))
		return got
	}
	out, err := e.opts.Dynamic.Resource(pub.Local).Namespace(got.GetNamespace()).Patch(ctx, got.GetName(), types.MergePatchType, patch,
		metav1.PatchOptions{FieldManager: FieldManager})
	if err != nil {
		e.opts.Log.Error(err, "the adopted copy keeps its previous writers as co-owners of the fields ferry sets (a field removed in kcp may stay on it)",
			"local", nsName(got.GetNamespace(), got.GetName()))
		return got
	}
	return out
}

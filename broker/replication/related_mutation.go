package replication

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/ferry-dev/ferry/pkg/mutation"
	"github.com/ferry-dev/ferry/pkg/related"
)

// mutateCopy shapes desired, the copy in kcp of a service-origin related
// object (its content, as objects.RelatedContent gives it), by the entry's
// mutation: the spec steps on the content, then — with syncStatus — the
// status the edge reported is set and the status steps run on it.
// reported is the object as the edge reported it (the service-cluster
// side); existing is the copy in kcp (nil when none).
func mutateCopy(ref *related.Reference, desired *unstructured.Unstructured, reported map[string]any, existing *unstructured.Unstructured) error {
	objs := mutation.Objects{Local: reported}
	if existing != nil {
		objs.Remote = existing.Object
	}
	if err := ref.MutateContent(desired.Object, objs); err != nil {
		return err
	}
	st, ok := reported["status"]
	if !ok || !ref.SyncStatus {
		return nil
	}
	desired.Object["status"] = runtime.DeepCopyJSONValue(st)
	return ref.MutateStatus(desired.Object, objs)
}

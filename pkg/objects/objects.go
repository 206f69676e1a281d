// Package objects holds the transformations of object content between kcp
// and the service cluster that both sides share: which metadata crosses the
// wire, and how an object is re-typed between its kcp-side and local
// group/version/kind.
package objects

import (
	"maps"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// kcpInternalSuffixes are annotation and label key domains that belong to
// kcp (e.g. "kcp.io/cluster", "tenancy.kcp.io/workspace"): they describe the
// object's place in kcp and never cross to the service cluster.
var kcpInternalSuffixes = []string{"kcp.io"}

// IsKCPInternal tells whether a label or annotation key belongs to kcp.
func IsKCPInternal(key string) bool {
	domain, _, found := strings.Cut(key, "/")
	if !found {
		return false
	}
	for _, s := range kcpInternalSuffixes {
		if domain == s || strings.HasSuffix(domain, "."+s) {
			return true
		}
	}
	return false
}

// DesiredState returns obj's content as a sync intent carries it: every
// top-level field except status, and from metadata only name, namespace,
// labels and annotations (without kcp-internal keys, and without ferry.dev/
// keys: those are ferry's bookkeeping on the copy, which a kcp consumer must
// not be able to set). Server-managed
// metadata (uid, resourceVersion, generation, timestamps, finalizers,
// managedFields, owner references) stays behind.
func DesiredState(obj *unstructured.Unstructured) *unstructured.Unstructured {
	out := &unstructured.Unstructured{Object: map[string]any{}}
	for k, v := range obj.Object {
		if k == "metadata" || k == "status" {
			continue
		}
		out.Object[k] = DeepCopyValue(v)
	}
	out.SetName(obj.GetName())
	out.SetNamespace(obj.GetNamespace())
	if l := filterKeys(obj.GetLabels()); len(l) > 0 {
		out.SetLabels(l)
	}
	if a := filterKeys(obj.GetAnnotations()); len(a) > 0 {
		out.SetAnnotations(a)
	}
	return out
}

func filterKeys(m map[string]string) map[string]string {
	var out map[string]string
	for k, v := range m {
		if IsKCPInternal(k) || IsFerrys(k) {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[k] = v
	}
	return out
}

// DeepCopyValue copies maps and slices of a JSON-like value, so the result
// shares nothing with v; unlike runtime.DeepCopyJSONValue it never panics
// on an unexpected scalar type.
func DeepCopyValue(v any) any {
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			out[k] = DeepCopyValue(e)
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i := range t {
			out[i] = DeepCopyValue(t[i])
		}
		return out
	default:
		return t
	}
}

// Retype sets obj's apiVersion and kind to gvk.
func Retype(obj *unstructured.Unstructured, gvk schema.GroupVersionKind) {
	obj.SetAPIVersion(gvk.GroupVersion().String())
	obj.SetKind(gvk.Kind)
}

// RelatedContent returns a related object's content as it crosses to the
// other side: DesiredState without name and namespace (the receiving side
// locates the object itself) and without ferry's own or kubectl's
// bookkeeping labels and annotations.
func RelatedContent(obj *unstructured.Unstructured) *unstructured.Unstructured {
	out := DesiredState(obj)
	meta, _ := out.Object["metadata"].(map[string]any)
	delete(meta, "name")
	delete(meta, "namespace")
	out.SetLabels(withoutBookkeeping(out.GetLabels()))
	out.SetAnnotations(withoutBookkeeping(out.GetAnnotations()))
	if len(meta) == 0 {
		delete(out.Object, "metadata")
	}
	return out
}

// IsFerrys tells whether a label or annotation key is ferry's own.
func IsFerrys(key string) bool {
	return strings.HasPrefix(key, "ferry.dev/")
}

func withoutBookkeeping(m map[string]string) map[string]string {
	for k := range m {
		if IsFerrys(k) || k == "kubectl.kubernetes.io/last-applied-configuration" {
			delete(m, k)
		}
	}
	if len(m) == 0 {
		return nil
	}
	return m
}

// MergeStrings returns a new map with a's entries overwritten by b's (label
// and annotation sets).
func MergeStrings(a, b map[string]string) map[string]string {
	out := make(map[string]string, len(a)+len(b))
	maps.Copy(out, a)
	maps.Copy(out, b)
	return out
}

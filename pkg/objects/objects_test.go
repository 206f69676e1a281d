package objects

import (
	"fmt"
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestIsKCPInternal(t *testing.T) {
	tests := map[string]bool{
		"kcp.io/cluster":              true,
		"tenancy.kcp.io/workspace":    true,
		"app.kubernetes.io/name":      false,
		"example.com/kcp.io":          false,
		"notkcp.io/x":                 false,
		"experimental.tenancy.kcp.io": false, // no slash: not a prefixed key
	}
	for key, want := range tests {
		if got := IsKCPInternal(key); got != want {
			t.Errorf("IsKCPInternal(%q) = %v, want %v", key, got, want)
		}
	}
}

func TestDesiredState(t *testing.T) {
	in := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "g.example.com/v1",
		"kind":       "Thing",
		"metadata": map[string]any{
			"name": "a", "namespace": "ns", "uid": "u1", "resourceVersion": "42", "generation": int64(3),
			"creationTimestamp": "2026-01-01T00:00:00Z", "finalizers": []any{"ferry.dev/edge"},
			"managedFields": []any{map[string]any{"manager": "kubectl"}},
			"labels":        map[string]any{"app": "x", "internal.kcp.io/x": "y"},
			"annotations":   map[string]any{"kcp.io/cluster": "abc", "note": "keep"},
		},
		"spec":   map[string]any{"size": int64(3), "list": []any{map[string]any{"a": "b"}}},
		"data":   map[string]any{"k": "v"},
		"status": map[string]any{"phase": "Ready"},
	}}
	got := DesiredState(in)
	want := map[string]any{
		"apiVersion": "g.example.com/v1",
		"kind":       "Thing",
		"metadata": map[string]any{
			"name": "a", "namespace": "ns",
			"labels":      map[string]any{"app": "x"},
			"annotations": map[string]any{"note": "keep"},
		},
		"spec": map[string]any{"size": int64(3), "list": []any{map[string]any{"a": "b"}}},
		"data": map[string]any{"k": "v"},
	}
	if !reflect.DeepEqual(got.Object, want) {
		t.Fatalf("DesiredState =\n%v\nwant\n%v", got.Object, want)
	}
	// The result is a copy.
	got.Object["spec"].(map[string]any)["size"] = int64(9)
	if in.Object["spec"].(map[string]any)["size"] != int64(3) {
		t.Fatal("DesiredState shares maps with its input")
	}
}

func TestRetype(t *testing.T) {
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "a/v1", "kind": "A"}}
	Retype(obj, schema.GroupVersionKind{Group: "b.example.com", Version: "v2", Kind: "B"})
	if obj.GetAPIVersion() != "b.example.com/v2" || obj.GetKind() != "B" {
		t.Fatalf("got %s %s", obj.GetAPIVersion(), obj.GetKind())
	}
}

func BenchmarkDesiredState(b *testing.B) {
	spec := map[string]any{}
	for i := range 50 {
		spec[fmt.Sprintf("field%d", i)] = map[string]any{"a": "b", "list": []any{int64(1), int64(2), "three"}}
	}
	in := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "g.example.com/v1", "kind": "Thing",
		"metadata": map[string]any{"name": "a", "namespace": "ns", "annotations": map[string]any{"kcp.io/cluster": "abc", "note": "x"}},
		"spec":     spec,
		"status":   map[string]any{"phase": "Ready"},
	}}
	b.ReportAllocs()
	for b.Loop() {
		_ = DesiredState(in)
	}
}

func TestRelatedContent(t *testing.T) {
	in := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
		"data": map[string]any{"password": "c2VjcmV0"},
		"metadata": map[string]any{
			"name": "db-creds", "namespace": "ns", "uid": "u", "resourceVersion": "7",
			"labels": map[string]any{"app": "db", "ferry.dev/related-to": "x", "kcp.io/cluster": "c"},
			"annotations": map[string]any{
				"kubectl.kubernetes.io/last-applied-configuration": "{}", "ferry.dev/remote-name": "n", "note": "kept",
			},
			"ownerReferences": []any{map[string]any{"name": "owner"}},
		},
	}}
	got := RelatedContent(in)
	want := map[string]any{
		"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
		"data":     map[string]any{"password": "c2VjcmV0"},
		"metadata": map[string]any{"labels": map[string]any{"app": "db"}, "annotations": map[string]any{"note": "kept"}},
	}
	if !reflect.DeepEqual(got.Object, want) {
		t.Errorf("RelatedContent =\n%v\nwant\n%v", got.Object, want)
	}
	bare := RelatedContent(&unstructured.Unstructured{Object: map[string]any{"kind": "ConfigMap", "metadata": map[string]any{"name": "x"}}})
	if _, ok := bare.Object["metadata"]; ok {
		t.Errorf("empty metadata kept: %v", bare.Object)
	}
}

// TestRelatedHash: the hash covers a related object's content, labels and
// annotations, not where it is, its type, server metadata or ferry's and
// kcp's bookkeeping, so the broker's hash of the kcp object and the edge's
// hash of its copy agree.
func TestRelatedHash(t *testing.T) {
	base := func() *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret",
			"metadata": map[string]any{"name": "creds", "namespace": "default", "labels": map[string]any{"kind": "db"}},
			"data":     map[string]any{"password": "aHVudGVyMg=="}, "type": "Opaque"}}
	}
	want := RelatedHash(base())
	for _, tc := range []struct {
		name string
		edit func(u *unstructured.Unstructured)
		same bool
	}{
		{name: "another place, version and server metadata", same: true, edit: func(u *unstructured.Unstructured) {
			u.SetNamespace("local-ns")
			u.SetName("other")
			u.SetAPIVersion("v2")
			u.SetUID("u-1")
			u.SetResourceVersion("42")
			u.SetLabels(map[string]string{"kind": "db", "ferry.dev/related-to": "uid"})
			u.SetAnnotations(map[string]string{"kcp.io/cluster": "c1", "ferry.dev/content-hash": "h"})
		}},
		{name: "data changed", edit: func(u *unstructured.Unstructured) { u.Object["data"] = map[string]any{"password": "eA=="} }},
		{name: "data key added", edit: func(u *unstructured.Unstructured) {
			u.Object["data"] = map[string]any{"password": "aHVudGVyMg==", "extra": "eA=="}
		}},
		{name: "label changed", edit: func(u *unstructured.Unstructured) { u.SetLabels(map[string]string{"kind": "cache"}) }},
		{name: "type removed", edit: func(u *unstructured.Unstructured) { delete(u.Object, "type") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			u := base()
			tc.edit(u)
			if got := RelatedHash(u); (got == want) != tc.same {
				t.Fatalf("hash %s, base %s: same = %v, want %v", got, want, got == want, tc.same)
			}
		})
	}
}

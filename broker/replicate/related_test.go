package replicate

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

func TestSameRelated(t *testing.T) {
	obj := func(labels map[string]any, data string) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": "v1", "kind": "Secret",
			"metadata": map[string]any{"name": "s", "labels": labels, "resourceVersion": "5"},
			"data":     map[string]any{"k": data},
		}}
	}
	desired := obj(map[string]any{"ferry.dev/related-to": "u"}, "v")
	tests := []struct {
		name     string
		existing *unstructured.Unstructured
		want     bool
	}{
		{"equal but for kcp's claim label", obj(map[string]any{"ferry.dev/related-to": "u", "claimed.internal.apis.kcp.io/x": "y"}, "v"), true},
		{"data differs", obj(map[string]any{"ferry.dev/related-to": "u"}, "w"), false},
		{"label differs", obj(map[string]any{"ferry.dev/related-to": "u", "extra": "1"}, "v"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := sameRelated(tt.existing, desired); got != tt.want {
				t.Errorf("sameRelated = %v, want %v", got, tt.want)
			}
		})
	}
	extra := obj(map[string]any{"ferry.dev/related-to": "u"}, "v")
	extra.Object["type"] = "Opaque"
	if sameRelated(extra, desired) {
		t.Error("a top-level field only the existing copy has was ignored")
	}
}

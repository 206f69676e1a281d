package replicate

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

func relatedIntent(primary, id, name string, seq uint64, del bool) *ferryv1.SyncIntent {
	in := &ferryv1.SyncIntent{
		Key:       &ferryv1.ObjectKey{Cluster: "c", Resource: &ferryv1.GroupVersionResource{Version: "v1", Resource: "secrets"}, Namespace: "ns", Name: name},
		RelatedTo: &ferryv1.RelatedTo{Primary: key(primary), Identifier: id},
		Version:   &ferryv1.ObjectVersion{BrokerEpoch: 1, Sequence: seq},
	}
	if del {
		in.Operation = &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{}}
	} else {
		in.Operation = &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{Object: []byte(`{}`)}}
	}
	return in
}

func TestOutboxRelatedSlots(t *testing.T) {
	o := NewOutbox(10, func() {})
	// One slot per primary and entry, whatever object it points at; an
	// upsert may replace a pending delete (a related object can come back).
	o.Put(relatedIntent("a", "creds", "old", 1, true))
	o.Put(relatedIntent("a", "creds", "new", 2, false))
	o.Put(relatedIntent("a", "config", "cfg", 3, false))
	o.Put(relatedIntent("b", "creds", "new", 4, false))
	o.Put(upsert("a", 5, "1")) // the primary itself has its own slot
	if p, _ := o.Len(); p != 4 {
		t.Fatalf("pending %d, want 4", p)
	}
	first := o.Next()
	if first.GetUpsert() == nil || first.GetKey().GetName() != "new" || first.GetVersion().GetSequence() != 2 {
		t.Fatalf("first = %v, want the upsert of a/creds", first)
	}
	if o.Done(first.GetKey(), nil, first.GetVersion()) != nil {
		t.Error("a result without related_to matched a related intent")
	}
	if o.Done(first.GetKey(), first.GetRelatedTo(), first.GetVersion()) == nil {
		t.Error("the related result did not match")
	}
}

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

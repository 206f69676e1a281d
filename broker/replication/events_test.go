package replication

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestRepeatedFailuresUpdateOneEvent: every nack used to create a new
// Event (generateName, count 1); now there is one Event per object and
// reason whose count and message follow the repeats.
func TestRepeatedFailuresUpdateOneEvent(t *testing.T) {
	obj := thing("1", map[string]any{"size": int64(1)}, nil)
	e := newEnv(t, thingsResource(), obj)
	m, client := e.m, e.kcp
	ctx := context.Background()
	for i, reason := range []string{"SyncFailed", "SyncFailed", "SyncFailed", "RelatedMissing", "SyncFailed"} {
		if err := m.recordEvent(ctx, "pr", thingKey(), "Warning", reason, "attempt "+string(rune('0'+i))); err != nil {
			t.Fatal(err)
		}
	}
	list, err := client.Resource(eventsGVR).Namespace("ns").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	counts := map[string]int64{}
	messages := map[string]string{}
	for _, e := range list.Items {
		reason, _, _ := unstructured.NestedString(e.Object, "reason")
		counts[reason], _, _ = unstructured.NestedInt64(e.Object, "count")
		messages[reason], _, _ = unstructured.NestedString(e.Object, "message")
	}
	if len(list.Items) != 2 || counts["SyncFailed"] != 4 || counts["RelatedMissing"] != 1 {
		t.Fatalf("events %d, counts %v; want 2 events, SyncFailed 4, RelatedMissing 1", len(list.Items), counts)
	}
	if messages["SyncFailed"] != "attempt 4" {
		t.Errorf("message %q, want the latest (attempt 4)", messages["SyncFailed"])
	}
}

package engine

import (
	"fmt"
	"testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// TestObjectRecordsHoldOnlyKnownObjects: a report the broker refuses makes
// an admin record only for an object the broker syncs; keys an edge makes
// up would otherwise grow the records without bound (nothing removes them).
func TestObjectRecordsHoldOnlyKnownObjects(t *testing.T) {
	r := newObjectRecords(func(k *ferryv1.ObjectKey) bool { return k.GetUid() == "u1" })
	r.inventory(&ferryv1.Inventory{PublishedResource: "pr", Complete: true,
		Entries: []*ferryv1.InventoryEntry{{Key: testKey("u1"), AppliedHash: "h1"}}})
	refusal := &ferryv1.ReportResult{Error: &ferryv1.ApplyError{Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_INVALID, Message: "refused"}}
	for i := range 1000 {
		r.reported(testKey(fmt.Sprintf("other-%d", i)), false, refusal)
	}
	if n := len(r.byID); n != 1 {
		t.Fatalf("%d records, want 1 (the known object)", n)
	}
	if rec, ok := r.get(testKey("u1")); !ok || rec.applied.GetContentHash() != "h1" {
		t.Fatalf("the known object's record: %v %v", ok, rec.applied)
	}
}

package replication

import (
	"testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// TestInventoryThatLacksASentStateGetsItAgain: the edge's inventory reports
// a copy as not holding the state the broker sent and the edge acked (the
// copy was applied under PublishedResource settings that changed since,
// e.g. a new spec mutation, or it was lost). The broker sends that state
// again, though it is the one it sent last.
func TestInventoryThatLacksASentStateGetsItAgain(t *testing.T) {
	for _, tc := range []struct {
		name     string
		reported string // the inventory's applied hash; "=" the sent one
		listed   bool
		wantSent bool
	}{
		{name: "holds the sent state", reported: "=", listed: true},
		{name: "holds it under other settings", reported: "", listed: true, wantSent: true},
		{name: "not listed (copy gone)", wantSent: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := thing("1", map[string]any{"size": int64(1)}, nil)
			m, intents := testManager(t, obj) // listed: queued
			drain(t, m)
			first := 0
			for in := intents.Next(); in != nil; in = intents.Next() {
				first++
				intents.Done(in.GetKey(), in.GetRelatedTo(), in.GetVersion())
			}
			if first != 1 {
				t.Fatalf("first send: %d intents", first)
			}
			edgeApplied(t, m, obj)
			inv := &ferryv1.Inventory{PublishedResource: "pr", Complete: true}
			if tc.listed {
				h := tc.reported
				if h == "=" {
					h = hashOf(t, obj)
				}
				inv.Entries = []*ferryv1.InventoryEntry{{Key: objectKey(obj, thingsGVR), AppliedHash: h, PublishedResource: "pr"}}
			}
			m.Inventory(inv)
			drain(t, m)
			sent := false
			for in := intents.Next(); in != nil; in = intents.Next() {
				sent = sent || in.GetUpsert() != nil
			}
			if sent != tc.wantSent {
				t.Fatalf("upsert sent: %v, want %v", sent, tc.wantSent)
			}
		})
	}
}

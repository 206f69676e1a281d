package replication

import (
	"testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// TestLedgerTransitions runs sequences of events through a ledger and
// checks what it then decides for the object: whether an upsert of h1 would
// be queued, whether a delete would, and which older copies block it.
func TestLedgerTransitions(t *testing.T) {
	keyA, keyB := keyOf("a", "u-a"), keyOf("a", "u-b") // one name, two objects
	idA, idB := idOf("pr", keyA), idOf("pr", keyB)
	type step func(l *ledger)
	upsert := func(id objectID, k *ferryv1.ObjectKey, h string) step {
		return func(l *ledger) { l.upsertQueued(id, k, h) }
	}
	del := func(id objectID, k *ferryv1.ObjectKey) step { return func(l *ledger) { l.deleteQueued(id, k) } }
	ack := func(id objectID, k *ferryv1.ObjectKey, h string) step { return func(l *ledger) { l.acked(id, k, h) } }
	cases := []struct {
		name  string
		steps []step
		// on idA unless stated: the edge holds h1 (no upsert needed)
		wantApplied string
		// an upsert of h1 for idA would be queued now
		wantUpsert bool
		// a delete for idA would be queued now
		wantDelete bool
		// older copies (other UIDs) blocking idB
		wantOlderForB int
	}{
		{name: "new object", wantUpsert: true, wantDelete: true},
		{name: "queued, not answered", steps: []step{upsert(idA, keyA, "h1")}, wantUpsert: false, wantDelete: true, wantOlderForB: 1},
		{name: "applied", steps: []step{upsert(idA, keyA, "h1"), ack(idA, keyA, "h1")}, wantApplied: "h1", wantDelete: true, wantOlderForB: 1},
		{name: "applied, then delete queued (4a): the applied state no longer counts",
			steps: []step{upsert(idA, keyA, "h1"), ack(idA, keyA, "h1"), del(idA, keyA)}, wantUpsert: true, wantOlderForB: 1},
		{name: "retry after a transient nack", steps: []step{upsert(idA, keyA, "h1"), func(l *ledger) { l.retry(idA) }},
			wantUpsert: true, wantDelete: true, wantOlderForB: 1},
		{name: "final nack, then the PublishedResource changed",
			steps:      []step{upsert(idA, keyA, "h1"), func(l *ledger) { l.rejectedFinal(idA, keyA) }, func(l *ledger) { l.unreject(idA) }},
			wantUpsert: true, wantDelete: true, wantOlderForB: 1},
		{name: "final nack, then a new stream: not sent (nor evented) again",
			steps:      []step{upsert(idA, keyA, "h1"), func(l *ledger) { l.rejectedFinal(idA, keyA) }, func(l *ledger) { l.streamAttached() }},
			wantUpsert: false, wantDelete: true, wantOlderForB: 1},
		{name: "final nack, then an inventory without it: not sent again",
			steps: []step{upsert(idA, keyA, "h1"), func(l *ledger) { l.rejectedFinal(idA, keyA) },
				func(l *ledger) { l.inventoried("pr", map[objectID]string{}) }},
			wantUpsert: false, wantDelete: true, wantOlderForB: 1},
		{name: "resend: the copy drifted", steps: []step{upsert(idA, keyA, "h1"), ack(idA, keyA, "h1"), func(l *ledger) { l.resend(idA) }},
			wantUpsert: true, wantDelete: true, wantOlderForB: 1},
		{name: "deletion confirmed: nothing left", steps: []step{upsert(idA, keyA, "h1"), ack(idA, keyA, "h1"), del(idA, keyA),
			func(l *ledger) { l.confirmed(idA) }}, wantUpsert: true, wantDelete: true},
		{name: "new stream", steps: []step{upsert(idA, keyA, "h1"), ack(idA, keyA, "h1"), func(l *ledger) { l.streamAttached() }},
			wantApplied: "h1", wantDelete: true, wantOlderForB: 1},
		{name: "withdrawn: a delete is asked for again", steps: []step{del(idA, keyA), func(l *ledger) { l.withdrawn("pr") }},
			wantUpsert: true, wantDelete: true, wantOlderForB: 0},
		{name: "republished (4b): sent again", steps: []step{upsert(idA, keyA, "h1"), ack(idA, keyA, "h1"), func(l *ledger) { l.republished("pr") }},
			wantUpsert: true, wantDelete: true, wantOlderForB: 1},
		{name: "recreated (4c): the new UID holds nothing, the old copy blocks it",
			steps: []step{upsert(idA, keyA, "h1"), ack(idA, keyA, "h1")}, wantApplied: "h1", wantDelete: true, wantOlderForB: 1},
		// The inventory is what the edge holds: a copy it does not list (gone,
		// or applied under other settings) gets the sent state again.
		{name: "inventory without the object", steps: []step{upsert(idA, keyA, "h1"), ack(idA, keyA, "h1"),
			func(l *ledger) { l.inventoried("pr", map[objectID]string{}) }}, wantUpsert: true, wantDelete: true, wantOlderForB: 1},
		{name: "inventory lists it under other settings", steps: []step{upsert(idA, keyA, "h1"), ack(idA, keyA, "h1"),
			func(l *ledger) { l.inventoried("pr", map[objectID]string{idA: ""}) }}, wantUpsert: true, wantDelete: true, wantOlderForB: 1},
		{name: "inventory lists it applied", steps: []step{func(l *ledger) { l.copyListed(idA, keyA) },
			func(l *ledger) { l.inventoried("pr", map[objectID]string{idA: "h1"}) }}, wantApplied: "h1", wantUpsert: false, wantDelete: true, wantOlderForB: 1},
		{name: "forgotten (released)", steps: []step{upsert(idA, keyA, "h1"), func(l *ledger) { l.forget("pr") }},
			wantUpsert: true, wantDelete: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := newLedger()
			for _, s := range tc.steps {
				s(l)
			}
			if got := l.applied(idA); got != tc.wantApplied {
				t.Errorf("applied %q, want %q", got, tc.wantApplied)
			}
			if got := len(l.olderCopies(idB)); got != tc.wantOlderForB {
				t.Errorf("older copies blocking the new UID: %d, want %d", got, tc.wantOlderForB)
			}
			if l.applied(idB) != "" {
				t.Error("the new UID inherits the old object's applied state")
			}
			// Decisions change the ledger: each on its own copy of the steps.
			up := newLedger()
			for _, s := range tc.steps {
				s(up)
			}
			if got := up.applied(idA) != "h1" && up.upsertQueued(idA, keyA, "h1"); got != tc.wantUpsert {
				t.Errorf("upsert queued %v, want %v", got, tc.wantUpsert)
			}
			d := newLedger()
			for _, s := range tc.steps {
				s(d)
			}
			if got := d.deleteQueued(idA, keyA); got != tc.wantDelete {
				t.Errorf("delete queued %v, want %v", got, tc.wantDelete)
			}
		})
	}
}

// TestLedgerSlots: copies are found per place and PublishedResource, and a
// confirmed deletion removes only its own object's record.
func TestLedgerSlots(t *testing.T) {
	l := newLedger()
	keyA, keyB, keyC := keyOf("a", "u-a"), keyOf("a", "u-b"), keyOf("c", "u-c")
	l.upsertQueued(idOf("pr", keyA), keyA, "h")
	l.copyListed(idOf("pr", keyB), keyB)
	l.acked(idOf("other", keyC), keyC, "h")
	if got := len(l.copiesAt(item{pr: "pr", key: "c|ns/a"})); got != 2 {
		t.Fatalf("copies at a: %d, want 2", got)
	}
	if got := l.slotsWithCopies("pr"); len(got) != 1 {
		t.Fatalf("slots with copies of pr: %v", got)
	}
	l.confirmed(idOf("pr", keyA))
	got := l.copiesAt(item{pr: "pr", key: "c|ns/a"})
	if len(got) != 1 || got[0].uid != "u-b" {
		t.Fatalf("after the confirmation for u-a: %v, want only u-b", got)
	}
	if l.appliedCount("other") != 1 || l.appliedCount("pr") != 0 {
		t.Error("applied counts mix PublishedResources")
	}
}

// TestFinalRefusalHoldsUntilTheObjectChanges: a final refusal of h1 is not
// sent again on later streams, but the object's next desired state is.
func TestFinalRefusalHoldsUntilTheObjectChanges(t *testing.T) {
	key := keyOf("a", "u-a")
	id := idOf("pr", key)
	l := newLedger()
	l.upsertQueued(id, key, "h1")
	l.rejectedFinal(id, key)
	l.streamAttached()
	if l.upsertQueued(id, key, "h1") {
		t.Fatal("the refused state was queued again on a new stream")
	}
	if !l.upsertQueued(id, key, "h2") {
		t.Fatal("the object's new state was not queued")
	}
}

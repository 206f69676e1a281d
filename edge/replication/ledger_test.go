package replication

import (
	"testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

func ledgerKeyOf(pr, name, uid string) ledgerKey {
	return keyFor(pr, &ferryv1.ObjectKey{Cluster: "c1", Resource: &ferryv1.GroupVersionResource{Group: "kcp.example", Version: "v1", Resource: "things"},
		Namespace: "team", Name: name, Uid: uid})
}

// TestLedgerTransitions runs sequences of events through a ledger and
// checks what it then says of object a (UID u-a): where its copy was
// applied, whether a copy seen at generation 1 with hash h1 drifted,
// whether an upsert is forced by a resend, whether a delete is in flight,
// whether status s1 would be reported, the conflicts of its
// PublishedResource, and how many objects are recorded.
func TestLedgerTransitions(t *testing.T) {
	a := ledgerKeyOf("pr", "a", "u-a")
	aNewUID := ledgerKeyOf("pr", "a", "u-a2") // deleted and created again in kcp
	b := ledgerKeyOf("pr", "b", "u-b")
	s1, s2 := [32]byte{1}, [32]byte{2}
	v7 := &ferryv1.ObjectVersion{Sequence: 7}
	type step func(l *ledger)
	applied := func(k ledgerKey, hash string, gen int64) step {
		return func(l *ledger) { l.applied(k, hash, "", "local-ns", "a-copy", gen) }
	}
	appliedShape := func(shape string) step {
		return func(l *ledger) { l.applied(a, "h1", shape, "local-ns", "a-copy", 1) }
	}
	askResend := func(l *ledger) { l.askResend(a) }
	status := func(sum [32]byte) step { return func(l *ledger) { l.statusSeen(a, sum) } }
	deleteIssued := func(l *ledger) { l.deleteIssued(a, v7) }
	deleteFailed := func(l *ledger) { l.deleteFailed(a) }
	gone := func(l *ledger) { l.gone(a) }
	confirmed := func(l *ledger) { l.confirmed(a) }
	conflict := func(k ledgerKey) step { return func(l *ledger) { l.answered(k, refusalConflict, "taken", false) } }
	failing := func(k ledgerKey) step {
		return func(l *ledger) { l.answered(k, refusalFailing, "mutation failed", false) }
	}
	succeeded := func(k ledgerKey) step { return func(l *ledger) { l.answered(k, refusalNone, "", true) } }
	transientNack := func(k ledgerKey) step { return func(l *ledger) { l.answered(k, refusalNone, "", false) } }

	cases := []struct {
		name  string
		steps []step
		// want: a's copy recorded as applied; a copy seen at generation 1
		// with hash h1 (no shape) drifted; a resend forces the next
		// upsert; a delete is in flight; status s1 would be reported;
		// conflicts of pr; objects recorded.
		wantApplied, wantDrifted, wantResend, wantDeleting, wantStatus bool
		wantConflicts, wantFailing, wantRecords                        int
	}{
		{name: "nothing known: copies of an earlier process are trusted", wantStatus: true},
		{name: "applied", steps: []step{applied(a, "h1", 1)}, wantApplied: true, wantStatus: true, wantRecords: 1},
		{name: "applied, then someone else changed the spec (generation moved)", steps: []step{applied(a, "h1", 0)},
			wantApplied: true, wantDrifted: true, wantStatus: true, wantRecords: 1},
		{name: "applied h2, copy shows h1: hash changed by someone else", steps: []step{applied(a, "h2", 1)},
			wantApplied: true, wantDrifted: true, wantStatus: true, wantRecords: 1},
		{name: "applied with a shape, copy shows none: changed by someone else", steps: []step{appliedShape("s")},
			wantApplied: true, wantDrifted: true, wantStatus: true, wantRecords: 1},
		{name: "drifted: resend asked", steps: []step{applied(a, "h1", 0), askResend},
			wantApplied: true, wantDrifted: true, wantResend: true, wantStatus: true, wantRecords: 1},
		{name: "resend asked for a copy of an earlier process", steps: []step{askResend},
			wantResend: true, wantStatus: true, wantRecords: 1},
		{name: "resend answered: the re-sent state applied", steps: []step{applied(a, "h1", 0), askResend, applied(a, "h1", 1)},
			wantApplied: true, wantStatus: true, wantRecords: 1},
		{name: "status reported", steps: []step{applied(a, "h1", 1), status(s1)}, wantApplied: true, wantRecords: 1},
		{name: "status changed", steps: []step{status(s1), status(s2)}, wantStatus: true, wantRecords: 1},
		{name: "copy gone by someone else: status forgotten, applied kept to judge the repair",
			steps: []step{applied(a, "h1", 1), status(s1), gone}, wantApplied: true, wantStatus: true, wantRecords: 1},
		{name: "delete issued", steps: []step{applied(a, "h1", 1), deleteIssued},
			wantApplied: true, wantDeleting: true, wantStatus: true, wantRecords: 1},
		{name: "delete issued: no resend while it is in flight", steps: []step{applied(a, "h1", 0), deleteIssued, askResend},
			wantApplied: true, wantDrifted: true, wantDeleting: true, wantStatus: true, wantRecords: 1},
		{name: "delete could not be issued", steps: []step{applied(a, "h1", 1), deleteIssued, deleteFailed},
			wantApplied: true, wantStatus: true, wantRecords: 1},
		{name: "delete issued, copy gone: nothing left", steps: []step{applied(a, "h1", 1), status(s1), deleteIssued, gone},
			wantStatus: true},
		{name: "delete confirmed at once (no copy): nothing left", steps: []step{applied(a, "h1", 1), askResend, confirmed},
			wantStatus: true},
		{name: "final conflict", steps: []step{conflict(a)}, wantStatus: true, wantConflicts: 1, wantRecords: 1},
		{name: "final conflict counted once", steps: []step{conflict(a), conflict(a)}, wantStatus: true, wantConflicts: 1, wantRecords: 1},
		{name: "final conflict, then a transient nack: still refused", steps: []step{conflict(a), transientNack(a)},
			wantStatus: true, wantConflicts: 1, wantRecords: 1},
		{name: "final conflict, then applied", steps: []step{conflict(a), succeeded(a)}, wantStatus: true},
		{name: "final conflict outlives the delete's confirmation until its answer is counted",
			steps: []step{conflict(a), confirmed}, wantStatus: true, wantConflicts: 1, wantRecords: 1},
		{name: "final refusal other than a conflict", steps: []step{failing(a)}, wantStatus: true, wantFailing: 1, wantRecords: 1},
		{name: "failing, then a conflict: counted as the conflict only", steps: []step{failing(a), conflict(a)},
			wantStatus: true, wantConflicts: 1, wantRecords: 1},
		{name: "failing, then applied", steps: []step{failing(a), succeeded(a)}, wantStatus: true},
		{name: "one failing, one in conflict", steps: []step{failing(a), conflict(b)}, wantStatus: true, wantConflicts: 1, wantFailing: 1, wantRecords: 2},
		{name: "two objects in conflict", steps: []step{conflict(a), conflict(b)}, wantStatus: true, wantConflicts: 2, wantRecords: 2},
		{name: "new revision of the PublishedResource: conflicts counted again", steps: []step{applied(a, "h1", 1), conflict(a), conflict(b),
			failing(a), func(l *ledger) { l.resetRefusals("pr") }}, wantApplied: true, wantStatus: true, wantRecords: 1},
		{name: "PublishedResource removed: everything of it forgotten", steps: []step{applied(a, "h1", 1), status(s1), conflict(b),
			func(l *ledger) { l.forget("pr") }}, wantStatus: true},
		{name: "another PublishedResource removed", steps: []step{applied(a, "h1", 1), func(l *ledger) { l.forget("other") }},
			wantApplied: true, wantStatus: true, wantRecords: 1},
		{name: "recreated in kcp: the new UID inherits nothing (its conflict counts for pr)", steps: []step{applied(aNewUID, "h1", 0), conflict(aNewUID)},
			wantStatus: true, wantConflicts: 1, wantRecords: 1},
		{name: "stream ended: applied state outlives it", steps: []step{applied(a, "h1", 1), func(l *ledger) { l.streamEnded() }},
			wantApplied: true, wantStatus: true, wantRecords: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := newLedger()
			for _, s := range tc.steps {
				s(l)
			}
			if _, _, got := l.appliedAt(a); got != tc.wantApplied {
				t.Errorf("applied %v, want %v", got, tc.wantApplied)
			}
			if got := l.drifted(a, 1, "h1", ""); got != tc.wantDrifted {
				t.Errorf("drifted %v, want %v", got, tc.wantDrifted)
			}
			if got := l.resendPending(a); got != tc.wantResend {
				t.Errorf("resend pending %v, want %v", got, tc.wantResend)
			}
			if got := l.deleting(a); got != tc.wantDeleting {
				t.Errorf("deleting %v, want %v", got, tc.wantDeleting)
			}
			if got := l.refusals("pr"); got.conflicting != tc.wantConflicts || got.failing != tc.wantFailing {
				t.Errorf("conflicts %d, failing %d, want %d, %d", got.conflicting, got.failing, tc.wantConflicts, tc.wantFailing)
			}
			if got := l.len(); got != tc.wantRecords {
				t.Errorf("records %d, want %d", got, tc.wantRecords)
			}
			// Last: it records the status.
			if got := l.statusSeen(a, s1); got != tc.wantStatus {
				t.Errorf("status s1 reported %v, want %v", got, tc.wantStatus)
			}
		})
	}
}

// TestLedgerGoneConfirmsTheDeleteInFlight: the copy's disappearance hands
// back the version of the delete carried out (to confirm) once.
func TestLedgerGoneConfirmsTheDeleteInFlight(t *testing.T) {
	a := ledgerKeyOf("pr", "a", "u-a")
	l := newLedger()
	l.applied(a, "h1", "", "local-ns", "a-copy", 1)
	if _, deleting := l.gone(a); deleting {
		t.Fatal("a copy deleted by someone else is taken for a confirmed delete")
	}
	l.deleteIssued(a, &ferryv1.ObjectVersion{Sequence: 7})
	v, deleting := l.gone(a)
	if !deleting || v.GetSequence() != 7 {
		t.Fatalf("gone: version %v deleting %v, want sequence 7", v, deleting)
	}
	if _, deleting := l.gone(a); deleting {
		t.Fatal("the delete is confirmed twice")
	}
}

// TestLedgerPendingIntents: the latest intent per queue key waits for a
// worker; a related object's slot is its own; the stream's end drops them
// (the broker sends them again), the PublishedResource's removal does not
// (each is answered).
func TestLedgerPendingIntents(t *testing.T) {
	a := ledgerKeyOf("pr", "a", "u-a")
	in1, in2, rel := &ferryv1.SyncIntent{Version: &ferryv1.ObjectVersion{Sequence: 1}},
		&ferryv1.SyncIntent{Version: &ferryv1.ObjectVersion{Sequence: 2}}, &ferryv1.SyncIntent{}
	l := newLedger()
	l.received(queueKey{object: a}, in1)
	l.received(queueKey{object: a}, in2)
	l.received(queueKey{object: a, related: "secret"}, rel)
	if got := l.take(queueKey{object: a}); got != in2 {
		t.Fatalf("took %v, want the latest", got)
	}
	if got := l.take(queueKey{object: a}); got != nil {
		t.Fatalf("took %v twice", got)
	}
	if got := l.take(queueKey{object: a, related: "secret"}); got != rel {
		t.Fatalf("related slot: took %v", got)
	}
	l.received(queueKey{object: a}, in1)
	l.forget("pr")
	if l.take(queueKey{object: a}) != in1 {
		t.Fatal("forget(pr) dropped an intent awaiting its answer")
	}
	l.received(queueKey{object: a}, in1)
	l.streamEnded()
	if l.take(queueKey{object: a}) != nil {
		t.Fatal("a pending intent outlived its stream")
	}
}

// TestRelatedRefusalsAreCounted: a related object refused counts once per
// primary and entry, and stops counting when answered otherwise or when its
// PublishedResource is forgotten.
func TestRelatedRefusalsAreCounted(t *testing.T) {
	a := relKey{primary: ledgerKeyOf("pr", "a", "u-a"), id: "creds"}
	b := relKey{primary: ledgerKeyOf("pr", "b", "u-b"), id: "creds"}
	type step struct {
		k       relKey
		refused bool
	}
	for _, tc := range []struct {
		name        string
		steps       []step
		forget      bool
		wantChanged []bool
		want        int
	}{
		{name: "refused", steps: []step{{a, true}}, wantChanged: []bool{true}, want: 1},
		{name: "refused twice counts once", steps: []step{{a, true}, {a, true}}, wantChanged: []bool{true, false}, want: 1},
		{name: "two primaries", steps: []step{{a, true}, {b, true}}, wantChanged: []bool{true, true}, want: 2},
		{name: "then accepted", steps: []step{{a, true}, {a, false}}, wantChanged: []bool{true, true}, want: 0},
		{name: "accepted, never refused", steps: []step{{a, false}}, wantChanged: []bool{false}, want: 0},
		{name: "PublishedResource forgotten", steps: []step{{a, true}, {b, true}}, forget: true, wantChanged: []bool{true, true}, want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := newLedger()
			for i, s := range tc.steps {
				if got := l.relatedAnswered(s.k, s.refused, "forbidden"); got != tc.wantChanged[i] {
					t.Errorf("step %d: changed %v, want %v", i, got, tc.wantChanged[i])
				}
			}
			if tc.forget {
				l.forget("pr")
			}
			if got := l.refusals("pr").relatedFailing; got != tc.want {
				t.Errorf("related refused %d, want %d", got, tc.want)
			}
			if tc.want == 0 && len(l.refused) != 0 {
				t.Errorf("counts kept for nothing: %v", l.refused)
			}
		})
	}
}

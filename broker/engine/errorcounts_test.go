package engine

import (
	"testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// TestNacksAreCountedOnceAnswered counts only nacks that answer an intent
// in flight: a stale or repeated answer is not another failure.
func TestNacksAreCountedOnceAnswered(t *testing.T) {
	e := testEngine(t)
	detach := e.Attach(&recordingSink{})
	defer detach()
	e.intents.Put(upsert("h1", "5"))
	m, ok := e.NextIntent()
	if !ok {
		t.Fatal("no intent to send")
	}
	in := m.GetIntent()
	nack := func(seq uint64) error {
		return e.Handle(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_IntentResult{IntentResult: &ferryv1.IntentResult{
			Key: in.GetKey(), Version: &ferryv1.ObjectVersion{BrokerEpoch: 1, Sequence: seq},
			Error: &ferryv1.ApplyError{Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_INVALID, Message: "spec.size: must be positive"},
		}}})
	}
	if err := nack(in.GetVersion().GetSequence() + 100); err != nil { // not the one in flight
		t.Fatal(err)
	}
	if got := e.ErrorCounts(); got.Nacks != 0 || got.LastError != "" {
		t.Fatalf("a stale nack was counted: %+v", got)
	}
	for range 2 { // the answer, then the same again
		if err := nack(in.GetVersion().GetSequence()); err != nil {
			t.Fatal(err)
		}
	}
	if got := e.ErrorCounts(); got.Nacks != 1 || got.LastError != "INVALID: spec.size: must be positive" {
		t.Errorf("counts %+v, want one nack with its reason and message", got)
	}
}

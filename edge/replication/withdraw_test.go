package replication

import (
	"testing"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/related"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// TestDeletesFlowWhileWithdrawn: while a PublishedResource is invalid
// (withdrawn), the broker still sends deletes for objects deleted in kcp;
// the edge deletes their copies (and confirms) but applies nothing new, so
// no kcp object stays Terminating because its PublishedResource is broken.
func TestDeletesFlowWhileWithdrawn(t *testing.T) {
	key, remote := remoteThing()
	cp := localCopy(remote)
	e, w, sink := testEngine(t, true, cp)
	acceptApplies(e)
	e.WithdrawPublished("pr")

	other := &ferryv1.ObjectKey{Cluster: "c1", Resource: key.GetResource(), Namespace: "team", Name: "b", Uid: "u-b"}
	e.Handle(upsertOf(other, 2, "h1", thingA))
	e.Handle(&ferryv1.SyncIntent{Key: key, Version: &ferryv1.ObjectVersion{Sequence: 3}, PublishedResource: "pr",
		Operation: &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{}}})
	runQueue(t, e)
	answers := map[string]*ferryv1.IntentResult{}
	for _, m := range sink.msgs {
		answers[m.GetIntentResult().GetKey().GetName()] = m.GetIntentResult()
	}
	if res := answers["a"]; res == nil || res.GetError() != nil {
		t.Fatalf("the delete of a withdrawn resource's object was not carried out: %v", res)
	}
	if deletes(e) != 1 {
		t.Fatalf("want the copy deleted, %d deletes", deletes(e))
	}
	if res := answers["b"]; res.GetError().GetReason() != ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_PUBLISHED || !res.GetError().GetRetryable() {
		t.Fatalf("an upsert of a withdrawn resource: %v, want a retryable NOT_PUBLISHED", res)
	}
	if len(patches(t, e)) != 0 {
		t.Fatal("a withdrawn resource's object was applied")
	}

	// Published again: upserts apply.
	e.SetPublished(w.pub)
	e.Handle(upsertOf(other, 4, "h1", thingA))
	runQueue(t, e)
	if len(patches(t, e)) != 1 {
		t.Fatal("the upsert was not applied after the resource was published again")
	}
}

// TestRelatedUpsertsWaitWhileWithdrawn: a kcp-origin related object is not
// written while its PublishedResource is withdrawn (invalid).
func TestRelatedUpsertsWaitWhileWithdrawn(t *testing.T) {
	key, remote := remoteThing()
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "creds", Origin: ferryv1alpha1.OriginKCP, Kind: "Secret",
		Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "metadata.name"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	e, _, sink := testEngineWith(t, engineSetup{related: []Related{{Reference: refs[0], Local: secretsGVR}}}, localCopy(remote))
	acceptApplies(e)
	e.WithdrawPublished("pr")
	e.Handle(&ferryv1.SyncIntent{Key: &ferryv1.ObjectKey{Cluster: "c1", Namespace: "team", Name: "creds"}, PublishedResource: "pr",
		RelatedTo: &ferryv1.RelatedTo{Primary: key, Identifier: "creds"}, Version: &ferryv1.ObjectVersion{Sequence: 3},
		Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{Object: []byte(`{"data":{"k":"dg=="}}`)}}})
	runQueue(t, e)
	if len(sink.msgs) != 1 || sink.msgs[0].GetIntentResult().GetError().GetReason() != ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_PUBLISHED {
		t.Fatalf("want a NOT_PUBLISHED answer, got %v", sink.msgs)
	}
	if n := len(patches(t, e)); n != 0 {
		t.Fatalf("%d related copies written while withdrawn", n)
	}
}

// TestIntentsPendingAtRemovalAreAnswered: an intent received before its
// PublishedResource was removed is answered (not published, retryable);
// dropping it with the resource's records would leave it in flight in the
// broker's window.
func TestIntentsPendingAtRemovalAreAnswered(t *testing.T) {
	key, _ := remoteThing()
	e, _, sink := testEngine(t, true)
	e.Handle(upsertOf(key, 2, "h1", thingA))
	e.RemovePublished("pr")
	runQueue(t, e)
	if len(sink.msgs) != 1 {
		t.Fatalf("want one answer, got %v", sink.msgs)
	}
	if ae := sink.msgs[0].GetIntentResult().GetError(); ae.GetReason() != ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_PUBLISHED || !ae.GetRetryable() {
		t.Fatalf("answer %v, want a retryable NOT_PUBLISHED", ae)
	}
}

package replication

import (
	"encoding/json"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/mutation"
)

// lastStatusWrite returns the last status the engine applied to the
// PublishedResource: its Synced condition message and status.objects, and
// whether there was one.
func lastStatusWrite(t *testing.T, e *Engine) (message string, objects map[string]any, written bool) {
	t.Helper()
	for _, a := range e.opts.Dynamic.(*dynamicfake.FakeDynamicClient).Actions() {
		p, ok := a.(k8stesting.PatchAction)
		if !ok || a.GetResource().Resource != "publishedresources" {
			continue
		}
		u := &unstructured.Unstructured{}
		if err := json.Unmarshal(p.GetPatch(), &u.Object); err != nil {
			t.Fatal(err)
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		if len(conds) == 1 {
			message, _ = conds[0].(map[string]any)["message"].(string)
		}
		objects, _, _ = unstructured.NestedMap(u.Object, "status", "objects")
		written = true
	}
	return message, objects, written
}

// TestRefusalsAreCountedOnThePublishedResource: a final refusal other than
// a conflict (here a spec mutation that fails on the object) is counted in
// status.objects.failing and named in the Synced condition; a retryable
// one is not; the next success clears it.
func TestRefusalsAreCountedOnThePublishedResource(t *testing.T) {
	muts, err := mutation.Compile("spec.mutation.spec", []ferryv1alpha1.ResourceMutation{{
		CEL: &ferryv1alpha1.CELMutation{Path: "spec.y", Expression: "object.spec.needed + '-suffix'"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	e, _, sink := testEngineWith(t, engineSetup{published: func(p *Published) { p.SpecMutator = muts }})
	acceptApplies(e)
	key, _ := remoteThing()

	steps := []struct {
		name        string
		object      string
		wantFinal   bool
		wantMessage []string
		wantFailing int64
	}{
		{name: "the mutation fails on the object", object: thingA, wantFinal: true,
			wantMessage: []string{"1 object fails to sync", "latest: mutation failed"}, wantFailing: 1},
		{name: "the consumer fixes the object", object: `{"apiVersion":"kcp.example/v1","kind":"Thing","metadata":{"name":"a","namespace":"team"},"spec":{"needed":"n"}}`,
			wantMessage: []string{"the edge watches the local copies"}, wantFailing: 0},
	}
	for i, s := range steps {
		sink.msgs = nil
		e.Handle(upsertOf(key, uint64(i+2), "h"+s.name, s.object))
		runQueue(t, e)
		if len(sink.msgs) != 1 {
			t.Fatalf("%s: want one answer, got %v", s.name, sink.msgs)
		}
		res := sink.msgs[0].GetIntentResult()
		if final := res.GetError() != nil && !res.GetError().GetRetryable(); final != s.wantFinal {
			t.Fatalf("%s: answer %v, want final refusal %v", s.name, res, s.wantFinal)
		}
		msg, objects, _ := lastStatusWrite(t, e)
		for _, w := range s.wantMessage {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: Synced condition %q lacks %q", s.name, msg, w)
			}
		}
		if s.wantFailing == 0 && strings.Contains(msg, "fails to sync") {
			t.Errorf("%s: Synced condition %q still counts a failure", s.name, msg)
		}
		if got, _ := objects["failing"].(float64); int64(got) != s.wantFailing {
			t.Errorf("%s: status.objects.failing = %v, want %d", s.name, objects["failing"], s.wantFailing)
		}
	}
}

func TestRefusalOf(t *testing.T) {
	for _, tc := range []struct {
		err  *ferryv1.ApplyError
		want refusalKind
	}{
		{nil, refusalNone},
		{&ferryv1.ApplyError{Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT}, refusalConflict},
		{&ferryv1.ApplyError{Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT, Retryable: true}, refusalNone},
		{&ferryv1.ApplyError{Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_INVALID}, refusalFailing},
		{&ferryv1.ApplyError{Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN}, refusalFailing},
		{&ferryv1.ApplyError{Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_UNAVAILABLE, Retryable: true}, refusalNone},
		{&ferryv1.ApplyError{Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_PUBLISHED}, refusalNone},
	} {
		if got := refusalOf(tc.err); got != tc.want {
			t.Errorf("refusalOf(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

package engine

import (
	"errors"
	"fmt"
	"testing"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/replicate"
)

// TestPermanent: kcp errors retrying cannot fix are answered once with a
// final error; the others are retried.
func TestPermanent(t *testing.T) {
	gr := schema.GroupResource{Group: "g", Resource: "things"}
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{apierrors.NewNotFound(gr, "a"), true},
		{apierrors.NewInvalid(schema.GroupKind{Group: "g", Kind: "Thing"}, "a", nil), true},
		{apierrors.NewForbidden(gr, "a", errors.New("no")), true},
		{apierrors.NewConflict(gr, "a", errors.New("precondition failed")), false},
		{fmt.Errorf("wrapped: %w", replicate.ErrGone), true},
		{fmt.Errorf("wrapped: %w", replicate.ErrNotDeleting), true},
		{apierrors.NewServiceUnavailable("kcp is down"), false},
		{apierrors.NewTooManyRequests("slow down", 1), false},
		{apierrors.NewTimeoutError("timeout", 1), false},
		{errors.New("connection refused"), false},
	} {
		if got := Permanent(tc.err); got != tc.want {
			t.Errorf("Permanent(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestSupersededReportIsAnsweredAtOnce: only the latest report per object
// and kind is applied; the older one is answered at once so the edge's
// outbox frees its slot, and each report is answered once.
func TestSupersededReportIsAnsweredAtOnce(t *testing.T) {
	var answers []*ferryv1.ReportResult
	w := newReportWorker(nil, func(m *ferryv1.ConnectResponse) { answers = append(answers, m.GetReportResult()) }, logr.Discard())
	key := &ferryv1.ObjectKey{Cluster: "c", Namespace: "ns", Name: "a", Uid: "u"}
	w.add(reportTask{id: 1, key: key, status: &ferryv1.StatusReport{ReportId: 1}})
	w.add(reportTask{id: 2, key: key, status: &ferryv1.StatusReport{ReportId: 2}})
	w.add(reportTask{id: 2, key: key, status: &ferryv1.StatusReport{ReportId: 2}}) // re-sent after a reconnect
	w.add(reportTask{id: 3, key: key, deletion: true})                             // another kind: not superseding
	if len(answers) != 1 || answers[0].GetReportId() != 1 || answers[0].GetError() != nil {
		t.Fatalf("want report 1 answered (no error) and nothing else, got %v", answers)
	}
	if n := w.queue.Len(); n != 2 {
		t.Fatalf("want 2 keys queued (status, deletion), got %d", n)
	}
}

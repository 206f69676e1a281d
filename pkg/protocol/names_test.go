package protocol

import (
	"testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

func TestReasonName(t *testing.T) {
	for r, want := range map[ferryv1.ApplyErrorReason]string{
		ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_READY:   "not_ready",
		ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_REJECTED:    "rejected",
		ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_UNSPECIFIED: "unspecified",
		ferryv1.ApplyErrorReason(99):                            "99",
	} {
		if got := ReasonName(r); got != want {
			t.Errorf("ReasonName(%v) = %q, want %q", r, got, want)
		}
	}
}

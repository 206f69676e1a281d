package replication

import (
	"errors"
	"net/http"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// retryable tells whether applying again may succeed without a change of
// the object or the PublishedResource: not for invalid objects and
// refusals (validation, admission, RBAC), which would only repeat the same
// error (and the same Event) forever.
func retryable(err error) bool {
	return !apierrors.IsInvalid(err) && !apierrors.IsBadRequest(err) && !apierrors.IsForbidden(err) &&
		!apierrors.IsRequestEntityTooLargeError(err) && !schemaMismatch(err)
}

func classify(err error) ferryv1.ApplyErrorReason {
	switch {
	case apierrors.IsInvalid(err), apierrors.IsBadRequest(err), apierrors.IsForbidden(err), apierrors.IsNotFound(err), schemaMismatch(err):
		return ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_REJECTED
	case apierrors.IsConflict(err), apierrors.IsAlreadyExists(err):
		return ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT
	default:
		return ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_UNAVAILABLE
	}
}

// typedPatchFailed starts the API server's message for a server-side apply
// whose object does not fit the resource's schema (a field it does not
// declare, a value of the wrong type, a list item without its key).
const typedPatchFailed = "failed to create typed patch object"

// schemaMismatch tells whether err is the API server refusing an applied
// object for its schema with a plain 500 and no reason, as it does today
// (kubernetes/kubernetes#122480, #139253): the same object fails the same
// way every time, so it is a rejection, not an outage. Once the API server
// answers 400 for it, IsBadRequest covers it.
func schemaMismatch(err error) bool {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return false
	}
	s := st.Status()
	return s.Code == http.StatusInternalServerError && strings.HasPrefix(s.Message, typedPatchFailed)
}

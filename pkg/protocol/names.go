package protocol

import (
	"strings"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// ReasonName is an ApplyErrorReason as people read it, in messages and
// metric labels: APPLY_ERROR_REASON_NOT_READY is "not_ready".
func ReasonName(r ferryv1.ApplyErrorReason) string {
	s := strings.ToLower(strings.TrimPrefix(r.String(), "APPLY_ERROR_REASON_"))
	if s == "" {
		return "unspecified"
	}
	return s
}

// SplitResource reads an admin request's resource: "plural.group" when
// group is empty, else the plural of group (the form kubectl accepts).
func SplitResource(group, resource string) (string, string) {
	resource = strings.TrimSpace(resource)
	if group == "" {
		if plural, g, ok := strings.Cut(resource, "."); ok {
			return g, plural
		}
	}
	return group, resource
}

// OperationName names an intent's operation as logs and the admin API show
// it: delete, related (an upsert of a related object) or upsert.
func OperationName(in *ferryv1.SyncIntent) string {
	switch {
	case in.GetDelete() != nil:
		return "delete"
	case in.GetRelatedTo() != nil:
		return "related"
	default:
		return "upsert"
	}
}

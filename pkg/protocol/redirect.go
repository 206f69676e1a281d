package protocol

import (
	"fmt"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Sending an edge to the broker replica that owns its APIExport.
//
// With several broker replicas, one owns each APIExport (broker/ownership).
// A replica that does not own an edge's export refuses its stream with
// UNAVAILABLE and a google.rpc.ErrorInfo naming the owner's address; the
// edge connects there next, once, and goes back to its configured address
// after that stream (or that attempt) ends. An edge that does not know the
// detail just retries its configured address, which reaches the owner in
// time through the Service's load balancing. The detail is a standard one,
// so grpcurl shows it as it is.

// Redirect error detail: its reason, domain and the metadata key of the
// owner's address.
const (
	RedirectReason    = "APIEXPORT_OWNED_ELSEWHERE"
	RedirectDomain    = "ferry.dev"
	RedirectOwnerKey  = "owner"
	redirectExportKey = "apiExport"
)

// RedirectError is the status refusing a stream whose APIExport another
// replica, at owner, serves.
func RedirectError(export, owner string) error {
	st := status.New(codes.Unavailable, fmt.Sprintf("APIExport %s is served by the broker replica at %s; connect there", export, owner))
	withInfo, err := st.WithDetails(&errdetails.ErrorInfo{Reason: RedirectReason, Domain: RedirectDomain,
		Metadata: map[string]string{RedirectOwnerKey: owner, redirectExportKey: export}})
	if err != nil {
		return st.Err() // the message still names the owner
	}
	return withInfo.Err()
}

// RedirectOf returns the owner's address when err is a RedirectError.
func RedirectOf(err error) (owner string, ok bool) {
	st, isStatus := status.FromError(err)
	if !isStatus || st.Code() != codes.Unavailable {
		return "", false
	}
	for _, d := range st.Details() {
		if info, isInfo := d.(*errdetails.ErrorInfo); isInfo && info.GetReason() == RedirectReason && info.GetDomain() == RedirectDomain {
			if owner := info.GetMetadata()[RedirectOwnerKey]; owner != "" {
				return owner, true
			}
		}
	}
	return "", false
}

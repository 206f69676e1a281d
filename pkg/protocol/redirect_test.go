package protocol

import (
	"errors"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestRedirectRoundTrip(t *testing.T) {
	err := RedirectError("root:org/databases.example.com", "broker-1.broker-pods:8443")
	if status.Code(err) != codes.Unavailable {
		t.Errorf("code %s, want Unavailable (an edge that does not know the detail retries)", status.Code(err))
	}
	// Through the wire: the status proto with its details.
	wire := status.FromProto(status.Convert(err).Proto()).Err()
	if owner, ok := RedirectOf(wire); !ok || owner != "broker-1.broker-pods:8443" {
		t.Errorf("RedirectOf = %q, %t", owner, ok)
	}
	for _, other := range []error{nil, errors.New("plain"), status.Error(codes.Unavailable, "kcp down"),
		status.Error(codes.FailedPrecondition, "APIExport x is served by the broker replica at y")} {
		if owner, ok := RedirectOf(other); ok {
			t.Errorf("RedirectOf(%v) = %q", other, owner)
		}
	}
}

package server

import (
	"context"
	"errors"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/registry"
	"github.com/ferry-dev/ferry/broker/revocation"
)

// Revoke keeps the block in kcp, then ends every stream it matches with
// UNAUTHENTICATED and the reason. The block is in the set before the
// streams are looked up, so a stream accepted meanwhile is refused by its
// own check after registering (syncService.Connect): none slips through.
func (a *adminService) Revoke(ctx context.Context, req *ferryv1.RevokeRequest) (*ferryv1.RevokeResponse, error) {
	if err := a.authorize(ctx); err != nil {
		return nil, err
	}
	admin, _, _ := identityFrom(ctx)
	b, err := a.revocations.Revoke(ctx, req.GetIdentity(), req.GetCertificateSha256(), req.GetReason())
	var invalid *revocation.InvalidError
	switch {
	case errors.As(err, &invalid):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case err != nil:
		// Not applied: a block that is not kept would vanish at restart.
		return nil, status.Errorf(codes.Unavailable, "the revocation was not applied: %v", err)
	}
	closed := a.registry.End(func(s *registry.Session) bool {
		return b.Matches(s.Identity, s.CertificateSHA256)
	}, status.Error(codes.Unauthenticated, b.Message()))
	a.log.Info("revoked by an admin", "admin", admin, "identity", b.Identity, "certificateSHA256", b.CertificateSHA256,
		"reason", b.Reason, "closedStreams", closed)
	return &ferryv1.RevokeResponse{ClosedStreams: int32(closed)}, nil
}

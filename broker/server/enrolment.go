package server

import (
	"context"
	"errors"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/enrolment"
	"github.com/ferry-dev/ferry/pkg/logging"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// EnrolmentOptions configure how the broker issues edge certificates. With
// no Signer, enrolment and renewal are off.
type EnrolmentOptions struct {
	// Signer issues edge client certificates (--edge-signing-cert/-key).
	Signer *enrolment.Signer
	// Tokens holds the enrolment tokens; required with Signer.
	Tokens *enrolment.TokenStore
	// BrokerCA is the bundle handed to edges (--broker-ca); required with
	// Signer. Read again on every use.
	BrokerCA enrolment.BrokerCAFiles
	// Blocklist is consulted before every signature; nil blocks nothing.
	Blocklist enrolment.Blocklist
	// DefaultTokenTTL is the lifetime of a token created without one;
	// zero is enrolment.DefaultTokenTTL.
	DefaultTokenTTL time.Duration
}

// errEnrolmentOff is the refusal of every enrolment call of a broker
// without a signing CA.
var errEnrolmentOff = status.Error(codes.FailedPrecondition,
	"this broker issues no edge certificates: start it with --edge-signing-cert and --edge-signing-key (a CA under --client-ca)")

// enrolmentService implements ferry.v1alpha1.EnrolmentService (served
// without a client certificate) and the certificate work of the admin
// service and the sync stream.
type enrolmentService struct {
	ferryv1.UnimplementedEnrolmentServiceServer

	opts EnrolmentOptions
	log  logr.Logger
}

var _ ferryv1.EnrolmentServiceServer = (*enrolmentService)(nil)

// on tells whether the broker issues certificates.
func (e *enrolmentService) on() bool { return e != nil && e.opts.Signer != nil }

func (e *enrolmentService) GetBrokerCA(context.Context, *ferryv1.GetBrokerCARequest) (*ferryv1.GetBrokerCAResponse, error) {
	if !e.on() {
		return nil, errEnrolmentOff
	}
	ca, err := e.opts.BrokerCA.Load()
	if err != nil {
		e.log.Error(err, "cannot read the broker CA bundle")
		return nil, status.Error(codes.Unavailable, "the broker cannot read its CA bundle (logged)")
	}
	return &ferryv1.GetBrokerCAResponse{BrokerCaBundlePem: ca.BundlePEM}, nil
}

func (e *enrolmentService) Enrol(ctx context.Context, req *ferryv1.EnrolRequest) (*ferryv1.EnrolResponse, error) {
	if !e.on() {
		return nil, errEnrolmentOff
	}
	if req.GetToken() == "" || len(req.GetCertificateSigningRequestDer()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "Enrol needs token and certificate_signing_request_der")
	}
	ca, err := e.opts.BrokerCA.Load()
	if err != nil {
		e.log.Error(err, "cannot read the broker CA bundle")
		return nil, status.Error(codes.Unavailable, "the broker cannot read its CA bundle (logged)")
	}
	if _, err := enrolment.CheckRequest(req.GetCertificateSigningRequestDer()); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	identity, err := e.opts.Tokens.Redeem(ctx, req.GetToken())
	if err != nil {
		var expired *enrolment.TokenExpiredError
		switch {
		case errors.Is(err, enrolment.ErrTokenUnknown), errors.Is(err, enrolment.ErrTokenUsed),
			errors.Is(err, enrolment.ErrTokenFormat), errors.As(err, &expired):
			e.log.Info("enrolment refused", logging.KeyReason, err.Error())
			return nil, status.Error(codes.Unauthenticated, err.Error())
		}
		e.log.Error(err, "enrolment failed")
		return nil, status.Errorf(codes.Unavailable, "cannot check the enrolment token: %v", err)
	}
	log := e.log.WithValues(logging.KeyIdentity, identity)
	issued, err := e.sign(req.GetCertificateSigningRequestDer(), identity, "")
	if err != nil {
		log.Info("enrolment refused after the token was consumed", logging.KeyReason, err.Error())
		return nil, err
	}
	log.Info("edge enrolled", "fingerprint", fingerprintOf(issued), "notAfter", issued.Leaf.NotAfter)
	return &ferryv1.EnrolResponse{
		CertificateChainPem: issued.ChainPEM,
		BrokerCaBundlePem:   ca.BundlePEM,
		Identity:            identity,
		NotAfter:            timestamppb.New(issued.Leaf.NotAfter),
	}, nil
}

// sign checks the blocklist and signs; errors are gRPC statuses.
func (e *enrolmentService) sign(csr []byte, identity, fingerprint string) (*enrolment.Issued, error) {
	if err := enrolment.CheckBlocked(e.opts.Blocklist, identity, fingerprint); err != nil {
		return nil, status.Error(codes.PermissionDenied, err.Error())
	}
	issued, err := e.opts.Signer.Sign(csr, identity)
	var invalid *enrolment.InvalidRequestError
	switch {
	case errors.As(err, &invalid):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case err != nil:
		e.log.Error(err, "cannot sign an edge certificate")
		return nil, status.Error(codes.Internal, "cannot sign the certificate (logged)")
	}
	return issued, nil
}

// renew answers a CertificateRenewal on the stream of identity, whose
// current certificate has fingerprint. A refusal is an answer too: the
// stream goes on with the current certificate.
func (e *enrolmentService) renew(r *ferryv1.CertificateRenewal, identity, fingerprint string, log logr.Logger) *ferryv1.ConnectResponse {
	answer := func(ic *ferryv1.IssuedCertificate) *ferryv1.ConnectResponse {
		return &ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_IssuedCertificate{IssuedCertificate: ic}}
	}
	if !e.on() {
		return answer(&ferryv1.IssuedCertificate{ErrorMessage: status.Convert(errEnrolmentOff).Message()})
	}
	ca, err := e.opts.BrokerCA.Load()
	if err != nil {
		log.Error(err, "cannot read the broker CA bundle for a renewal")
		return answer(&ferryv1.IssuedCertificate{ErrorMessage: "the broker cannot read its CA bundle (logged)"})
	}
	issued, err := e.sign(r.GetCertificateSigningRequestDer(), identity, fingerprint)
	if err != nil {
		log.Info("certificate renewal refused", logging.KeyReason, err.Error())
		return answer(&ferryv1.IssuedCertificate{ErrorMessage: status.Convert(err).Message()})
	}
	log.Info("edge certificate renewed", "fingerprint", fingerprintOf(issued), "notAfter", issued.Leaf.NotAfter)
	return answer(&ferryv1.IssuedCertificate{
		CertificateChainPem: issued.ChainPEM,
		BrokerCaBundlePem:   ca.BundlePEM,
		NotAfter:            timestamppb.New(issued.Leaf.NotAfter),
	})
}

// createToken implements AdminService.CreateEnrolmentToken.
func (e *enrolmentService) createToken(ctx context.Context, req *ferryv1.CreateEnrolmentTokenRequest) (*ferryv1.CreateEnrolmentTokenResponse, error) {
	if !e.on() {
		return nil, errEnrolmentOff
	}
	ttl := e.opts.DefaultTokenTTL
	if req.GetTtl() != nil {
		ttl = req.GetTtl().AsDuration()
		if ttl <= 0 {
			return nil, status.Errorf(codes.InvalidArgument, "ttl %s is not positive", ttl)
		}
	}
	if _, err := enrolment.ValidateTTL(ttl); err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	ca, err := e.opts.BrokerCA.Load()
	if err != nil {
		e.log.Error(err, "cannot read the broker CA bundle")
		return nil, status.Error(codes.Unavailable, "the broker cannot read its CA bundle (logged)")
	}
	tok, err := e.opts.Tokens.Create(ctx, req.GetIdentity(), ttl)
	if err != nil {
		if errors.Is(err, enrolment.ErrNotConfigured) {
			return nil, status.Error(codes.InvalidArgument, err.Error())
		}
		return nil, status.Errorf(codes.Unavailable, "cannot store the token: %v", err)
	}
	e.log.Info("enrolment token created", logging.KeyIdentity, req.GetIdentity(), "secret", tok.Secret, "workspace", tok.Workspace, "expires", tok.Expires)
	return &ferryv1.CreateEnrolmentTokenResponse{Token: tok.Value, ExpiresAt: timestamppb.New(tok.Expires), BrokerCaFingerprint: ca.Fingerprint}, nil
}

func (a *adminService) CreateEnrolmentToken(ctx context.Context, req *ferryv1.CreateEnrolmentTokenRequest) (*ferryv1.CreateEnrolmentTokenResponse, error) {
	if err := a.authorize(ctx); err != nil {
		return nil, err
	}
	return a.enrolment.createToken(ctx, req)
}

func fingerprintOf(issued *enrolment.Issued) string {
	return tlsconfig.Fingerprint(issued.Leaf)
}

package server

import (
	"context"
	"crypto/x509"
	"errors"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// identityFrom returns the identity of the verified client certificate of the
// call in ctx. The TLS configuration guarantees a verified chain for every
// connection; the checks here keep a misconfiguration from authorizing
// anyone.
func identityFrom(ctx context.Context) (id, addr string, err error) {
	c, err := callerFrom(ctx)
	return c.identity, c.addr, err
}

// caller is who made a call: the identity and certificate fingerprint of
// its verified client certificate, and its address.
type caller struct {
	identity, fingerprint, addr string
	// cert is the verified client certificate.
	cert *x509.Certificate
}

// callerFrom is identityFrom with the certificate's fingerprint (a revoked
// certificate is refused by it).
func callerFrom(ctx context.Context) (caller, error) {
	cert, addr, err := clientCertificate(ctx)
	if err != nil {
		return caller{addr: addr}, err
	}
	id, err := tlsconfig.Identity(cert)
	return caller{identity: id, fingerprint: tlsconfig.Fingerprint(cert), addr: addr, cert: cert}, err
}

func clientCertificate(ctx context.Context) (*x509.Certificate, string, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, "", errors.New("no peer information")
	}
	tlsInfo, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil, p.Addr.String(), errors.New("connection is not TLS")
	}
	chains := tlsInfo.State.VerifiedChains
	if len(chains) == 0 || len(chains[0]) == 0 {
		return nil, p.Addr.String(), errors.New("no verified client certificate")
	}
	return chains[0][0], p.Addr.String(), nil
}

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
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", "", errors.New("no peer information")
	}
	tlsInfo, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return "", p.Addr.String(), errors.New("connection is not TLS")
	}
	chains := tlsInfo.State.VerifiedChains
	if len(chains) == 0 || len(chains[0]) == 0 {
		return "", p.Addr.String(), errors.New("no verified client certificate")
	}
	id, err = tlsconfig.Identity(chains[0][0])
	return id, p.Addr.String(), err
}

// clientLeaf returns the verified client certificate of the call in ctx, or
// nil.
func clientLeaf(ctx context.Context) *x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	tlsInfo, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil
	}
	chains := tlsInfo.State.VerifiedChains
	if len(chains) == 0 || len(chains[0]) == 0 {
		return nil
	}
	return chains[0][0]
}

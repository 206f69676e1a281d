package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"sync/atomic"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/credentials"

	"github.com/ferry-dev/ferry/pkg/logging"
)

// Files names the PEM files of one side of the connection.
type Files struct {
	// CertFile is the side's own certificate (chain), PEM.
	CertFile string
	// KeyFile is the private key of CertFile, PEM.
	KeyFile string
	// CAFile is the bundle that verifies the peer: client CAs on the broker,
	// the broker's CA on the edge.
	CAFile string
}

// Server returns the broker's TLS configuration: versions and suites from
// the profile (default TLS 1.3 only); a client certificate, when given, must
// be signed by CAFile. A connection without one is let through so an edge
// holding only an enrolment token can enrol; the broker's interceptors
// refuse every other call without a verified client certificate. Certificate, key and CA bundle are reloaded when their files
// change. A client hello that cannot meet the profile is logged with the
// mismatch, once per handshake, and refused by crypto/tls with the alert
// the protocol defines (protocol_version, handshake_failure), which the
// edge reports.
func Server(f Files, p Profile, log logr.Logger) (*tls.Config, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	keyPair, err := newReloading(parseKeyPair, f.CertFile, f.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("server certificate: %w", err)
	}
	clientCAs, err := newReloading(parseCAPool, f.CAFile)
	if err != nil {
		return nil, fmt.Errorf("client CA: %w", err)
	}
	base := &tls.Config{
		ClientAuth: tls.VerifyClientCertIfGiven,
		NextProtos: []string{"h2"},
	}
	p.Apply(base)
	outer := &tls.Config{
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			if why := p.Mismatch(hello); why != "" {
				log.Info("refusing TLS handshake: the client's TLS versions or cipher suites do not meet this broker's profile", logging.KeyReason, why)
			}
			cert, err := keyPair.get()
			if err != nil {
				return nil, err
			}
			pool, err := clientCAs.get()
			if err != nil {
				return nil, err
			}
			c := base.Clone()
			c.Certificates = []tls.Certificate{*cert}
			c.ClientCAs = pool
			return c, nil
		},
	}
	p.Apply(outer)
	return outer, nil
}

// ClientConfig is the edge's TLS configuration, kept in step with its files:
// the CA bundle that verifies the broker and the client certificate are read
// again when they change, so rotating either needs no restart.
type ClientConfig struct {
	// keyPair and roots are the credential source: files re-read when they
	// change (Client), or credentials held in memory and swapped on renewal
	// (NewMemoryClient).
	keyPair    func() (*tls.Certificate, error)
	roots      func() (*x509.CertPool, error)
	serverName string
	profile    Profile
	memory     *atomic.Pointer[Credentials]
}

// Client reads the edge's files: versions and suites from the profile
// (default TLS 1.3 only), the broker is verified against CAFile (for
// serverName when not empty, else the dialled host), and the edge presents
// CertFile. It fails when a file is missing or invalid, naming it.
func Client(f Files, serverName string, p Profile) (*ClientConfig, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	keyPair, err := newReloading(parseKeyPair, f.CertFile, f.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("client certificate: %w", err)
	}
	roots, err := newReloading(parseCAPool, f.CAFile)
	if err != nil {
		return nil, fmt.Errorf("broker CA: %w", err)
	}
	if _, err := Identity(keyPair.value.Leaf); err != nil {
		return nil, fmt.Errorf("client certificate %s: %w", f.CertFile, err)
	}
	return &ClientConfig{keyPair: keyPair.get, roots: roots.get, serverName: serverName, profile: p}, nil
}

// Config returns the configuration of one connection: it trusts the CA bundle
// as it is on disk now, and presents the client certificate as it is on disk
// at the handshake. Call it for every dial. A rotation that leaves a file
// unreadable or invalid keeps the last good bundle or certificate.
func (c *ClientConfig) Config() (*tls.Config, error) {
	pool, err := c.roots()
	if err != nil {
		return nil, fmt.Errorf("broker CA: %w", err)
	}
	cfg := &tls.Config{
		RootCAs:    pool,
		ServerName: c.serverName,
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return c.keyPair()
		},
	}
	c.profile.Apply(cfg)
	return cfg, nil
}

// TransportCredentials are Config as gRPC transport credentials whose
// failed handshakes are HandshakeErrors naming the edge's profile.
func (c *ClientConfig) TransportCredentials() (credentials.TransportCredentials, error) {
	cfg, err := c.Config()
	if err != nil {
		return nil, err
	}
	return profiledCredentials{TransportCredentials: credentials.NewTLS(cfg), profile: c.profile}, nil
}

// Profile is the edge's TLS profile, for its start-up log.
func (c *ClientConfig) Profile() Profile { return c.profile }

// Identity is the identity a certificate carries: its first URI SAN, or the
// subject common name when it has no URI SAN.
func Identity(cert *x509.Certificate) (string, error) {
	if cert == nil {
		return "", errors.New("no certificate")
	}
	if len(cert.URIs) > 0 {
		return cert.URIs[0].String(), nil
	}
	if cert.Subject.CommonName != "" {
		return cert.Subject.CommonName, nil
	}
	return "", errors.New("certificate has neither a URI SAN nor a subject common name")
}

// Package enrol is the edge's side of enrolment and certificate renewal:
// it obtains the edge's first client certificate from a one-time token and
// the broker's pinned CA fingerprint (Enrol), keeps the credentials in a
// Secret of the service cluster (SecretStore), and renews the certificate
// over the stream before two thirds of its lifetime (Renewer). The private
// key is generated here and never leaves the service cluster.
package enrol

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// DialFunc opens the edge's connection to addr (host:port): directly, or
// through a proxy.
type DialFunc func(ctx context.Context, addr string) (net.Conn, error)

// Options configure Enrol.
type Options struct {
	// BrokerAddress is host:port of the broker. Required.
	BrokerAddress string
	// ServerName is the name the broker's certificate must carry; empty:
	// the host of BrokerAddress.
	ServerName string
	// Token is the one-time enrolment token. Required.
	Token string
	// Fingerprint pins the broker's CA (tlsconfig.ParseFingerprint form).
	// Required.
	Fingerprint string
	// Dial opens connections; nil dials directly.
	Dial DialFunc
	// Profile is the edge's TLS profile (--tls-min-version,
	// --tls-cipher-suites); the zero value is TLS 1.3 only.
	Profile tlsconfig.Profile
	// Timeout bounds each call; zero is 30 s.
	Timeout time.Duration
}

// PermanentError is an enrolment failure that trying again cannot fix: the
// broker refused the token, or it is not the broker the fingerprint pins.
type PermanentError struct{ Err error }

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// permanent wraps err unless the status code says "try again".
func permanent(err error) error {
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded, codes.ResourceExhausted, codes.Aborted, codes.Canceled:
		return err
	}
	return &PermanentError{Err: err}
}

// Enrol obtains the edge's credentials. It first fetches the broker's CA
// bundle over a connection it does not trust yet, checks that the bundle
// holds the pinned CA and that it verifies the certificate that connection
// presented (for the broker's name); only then does it send the token and
// a CSR, over a connection verified against that bundle.
func Enrol(ctx context.Context, o Options) (*tlsconfig.Credentials, error) {
	pinned, err := tlsconfig.ParseFingerprint(o.Fingerprint)
	if err != nil {
		return nil, &PermanentError{Err: err}
	}
	serverName := o.ServerName
	if serverName == "" {
		host, _, err := net.SplitHostPort(o.BrokerAddress)
		if err != nil {
			return nil, fmt.Errorf("broker address %q: %w", o.BrokerAddress, err)
		}
		serverName = host
	}
	timeout := o.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	bundle, roots, err := fetchBrokerCA(ctx, o, serverName, pinned, timeout)
	if err != nil {
		return nil, err
	}

	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("cannot generate the edge's key: %w", err)
	}
	csr, err := NewCSR(key)
	if err != nil {
		return nil, err
	}
	conn, err := dial(o, &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: serverName})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	callCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := ferryv1.NewEnrolmentServiceClient(conn).Enrol(callCtx, &ferryv1.EnrolRequest{Token: o.Token, CertificateSigningRequestDer: csr})
	if err != nil {
		st := status.Convert(err)
		wrapped := fmt.Errorf("the broker at %s refused the enrolment (%s): %s", o.BrokerAddress, st.Code(), st.Message())
		if _, isPermanent := permanent(err).(*PermanentError); isPermanent {
			return nil, &PermanentError{Err: wrapped}
		}
		return nil, wrapped
	}
	caBundle := resp.GetBrokerCaBundlePem()
	if len(caBundle) == 0 {
		caBundle = bundle
	}
	creds, err := Credentials(key, resp.GetCertificateChainPem(), caBundle, time.Now())
	if err != nil {
		return nil, &PermanentError{Err: fmt.Errorf("the broker's enrolment answer is unusable: %w", err)}
	}
	return creds, nil
}

// fetchBrokerCA asks for the broker's CA bundle and checks it against the
// pinned fingerprint and the connection's own certificate.
func fetchBrokerCA(ctx context.Context, o Options, serverName, pinned string, timeout time.Duration) ([]byte, *x509.CertPool, error) {
	var peer []*x509.Certificate
	conn, err := dial(o, &tls.Config{
		MinVersion: tls.VersionTLS13,
		// Not trusted yet: the bundle this connection delivers is checked
		// below, and so is the certificate it presented.
		InsecureSkipVerify: true, //nolint:gosec // verified against the pinned bundle before anything secret is sent
		VerifyConnection: func(cs tls.ConnectionState) error {
			peer = cs.PeerCertificates
			return nil
		},
	})
	if err != nil {
		return nil, nil, err
	}
	defer conn.Close()
	callCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	resp, err := ferryv1.NewEnrolmentServiceClient(conn).GetBrokerCA(callCtx, &ferryv1.GetBrokerCARequest{})
	if err != nil {
		st := status.Convert(err)
		wrapped := fmt.Errorf("cannot get the broker's CA bundle from %s (%s): %s", o.BrokerAddress, st.Code(), st.Message())
		if _, isPermanent := permanent(err).(*PermanentError); isPermanent {
			return nil, nil, &PermanentError{Err: wrapped}
		}
		return nil, nil, wrapped
	}
	bundle := resp.GetBrokerCaBundlePem()
	certs, err := tlsconfig.ParseCertificates(bundle)
	if err != nil {
		return nil, nil, &PermanentError{Err: fmt.Errorf("the broker's CA bundle: %w", err)}
	}
	var found bool
	var seen []string
	roots := x509.NewCertPool()
	for _, c := range certs {
		fp := tlsconfig.Fingerprint(c)
		seen = append(seen, fp)
		found = found || fp == pinned
		roots.AddCert(c)
	}
	if !found {
		return nil, nil, &PermanentError{Err: fmt.Errorf("the broker's CA bundle holds no certificate with the pinned fingerprint %s (--broker-ca-fingerprint); it holds %s", pinned, strings.Join(seen, ", "))}
	}
	if len(peer) == 0 {
		return nil, nil, errors.New("the broker presented no certificate")
	}
	inters := x509.NewCertPool()
	for _, c := range peer[1:] {
		inters.AddCert(c)
	}
	if _, err := peer[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inters, DNSName: serverName, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return nil, nil, &PermanentError{Err: fmt.Errorf("the broker's certificate does not verify against its CA bundle for %q: %w", serverName, err)}
	}
	return bundle, roots, nil
}

func dial(o Options, cfg *tls.Config) (*grpc.ClientConn, error) {
	o.Profile.Apply(cfg)
	d := o.Dial
	if d == nil {
		var nd net.Dialer
		d = func(ctx context.Context, addr string) (net.Conn, error) { return nd.DialContext(ctx, "tcp", addr) }
	}
	// passthrough: the dial function resolves the name (a proxy may be
	// the only one that can), not gRPC.
	conn, err := grpc.NewClient("passthrough:///"+o.BrokerAddress,
		grpc.WithTransportCredentials(credentials.NewTLS(cfg)),
		grpc.WithContextDialer(d),
		grpc.WithNoProxy(),
	)
	if err != nil {
		return nil, fmt.Errorf("invalid broker address %q: %w", o.BrokerAddress, err)
	}
	return conn, nil
}

// NewCSR returns a PKCS#10 request (DER) signed by key. It names nothing:
// the broker puts the identity of the token (or the stream) in the
// certificate.
func NewCSR(key crypto.Signer) ([]byte, error) {
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	if err != nil {
		return nil, fmt.Errorf("cannot create the certificate signing request: %w", err)
	}
	return der, nil
}

// Credentials assembles credentials from a key and the broker's answer.
func Credentials(key *ecdsa.PrivateKey, chainPEM, caBundlePEM []byte, now time.Time) (*tlsconfig.Credentials, error) {
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("cannot encode the key: %w", err)
	}
	return tlsconfig.ParseCredentials(chainPEM, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), caBundlePEM, now)
}

// Package enrolment holds the broker's side of edge enrolment and
// certificate renewal: the Signer that issues edge client certificates from
// the broker's signing CA, and the TokenStore of one-time enrolment tokens
// kept (hashed) in kcp.
package enrolment

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/url"
	"os"
	"time"

	"k8s.io/utils/clock"

	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

const (
	// DefaultCertificateLifetime is how long an issued edge certificate is
	// valid unless --edge-certificate-lifetime says otherwise.
	DefaultCertificateLifetime = 24 * time.Hour
	// MinCertificateLifetime keeps renewals (at two thirds of the lifetime)
	// from running back to back.
	MinCertificateLifetime = time.Minute
	// backdate tolerates clocks of edges that run a little behind.
	backdate = 5 * time.Minute
)

// Blocklist tells whether an identity, or one certificate of it (by
// tlsconfig.Fingerprint), is blocked; reason says why. Consulted before
// every signature. Implementations must be safe for concurrent use.
type Blocklist interface {
	Blocked(identity, fingerprint string) (reason string, blocked bool)
}

// BlockedError refuses a signature for a blocked identity or certificate.
type BlockedError struct{ Reason string }

func (e *BlockedError) Error() string { return "blocked: " + e.Reason }

// InvalidRequestError is a CSR the signer cannot accept.
type InvalidRequestError struct{ Err error }

func (e *InvalidRequestError) Error() string {
	return "invalid certificate signing request: " + e.Err.Error()
}
func (e *InvalidRequestError) Unwrap() error { return e.Err }

// Signer issues edge client certificates from the broker's signing CA.
type Signer struct {
	ca       *x509.Certificate
	key      crypto.Signer
	lifetime time.Duration
	clock    clock.PassiveClock
}

// NewSigner checks the signing CA: its certificate must be a CA allowed to
// sign certificates, the key must be its key, and it must verify against
// clientCAs (the bundle the broker verifies client certificates with), or
// the certificates it issues would be refused by the broker itself.
func NewSigner(ca *x509.Certificate, key crypto.Signer, clientCAs *x509.CertPool, lifetime time.Duration, clk clock.PassiveClock) (*Signer, error) {
	if !ca.BasicConstraintsValid || !ca.IsCA {
		return nil, fmt.Errorf("certificate %q is not a CA certificate (basic constraints CA:TRUE missing)", ca.Subject)
	}
	if ca.KeyUsage != 0 && ca.KeyUsage&x509.KeyUsageCertSign == 0 {
		return nil, fmt.Errorf("CA certificate %q may not sign certificates (key usage keyCertSign missing)", ca.Subject)
	}
	pub, ok := key.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(ca.PublicKey) {
		return nil, fmt.Errorf("the key does not belong to CA certificate %q", ca.Subject)
	}
	if _, err := ca.Verify(x509.VerifyOptions{Roots: clientCAs, CurrentTime: clk.Now(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}}); err != nil {
		return nil, fmt.Errorf("CA certificate %q does not verify against the client CA bundle (--client-ca), so the broker would refuse the certificates it signs: %w", ca.Subject, err)
	}
	if lifetime < MinCertificateLifetime {
		return nil, fmt.Errorf("certificate lifetime %s is below the minimum %s", lifetime, MinCertificateLifetime)
	}
	return &Signer{ca: ca, key: key, lifetime: lifetime, clock: clk}, nil
}

// LoadSigner reads the signing CA's PEM files and the client CA bundle
// and checks them (NewSigner); errors name the files.
func LoadSigner(certFile, keyFile, clientCAFile string, lifetime time.Duration, clk clock.PassiveClock) (*Signer, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("signing CA %s / %s: %w", certFile, keyFile, err)
	}
	ca, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("signing CA %s: %w", certFile, err)
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("signing CA key %s cannot sign", keyFile)
	}
	bundle, err := os.ReadFile(clientCAFile)
	if err != nil {
		return nil, fmt.Errorf("client CA bundle: %w", err)
	}
	pool, err := tlsconfig.ParseBundle(bundle)
	if err != nil {
		return nil, fmt.Errorf("client CA bundle %s: %w", clientCAFile, err)
	}
	s, err := NewSigner(ca, key, pool, lifetime, clk)
	if err != nil {
		return nil, fmt.Errorf("signing CA %s: %w", certFile, err)
	}
	return s, nil
}

// Issued is a signed edge certificate.
type Issued struct {
	// ChainPEM is the certificate, then the signing CA when it is an
	// intermediate (a self-signed root is left to the bundle).
	ChainPEM []byte
	// Leaf is the certificate.
	Leaf *x509.Certificate
}

// Sign issues a client certificate for identity to the key of csrDER (a
// PKCS#10 request, DER). The request's subject and SANs are ignored; only
// its key and signature are used.
func (s *Signer) Sign(csrDER []byte, identity string) (*Issued, error) {
	csr, err := CheckRequest(csrDER)
	if err != nil {
		return nil, err
	}
	if identity == "" {
		return nil, errors.New("no identity to sign for")
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		return nil, fmt.Errorf("serial number: %w", err)
	}
	now := s.clock.Now()
	notAfter := now.Add(s.lifetime)
	if notAfter.After(s.ca.NotAfter) {
		notAfter = s.ca.NotAfter
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		NotBefore:    now.Add(-backdate),
		NotAfter:     notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	// The identity is read back the way tlsconfig.Identity reads it: the
	// URI SAN when there is one, else the common name.
	if u, err := url.Parse(identity); err == nil && u.IsAbs() {
		tmpl.URIs = []*url.URL{u}
	} else {
		tmpl.Subject = pkix.Name{CommonName: identity}
	}
	if _, ok := csr.PublicKey.(*rsa.PublicKey); ok {
		tmpl.KeyUsage |= x509.KeyUsageKeyEncipherment
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, s.ca, csr.PublicKey, s.key)
	if err != nil {
		return nil, fmt.Errorf("signing the certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("parsing the issued certificate: %w", err)
	}
	chain := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	if !bytes.Equal(s.ca.RawIssuer, s.ca.RawSubject) {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.ca.Raw})...)
	}
	return &Issued{ChainPEM: chain, Leaf: leaf}, nil
}

// CheckRequest parses a PKCS#10 request and checks its signature and key;
// errors are *InvalidRequestError. Enrol calls it before it consumes the
// token, so a broken request does not burn a token.
func CheckRequest(csrDER []byte) (*x509.CertificateRequest, error) {
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, &InvalidRequestError{Err: err}
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, &InvalidRequestError{Err: fmt.Errorf("signature: %w", err)}
	}
	if err := acceptableKey(csr.PublicKey); err != nil {
		return nil, &InvalidRequestError{Err: err}
	}
	return csr, nil
}

// acceptableKey admits ECDSA P-256/P-384, Ed25519 and RSA of at least 2048
// bits.
func acceptableKey(pub any) error {
	switch k := pub.(type) {
	case *ecdsa.PublicKey:
		if k.Curve == elliptic.P256() || k.Curve == elliptic.P384() {
			return nil
		}
		return fmt.Errorf("ECDSA curve %s is not accepted (P-256 or P-384)", k.Curve.Params().Name)
	case ed25519.PublicKey:
		return nil
	case *rsa.PublicKey:
		if k.N.BitLen() >= 2048 {
			return nil
		}
		return fmt.Errorf("RSA key of %d bits is too short (at least 2048)", k.N.BitLen())
	}
	return fmt.Errorf("key type %T is not accepted (ECDSA P-256/P-384, Ed25519 or RSA ≥ 2048)", pub)
}

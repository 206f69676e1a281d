package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// Credentials are an edge's client certificate, its key and the CA bundle
// that verifies the broker, held in memory: what an enrolled edge keeps in
// its credentials Secret and replaces on every renewal.
type Credentials struct {
	// Certificate is the client certificate chain and key; Leaf is set.
	Certificate tls.Certificate
	// CABundlePEM is the broker's CA bundle as received.
	CABundlePEM []byte
	// Roots is CABundlePEM, parsed.
	Roots *x509.CertPool
}

// ParseCredentials checks and parses PEM credentials: the chain (leaf
// first), its private key and the broker CA bundle. The leaf must carry an
// identity; an expired leaf is an error naming when it expired.
func ParseCredentials(chainPEM, keyPEM, caBundlePEM []byte, now time.Time) (*Credentials, error) {
	cert, err := tls.X509KeyPair(chainPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("invalid certificate or key: %w", err)
	}
	leaf, err := x509.ParseCertificate(cert.Certificate[0])
	if err != nil {
		return nil, fmt.Errorf("invalid certificate: %w", err)
	}
	if now.After(leaf.NotAfter) {
		return nil, fmt.Errorf("certificate expired at %s", leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	if _, err := Identity(leaf); err != nil {
		return nil, err
	}
	cert.Leaf = leaf
	roots, err := ParseBundle(caBundlePEM)
	if err != nil {
		return nil, fmt.Errorf("broker CA bundle: %w", err)
	}
	return &Credentials{Certificate: cert, CABundlePEM: caBundlePEM, Roots: roots}, nil
}

// ParseBundle parses a PEM bundle of certificates into a pool; it fails
// when the bundle holds none or a block is not a certificate.
func ParseBundle(bundlePEM []byte) (*x509.CertPool, error) {
	certs, err := ParseCertificates(bundlePEM)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	for _, c := range certs {
		pool.AddCert(c)
	}
	return pool, nil
}

// ParseCertificates returns the certificates of a PEM bundle, in order.
func ParseCertificates(bundlePEM []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	rest := bundlePEM
	for {
		var block *pem.Block
		block, rest = pem.Decode(rest)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("invalid certificate in bundle: %w", err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("the bundle holds no PEM certificate")
	}
	return certs, nil
}

// NewMemoryClient is Client for credentials held in memory: the edge's
// enrolled certificate, replaced by SetCredentials on renewal. Each dial
// (Config) trusts the bundle current then and presents the certificate
// current at the handshake.
func NewMemoryClient(creds *Credentials, serverName string, p Profile) *ClientConfig {
	cur := &atomic.Pointer[Credentials]{}
	cur.Store(creds)
	return &ClientConfig{
		keyPair:    func() (*tls.Certificate, error) { return &cur.Load().Certificate, nil },
		roots:      func() (*x509.CertPool, error) { return cur.Load().Roots, nil },
		serverName: serverName,
		profile:    p,
		memory:     cur,
	}
}

// SetCredentials replaces the credentials of a NewMemoryClient; the next
// dial uses them. It fails for a file-backed ClientConfig.
func (c *ClientConfig) SetCredentials(creds *Credentials) error {
	if c.memory == nil {
		return errors.New("the TLS credentials come from files (--tls-cert/--tls-key/--broker-ca); they are rotated on disk")
	}
	c.memory.Store(creds)
	return nil
}

// Credentials returns the in-memory credentials, or nil for a file-backed
// ClientConfig.
func (c *ClientConfig) Credentials() *Credentials {
	if c.memory == nil {
		return nil
	}
	return c.memory.Load()
}

// Leaf returns the client certificate the next handshake presents.
func (c *ClientConfig) Leaf() (*x509.Certificate, error) {
	cert, err := c.keyPair()
	if err != nil {
		return nil, err
	}
	return cert.Leaf, nil
}

// PEM returns the certificate chain and the private key (PKCS#8) as PEM,
// for storing the credentials.
func (c *Credentials) PEM() (chainPEM, keyPEM []byte, err error) {
	for _, der := range c.Certificate.Certificate {
		chainPEM = append(chainPEM, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(c.Certificate.PrivateKey)
	if err != nil {
		return nil, nil, fmt.Errorf("cannot encode the private key: %w", err)
	}
	return chainPEM, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), nil
}

// Package devpki makes a small development PKI for ferry: one CA, a server
// certificate for the broker and client certificates for edges and admins.
// It exists so that the demo and the tests need nothing outside the project;
// production deployments bring their own PKI.
package devpki

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"
)

// Validity of every certificate devpki issues.
const validity = 365 * 24 * time.Hour

// File names inside a PKI directory.
const (
	CACertFile = "ca.crt"
	CAKeyFile  = "ca.key"
)

// CertFile and KeyFile name the files of a certificate called name.
func CertFile(dir, name string) string { return filepath.Join(dir, name+".crt") }

// KeyFile names the private key file of a certificate called name.
func KeyFile(dir, name string) string { return filepath.Join(dir, name+".key") }

// IdentityFor is the URI SAN devpki gives a client certificate called name.
func IdentityFor(name string) string { return "spiffe://ferry.local/" + name }

// CA is a certificate authority that can issue certificates.
type CA struct {
	cert *x509.Certificate
	key  crypto.Signer
}

// LoadOrCreateCA loads ca.crt/ca.key from dir, or creates them when absent,
// so that issuing more certificates later keeps the same trust root.
func LoadOrCreateCA(dir, commonName string) (*CA, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("cannot create %s: %w", dir, err)
	}
	certPath, keyPath := filepath.Join(dir, CACertFile), filepath.Join(dir, CAKeyFile)
	if _, err := os.Stat(certPath); err == nil {
		return loadCA(certPath, keyPath)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("cannot generate CA key: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(validity),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("cannot create CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, fmt.Errorf("cannot parse CA certificate: %w", err)
	}
	if err := writePair(certPath, keyPath, der, key); err != nil {
		return nil, err
	}
	return &CA{cert: cert, key: key}, nil
}

func loadCA(certPath, keyPath string) (*CA, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, fmt.Errorf("cannot read CA certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, fmt.Errorf("cannot read CA key: %w", err)
	}
	cb, _ := pem.Decode(certPEM)
	kb, _ := pem.Decode(keyPEM)
	if cb == nil || kb == nil {
		return nil, fmt.Errorf("%s or %s is not PEM", certPath, keyPath)
	}
	cert, err := x509.ParseCertificate(cb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("invalid CA certificate %s: %w", certPath, err)
	}
	key, err := x509.ParsePKCS8PrivateKey(kb.Bytes)
	if err != nil {
		return nil, fmt.Errorf("invalid CA key %s: %w", keyPath, err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("CA key %s cannot sign", keyPath)
	}
	return &CA{cert: cert, key: signer}, nil
}

// IssueServer writes NAME.crt/NAME.key, a server certificate valid for hosts
// (DNS names or IP addresses).
func (ca *CA) IssueServer(dir, name string, hosts []string) error {
	if len(hosts) == 0 {
		return errors.New("a server certificate needs at least one host")
	}
	tmpl := ca.template(name, x509.ExtKeyUsageServerAuth)
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.issue(dir, name, tmpl)
}

// IssueClient writes NAME.crt/NAME.key, a client certificate whose identity
// is the URI SAN identity (and CN name).
func (ca *CA) IssueClient(dir, name, identity string) error {
	u, err := url.Parse(identity)
	if err != nil || u.Scheme == "" {
		return fmt.Errorf("identity %q is not an absolute URI", identity)
	}
	tmpl := ca.template(name, x509.ExtKeyUsageClientAuth)
	tmpl.URIs = []*url.URL{u}
	return ca.issue(dir, name, tmpl)
}

func (ca *CA) template(commonName string, usage x509.ExtKeyUsage) *x509.Certificate {
	return &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: commonName},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(validity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
	}
}

func (ca *CA) issue(dir, name string, tmpl *x509.Certificate) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("cannot generate key for %s: %w", name, err)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, key.Public(), ca.key)
	if err != nil {
		return fmt.Errorf("cannot create certificate %s: %w", name, err)
	}
	return writePair(CertFile(dir, name), KeyFile(dir, name), der, key)
}

func writePair(certPath, keyPath string, der []byte, key crypto.Signer) error {
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return fmt.Errorf("cannot encode key: %w", err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		return fmt.Errorf("cannot write %s: %w", keyPath, err)
	}
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		return fmt.Errorf("cannot write %s: %w", certPath, err)
	}
	return nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		// crypto/rand never fails on supported platforms (Go 1.24+).
		panic(err)
	}
	return n
}

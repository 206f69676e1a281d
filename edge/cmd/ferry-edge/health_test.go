package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// expiredCredentials is a self-signed client certificate that expired a
// minute ago.
func expiredCredentials(t *testing.T) *tlsconfig.Credentials {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	notAfter := time.Now().Add(-time.Minute)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "nora"},
		NotBefore: notAfter.Add(-time.Hour), NotAfter: notAfter, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalPKCS8PrivateKey(key)
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	creds, err := tlsconfig.ParseCredentials(certPEM, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), certPEM, notAfter.Add(-time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return creds
}

// TestReadinessNamesCredentialProblems: an edge still enrolling, or whose
// certificate expired, is not ready, and the probe says why.
func TestReadinessNamesCredentialProblems(t *testing.T) {
	p := &edgeProcess{cfg: &Completed{Options: NewOptions()}}
	if err := p.ready(nil); err == nil || !strings.Contains(err.Error(), "enrolling") {
		t.Fatalf("ready while enrolling = %v", err)
	}
	p.tls.Store(tlsconfig.NewMemoryClient(expiredCredentials(t), ""))
	if err := p.ready(nil); err == nil || !strings.Contains(err.Error(), "client certificate expired at") {
		t.Fatalf("ready with an expired certificate = %v", err)
	}
	if _, err := p.clientCertificateExpiry(); err != nil {
		t.Fatalf("expiry metric source: %v", err)
	}
}

package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ferry-dev/ferry/pkg/cli"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

func TestStreamDownNamesTheBrokersRefusal(t *testing.T) {
	tests := []struct {
		name    string
		refusal error
		want    string
	}{
		{name: "revoked certificate", refusal: status.Error(codes.Unauthenticated, `client certificate sha256:ab of identity "spiffe://x/edge" is revoked: leaked`),
			want: `[-]broker failed: the broker at broker:9443 refused this edge (Unauthenticated): client certificate sha256:ab of identity "spiffe://x/edge" is revoked: leaked`},
		{name: "unknown identity", refusal: status.Error(codes.PermissionDenied, `identity "spiffe://x/edge" is not configured at this broker`),
			want: `[-]broker failed: the broker at broker:9443 refused this edge (PermissionDenied): identity "spiffe://x/edge" is not configured at this broker`},
		{name: "no refusal", want: "[-]broker failed: no established stream to the broker at broker:9443"},
		{name: "not a status", refusal: errors.New("odd"), want: "refused this edge (Unknown): odd"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			checks := cli.Checks{"broker": func(*http.Request) error { return streamDown("broker:9443", tc.refusal) }}
			rec := httptest.NewRecorder()
			checks.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
			if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), tc.want) {
				t.Errorf("/readyz = %d %q; want 500 containing %q", rec.Code, rec.Body.String(), tc.want)
			}
		})
	}
}

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
	p.tls.Store(tlsconfig.NewMemoryClient(expiredCredentials(t), "", tlsconfig.Profile{}))
	if err := p.ready(nil); err == nil || !strings.Contains(err.Error(), "client certificate expired at") {
		t.Fatalf("ready with an expired certificate = %v", err)
	}
	if _, err := p.clientCertificateExpiry(); err != nil {
		t.Fatalf("expiry metric source: %v", err)
	}
}

package tlsconfig

import (
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/pkg/devpki"
)

func TestIdentity(t *testing.T) {
	u, _ := url.Parse("spiffe://example.com/edge/nora")
	tests := []struct {
		name    string
		cert    *x509.Certificate
		want    string
		wantErr bool
	}{
		{name: "URI SAN wins over CN", cert: &x509.Certificate{URIs: []*url.URL{u}, Subject: pkix.Name{CommonName: "cn"}}, want: u.String()},
		{name: "CN when no URI SAN", cert: &x509.Certificate{Subject: pkix.Name{CommonName: "nora"}}, want: "nora"},
		{name: "neither", cert: &x509.Certificate{}, wantErr: true},
		{name: "nil", cert: nil, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Identity(tt.cert)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Fatalf("Identity() = %q, %v; want %q, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func newPKI(t *testing.T, clients ...string) (string, *devpki.CA) {
	t.Helper()
	dir := t.TempDir()
	ca, err := devpki.LoadOrCreateCA(dir, "test CA")
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.IssueServer(dir, "broker", []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	for _, c := range clients {
		if err := ca.IssueClient(dir, c, devpki.IdentityFor(c)); err != nil {
			t.Fatal(err)
		}
	}
	return dir, ca
}

func TestServerIsTLS13WithRequiredClientCert(t *testing.T) {
	dir, _ := newPKI(t)
	cfg, err := Server(Files{CertFile: devpki.CertFile(dir, "broker"), KeyFile: devpki.KeyFile(dir, "broker"), CAFile: filepath.Join(dir, devpki.CACertFile)})
	if err != nil {
		t.Fatal(err)
	}
	got, err := cfg.GetConfigForClient(&tls.ClientHelloInfo{})
	if err != nil {
		t.Fatal(err)
	}
	if got.MinVersion != tls.VersionTLS13 || got.ClientAuth != tls.RequireAndVerifyClientCert || got.ClientCAs == nil || len(got.Certificates) != 1 {
		t.Fatalf("server config: min %x, client auth %v, CAs %v, certs %d", got.MinVersion, got.ClientAuth, got.ClientCAs != nil, len(got.Certificates))
	}
}

func TestServerReloadsRotatedCertificate(t *testing.T) {
	dir, ca := newPKI(t)
	files := Files{CertFile: devpki.CertFile(dir, "broker"), KeyFile: devpki.KeyFile(dir, "broker"), CAFile: filepath.Join(dir, devpki.CACertFile)}
	cfg, err := Server(files)
	if err != nil {
		t.Fatal(err)
	}
	serial := func() string {
		c, err := cfg.GetConfigForClient(&tls.ClientHelloInfo{})
		if err != nil {
			t.Fatal(err)
		}
		return c.Certificates[0].Leaf.SerialNumber.String()
	}
	before := serial()
	if serial() != before {
		t.Fatal("certificate changed without a file change")
	}

	// Rotate: new files with a later modification time.
	if err := ca.IssueServer(dir, "broker", []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	for _, p := range []string{files.CertFile, files.KeyFile} {
		if err := os.Chtimes(p, later, later); err != nil {
			t.Fatal(err)
		}
	}
	if serial() == before {
		t.Fatal("rotated certificate was not picked up")
	}

	// A broken rotation keeps the last good certificate.
	after := serial()
	if err := os.WriteFile(files.CertFile, []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	if serial() != after {
		t.Fatal("a broken certificate file replaced the last good one")
	}
}

func TestConstructorsNameTheBadFile(t *testing.T) {
	dir, _ := newPKI(t, "edge")
	missing := filepath.Join(dir, "missing.crt")
	if _, err := Server(Files{CertFile: missing, KeyFile: devpki.KeyFile(dir, "broker"), CAFile: filepath.Join(dir, devpki.CACertFile)}); err == nil || !strings.Contains(err.Error(), "missing.crt") {
		t.Errorf("Server with a missing certificate: %v", err)
	}
	if _, err := Client(Files{CertFile: devpki.CertFile(dir, "edge"), KeyFile: devpki.KeyFile(dir, "edge"), CAFile: devpki.CertFile(dir, "edge") + ".nope"}, ""); err == nil || !strings.Contains(err.Error(), ".nope") {
		t.Errorf("Client with a missing CA: %v", err)
	}
	if _, err := Client(Files{CertFile: devpki.CertFile(dir, "edge"), KeyFile: devpki.KeyFile(dir, "broker"), CAFile: filepath.Join(dir, devpki.CACertFile)}, ""); err == nil || !strings.Contains(err.Error(), "edge.crt") {
		t.Errorf("Client with a mismatched key: %v", err)
	}
}

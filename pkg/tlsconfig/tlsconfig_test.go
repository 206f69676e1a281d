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

	"github.com/go-logr/logr"

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

func TestServerIsTLS13VerifyingGivenClientCert(t *testing.T) {
	dir, _ := newPKI(t)
	cfg, err := Server(Files{CertFile: devpki.CertFile(dir, "broker"), KeyFile: devpki.KeyFile(dir, "broker"), CAFile: filepath.Join(dir, devpki.CACertFile)}, Profile{}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	got, err := cfg.GetConfigForClient(&tls.ClientHelloInfo{})
	if err != nil {
		t.Fatal(err)
	}
	if got.MinVersion != tls.VersionTLS13 || got.ClientAuth != tls.VerifyClientCertIfGiven || got.ClientCAs == nil || len(got.Certificates) != 1 {
		t.Fatalf("server config: min %x, client auth %v, CAs %v, certs %d", got.MinVersion, got.ClientAuth, got.ClientCAs != nil, len(got.Certificates))
	}
}

func TestServerReloadsRotatedCertificate(t *testing.T) {
	dir, ca := newPKI(t)
	files := Files{CertFile: devpki.CertFile(dir, "broker"), KeyFile: devpki.KeyFile(dir, "broker"), CAFile: filepath.Join(dir, devpki.CACertFile)}
	cfg, err := Server(files, Profile{}, logr.Discard())
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
	if _, err := Server(Files{CertFile: missing, KeyFile: devpki.KeyFile(dir, "broker"), CAFile: filepath.Join(dir, devpki.CACertFile)}, Profile{}, logr.Discard()); err == nil || !strings.Contains(err.Error(), "missing.crt") {
		t.Errorf("Server with a missing certificate: %v", err)
	}
	if _, err := Client(Files{CertFile: devpki.CertFile(dir, "edge"), KeyFile: devpki.KeyFile(dir, "edge"), CAFile: devpki.CertFile(dir, "edge") + ".nope"}, "", Profile{}); err == nil || !strings.Contains(err.Error(), ".nope") {
		t.Errorf("Client with a missing CA: %v", err)
	}
	if _, err := Client(Files{CertFile: devpki.CertFile(dir, "edge"), KeyFile: devpki.KeyFile(dir, "broker"), CAFile: filepath.Join(dir, devpki.CACertFile)}, "", Profile{}); err == nil || !strings.Contains(err.Error(), "edge.crt") {
		t.Errorf("Client with a mismatched key: %v", err)
	}
}

// TestClientReloadsRotatedCA: the broker's certificate moves to a new CA and
// the edge's CA bundle file is rotated to hold it; the next handshake of the
// same client configuration (no new process) trusts the new broker.
func TestClientReloadsRotatedCA(t *testing.T) {
	dir, _ := newPKI(t, "edge")
	caFile := filepath.Join(dir, devpki.CACertFile)
	client, err := Client(Files{CertFile: devpki.CertFile(dir, "edge"), KeyFile: devpki.KeyFile(dir, "edge"), CAFile: caFile}, "", Profile{})
	if err != nil {
		t.Fatal(err)
	}

	// A broker whose certificate comes from a new CA; it still accepts the
	// edge's client certificate (old CA).
	newDir := t.TempDir()
	newCA, err := devpki.LoadOrCreateCA(newDir, "new CA")
	if err != nil {
		t.Fatal(err)
	}
	if err := newCA.IssueServer(newDir, "broker", []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	server, err := Server(Files{CertFile: devpki.CertFile(newDir, "broker"), KeyFile: devpki.KeyFile(newDir, "broker"), CAFile: caFile}, Profile{}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", server)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lis.Close() })
	go func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				_ = conn.(*tls.Conn).Handshake()
				_ = conn.Close()
			}()
		}
	}()
	handshake := func() error {
		conn, err := tls.Dial("tcp", lis.Addr().String(), clientConfig(t, client))
		if err != nil {
			return err
		}
		return conn.Close()
	}

	if err := handshake(); err == nil {
		t.Fatal("handshake with a broker of an unknown CA succeeded")
	}
	// Rotate the edge's bundle: old and new CA, with a later modification
	// time (as a Secret update does).
	oldPEM, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	newPEM, err := os.ReadFile(filepath.Join(newDir, devpki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(caFile, append(oldPEM, newPEM...), 0o600); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Minute)
	if err := os.Chtimes(caFile, later, later); err != nil {
		t.Fatal(err)
	}
	if err := handshake(); err != nil {
		t.Fatalf("handshake after rotating the CA bundle: %v", err)
	}
}

func clientConfig(t *testing.T, c *ClientConfig) *tls.Config {
	t.Helper()
	cfg, err := c.Config()
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

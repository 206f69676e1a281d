package tlsconfig

import (
	"os"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/pkg/devpki"
)

// memoryCredentials issues a client certificate for identity and returns it
// as in-memory credentials.
func memoryCredentials(t *testing.T, dir string, ca *devpki.CA, name string) *Credentials {
	t.Helper()
	if err := ca.IssueClient(dir, name, devpki.IdentityFor(name)); err != nil {
		t.Fatal(err)
	}
	read := func(p string) []byte {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	creds, err := ParseCredentials(read(devpki.CertFile(dir, name)), read(devpki.KeyFile(dir, name)), read(dir+"/"+devpki.CACertFile), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return creds
}

func TestMemoryClientServesSwappedCredentials(t *testing.T) {
	dir := t.TempDir()
	ca, err := devpki.LoadOrCreateCA(dir, "test CA")
	if err != nil {
		t.Fatal(err)
	}
	first := memoryCredentials(t, dir, ca, "first")
	c := NewMemoryClient(first, "broker", Profile{})
	cfg, err := c.Config()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ServerName != "broker" || cfg.RootCAs == nil {
		t.Fatalf("config = server name %q, roots %v", cfg.ServerName, cfg.RootCAs)
	}
	got, _ := cfg.GetClientCertificate(nil)
	if got.Leaf != first.Certificate.Leaf {
		t.Fatal("the first certificate is not presented")
	}

	second := memoryCredentials(t, dir, ca, "second")
	if err := c.SetCredentials(second); err != nil {
		t.Fatal(err)
	}
	// A connection being set up picks the new certificate at its handshake.
	got, _ = cfg.GetClientCertificate(nil)
	if got.Leaf != second.Certificate.Leaf {
		t.Fatal("the swapped certificate is not presented")
	}
	if leaf, _ := c.Leaf(); leaf != second.Certificate.Leaf {
		t.Fatal("Leaf does not return the swapped certificate")
	}
}

func TestParseCredentialsRefusesExpired(t *testing.T) {
	dir := t.TempDir()
	ca, err := devpki.LoadOrCreateCA(dir, "test CA")
	if err != nil {
		t.Fatal(err)
	}
	creds := memoryCredentials(t, dir, ca, "edge")
	chain, _ := os.ReadFile(devpki.CertFile(dir, "edge"))
	key, _ := os.ReadFile(devpki.KeyFile(dir, "edge"))
	_, err = ParseCredentials(chain, key, creds.CABundlePEM, creds.Certificate.Leaf.NotAfter.Add(time.Second))
	if err == nil {
		t.Fatal("expired credentials were accepted")
	}
}

func TestSetCredentialsRefusesFileClient(t *testing.T) {
	c := &ClientConfig{}
	if err := c.SetCredentials(&Credentials{}); err == nil {
		t.Fatal("a file-backed client accepted in-memory credentials")
	}
}

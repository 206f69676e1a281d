package enrolment

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"math/big"
	"net/url"
	"strings"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// testCA makes a CA (self-signed when parent is nil, else signed by parent).
func testCA(t *testing.T, name string, parent *x509.Certificate, parentKey crypto.Signer, notAfter time.Time, isCA bool) (*x509.Certificate, crypto.Signer) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true, IsCA: isCA,
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, key.Public(), parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert, key
}

func pool(certs ...*x509.Certificate) *x509.CertPool {
	p := x509.NewCertPool()
	for _, c := range certs {
		p.AddCert(c)
	}
	return p
}

func csrFor(t *testing.T, key crypto.Signer, subject string, uris ...string) []byte {
	t.Helper()
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: subject}}
	for _, u := range uris {
		parsed, _ := url.Parse(u)
		tmpl.URIs = append(tmpl.URIs, parsed)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

func TestNewSignerChecksTheCA(t *testing.T) {
	far := time.Now().Add(24 * time.Hour)
	root, rootKey := testCA(t, "root", nil, nil, far, true)
	other, _ := testCA(t, "other root", nil, nil, far, true)
	inter, interKey := testCA(t, "intermediate", root, rootKey, far, true)
	leaf, leafKey := testCA(t, "not a CA", root, rootKey, far, false)
	clk := clocktesting.NewFakePassiveClock(time.Now())
	for _, tc := range []struct {
		name     string
		ca       *x509.Certificate
		key      crypto.Signer
		bundle   *x509.CertPool
		lifetime time.Duration
		wantErr  string
	}{
		{name: "root in the bundle", ca: root, key: rootKey, bundle: pool(root), lifetime: time.Hour},
		{name: "intermediate under the bundle", ca: inter, key: interKey, bundle: pool(root), lifetime: time.Hour},
		{name: "not a CA", ca: leaf, key: leafKey, bundle: pool(root), lifetime: time.Hour, wantErr: "not a CA certificate"},
		{name: "wrong key", ca: root, key: interKey, bundle: pool(root), lifetime: time.Hour, wantErr: "does not belong"},
		{name: "not under the client CA bundle", ca: inter, key: interKey, bundle: pool(other), lifetime: time.Hour, wantErr: "--client-ca"},
		{name: "lifetime too short", ca: root, key: rootKey, bundle: pool(root), lifetime: time.Second, wantErr: "below the minimum"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewSigner(tc.ca, tc.key, tc.bundle, tc.lifetime, clk)
			if tc.wantErr == "" && err != nil {
				t.Fatalf("NewSigner: %v", err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("NewSigner error = %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

func TestSignIssuesTheNamedIdentity(t *testing.T) {
	now := time.Now().UTC().Truncate(time.Second)
	root, rootKey := testCA(t, "root", nil, nil, now.Add(365*24*time.Hour), true)
	inter, interKey := testCA(t, "intermediate", root, rootKey, now.Add(2*time.Hour), true)
	clk := clocktesting.NewFakePassiveClock(now)
	ecKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	p224, _ := ecdsa.GenerateKey(elliptic.P224(), rand.Reader)
	_, edKey, _ := ed25519.GenerateKey(rand.Reader)
	rsaSmall, _ := rsa.GenerateKey(rand.Reader, 1024)
	badSig := csrFor(t, ecKey, "x")
	badSig[len(badSig)-3] ^= 0xff

	for _, tc := range []struct {
		name      string
		ca        *x509.Certificate
		caKey     crypto.Signer
		csr       []byte
		identity  string
		lifetime  time.Duration
		wantErr   string
		wantURI   bool
		notAfter  time.Time
		wantChain int
	}{
		{name: "URI identity; CSR names another", ca: root, caKey: rootKey, csr: csrFor(t, ecKey, "mallory", "spiffe://x/mallory"), identity: "spiffe://x/alice", lifetime: time.Hour, wantURI: true, notAfter: now.Add(time.Hour), wantChain: 1},
		{name: "plain identity becomes the CN", ca: root, caKey: rootKey, csr: csrFor(t, p384, "mallory"), identity: "alice", lifetime: time.Hour, notAfter: now.Add(time.Hour), wantChain: 1},
		{name: "Ed25519", ca: root, caKey: rootKey, csr: csrFor(t, edKey, ""), identity: "alice", lifetime: time.Hour, notAfter: now.Add(time.Hour), wantChain: 1},
		{name: "capped at the CA's expiry; intermediate in the chain", ca: inter, caKey: interKey, csr: csrFor(t, ecKey, ""), identity: "alice", lifetime: 24 * time.Hour, notAfter: inter.NotAfter, wantChain: 2},
		{name: "P-224 refused", ca: root, caKey: rootKey, csr: csrFor(t, p224, ""), identity: "alice", lifetime: time.Hour, wantErr: "P-224"},
		{name: "short RSA refused", ca: root, caKey: rootKey, csr: csrFor(t, rsaSmall, ""), identity: "alice", lifetime: time.Hour, wantErr: "too short"},
		{name: "bad signature", ca: root, caKey: rootKey, csr: badSig, identity: "alice", lifetime: time.Hour, wantErr: "invalid certificate signing request"},
		{name: "garbage", ca: root, caKey: rootKey, csr: []byte("nope"), identity: "alice", lifetime: time.Hour, wantErr: "invalid certificate signing request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := NewSigner(tc.ca, tc.caKey, pool(root), tc.lifetime, clk)
			if err != nil {
				t.Fatal(err)
			}
			issued, err := s.Sign(tc.csr, tc.identity)
			if tc.wantErr != "" {
				var invalid *InvalidRequestError
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.As(err, &invalid) {
					t.Fatalf("Sign error = %v, want an InvalidRequestError containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			leaf := issued.Leaf
			if got, _ := tlsconfig.Identity(leaf); got != tc.identity {
				t.Errorf("identity = %q, want %q", got, tc.identity)
			}
			if (len(leaf.URIs) > 0) != tc.wantURI {
				t.Errorf("URI SANs = %v, want URI %v", leaf.URIs, tc.wantURI)
			}
			if len(leaf.DNSNames)+len(leaf.EmailAddresses)+len(leaf.IPAddresses) > 0 {
				t.Errorf("the CSR's SANs leaked into the certificate: %v", leaf)
			}
			if !leaf.NotBefore.Equal(now.Add(-5*time.Minute)) || !leaf.NotAfter.Equal(tc.notAfter) {
				t.Errorf("validity = %s … %s, want %s … %s", leaf.NotBefore, leaf.NotAfter, now.Add(-5*time.Minute), tc.notAfter)
			}
			if len(leaf.ExtKeyUsage) != 1 || leaf.ExtKeyUsage[0] != x509.ExtKeyUsageClientAuth {
				t.Errorf("extended key usage = %v, want client auth only", leaf.ExtKeyUsage)
			}
			chain, err := tlsconfig.ParseCertificates(issued.ChainPEM)
			if err != nil || len(chain) != tc.wantChain {
				t.Fatalf("chain = %d certificates (%v), want %d", len(chain), err, tc.wantChain)
			}
			inters := pool(chain[1:]...)
			if _, err := leaf.Verify(x509.VerifyOptions{Roots: pool(root), Intermediates: inters, CurrentTime: now, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
				t.Errorf("the issued certificate does not verify against the client CA: %v", err)
			}
		})
	}
}

func TestCheckBlocked(t *testing.T) {
	if err := CheckBlocked(nil, "a", ""); err != nil {
		t.Fatalf("nil blocklist blocked: %v", err)
	}
	b := blockFunc(func(id, fp string) (string, bool) { return "leaked", id == "a" })
	var blocked *BlockedError
	if err := CheckBlocked(b, "a", "sha256:x"); !errors.As(err, &blocked) || blocked.Reason != "leaked" {
		t.Fatalf("CheckBlocked = %v, want blocked: leaked", err)
	}
	if err := CheckBlocked(b, "b", ""); err != nil {
		t.Fatalf("CheckBlocked(b) = %v", err)
	}
}

type blockFunc func(identity, fingerprint string) (string, bool)

func (f blockFunc) Blocked(identity, fingerprint string) (string, bool) {
	return f(identity, fingerprint)
}

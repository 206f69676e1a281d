package enrol

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// issue signs a fresh key for identity with the PKI's signer.
func (p *testPKI) issue(t *testing.T, identity string) *tlsconfig.Credentials {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	csr, err := NewCSR(key)
	if err != nil {
		t.Fatal(err)
	}
	issued, err := p.signer.Sign(csr, identity)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := Credentials(key, issued.ChainPEM, p.bundle, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return creds
}

func TestSecretStore(t *testing.T) {
	ctx := context.Background()
	pki := newTestPKI(t)
	cs := fake.NewClientset()
	s := &SecretStore{Client: cs.CoreV1(), Namespace: "ferry-system", Name: DefaultSecretName}

	if _, err := s.Load(ctx, time.Now()); !errors.Is(err, ErrNoCredentials) {
		t.Fatalf("Load of a missing Secret = %v, want ErrNoCredentials", err)
	}
	first := pki.issue(t, "spiffe://x/nora")
	if err := s.Save(ctx, first); err != nil {
		t.Fatal(err)
	}
	got, err := s.Load(ctx, time.Now())
	if err != nil || !got.Certificate.Leaf.Equal(first.Certificate.Leaf) {
		t.Fatalf("Load = %v, %v; want the saved certificate", got, err)
	}
	second := pki.issue(t, "spiffe://x/nora")
	if err := s.Save(ctx, second); err != nil {
		t.Fatal(err)
	}
	got, err = s.Load(ctx, time.Now())
	if err != nil || !got.Certificate.Leaf.Equal(second.Certificate.Leaf) {
		t.Fatalf("Load after an update = %v, %v; want the second certificate", got, err)
	}
	sec, _ := cs.CoreV1().Secrets("ferry-system").Get(ctx, DefaultSecretName, metav1.GetOptions{})
	if sec.Type != corev1.SecretTypeTLS || len(sec.Data[KeyCABundle]) == 0 {
		t.Fatalf("Secret type %s, keys %v", sec.Type, sec.Data)
	}
	// An expired certificate is not usable, and the error says when.
	if _, err := s.Load(ctx, second.Certificate.Leaf.NotAfter.Add(time.Minute)); err == nil || !strings.Contains(err.Error(), "expired at") {
		t.Fatalf("Load of expired credentials = %v", err)
	}
	// A Secret with garbage names itself.
	sec.Data[KeyPrivateKey] = []byte("junk")
	if _, err := cs.CoreV1().Secrets("ferry-system").Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Load(ctx, time.Now()); err == nil || errors.Is(err, ErrNoCredentials) || !strings.Contains(err.Error(), "ferry-system/"+DefaultSecretName) {
		t.Fatalf("Load of a broken Secret = %v", err)
	}
}

func TestParseSecretRef(t *testing.T) {
	for in, ok := range map[string]bool{"ns/name": true, "name": false, "/name": false, "ns/": false, "a/b/c": false} {
		if _, _, err := ParseSecretRef(in); (err == nil) != ok {
			t.Errorf("ParseSecretRef(%q) = %v, want ok %v", in, err, ok)
		}
	}
}

// TestSecretStoreNeverOverwritesASecretItDidNotMake: --credentials-secret
// pointing at somebody else's Secret (a typo, a shared name) must not cost
// them its content: Save refuses and names it.
func TestSecretStoreNeverOverwritesASecretItDidNotMake(t *testing.T) {
	ctx := context.Background()
	pki := newTestPKI(t)
	foreign := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "web-tls", Namespace: "ferry-system"},
		Type: corev1.SecretTypeTLS, Data: map[string][]byte{"tls.crt": []byte("theirs")}}
	cs := fake.NewClientset(foreign)
	s := &SecretStore{Client: cs.CoreV1(), Namespace: "ferry-system", Name: "web-tls"}
	err := s.Save(ctx, pki.issue(t, "spiffe://x/nora"))
	if err == nil || !strings.Contains(err.Error(), "ferry-system/web-tls") || !strings.Contains(err.Error(), "not made by ferry-edge") {
		t.Fatalf("Save over a foreign Secret = %v, want a refusal naming it", err)
	}
	sec, _ := cs.CoreV1().Secrets("ferry-system").Get(ctx, "web-tls", metav1.GetOptions{})
	if string(sec.Data["tls.crt"]) != "theirs" {
		t.Fatalf("the foreign Secret was overwritten: %q", sec.Data["tls.crt"])
	}
}

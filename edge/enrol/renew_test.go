package enrol

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	clocktesting "k8s.io/utils/clock/testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

type memStore struct {
	mu    sync.Mutex
	saved []*tlsconfig.Credentials
}

func (m *memStore) Save(_ context.Context, c *tlsconfig.Credentials) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.saved = append(m.saved, c)
	return nil
}

type countRenewals struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *countRenewals) CertificateRenewal(result string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n[result]++
}

// waitTimer steps the fake clock once a timer waits on it.
func waitTimer(t *testing.T, fc *clocktesting.FakeClock) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !fc.HasWaiters() {
		if time.Now().After(deadline) {
			t.Fatal("no timer is waiting: the renewer polls or is stuck")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestRenewerSchedulesRetriesAndInstalls(t *testing.T) {
	pki := newTestPKI(t)
	const identity = "spiffe://x/nora"
	creds := pki.issue(t, identity) // one hour (the signer's lifetime)
	leaf := creds.Certificate.Leaf
	installed := leaf.NotBefore.Add(5 * time.Minute) // the broker backdates by 5 minutes
	fc := clocktesting.NewFakeClock(installed)
	tlsCfg := tlsconfig.NewMemoryClient(creds, "", tlsconfig.Profile{})
	store := &memStore{}
	counts := &countRenewals{n: map[string]int{}}
	r := NewRenewer(RenewerOptions{TLS: tlsCfg, Store: store, Installed: installed, Clock: fc, Metrics: counts, Log: logr.Discard()})

	wantDue := installed.Add(leaf.NotAfter.Sub(installed) * 2 / 3)
	if !r.Due().Equal(wantDue) {
		t.Fatalf("due = %s, want %s (two thirds from when it was obtained)", r.Due(), wantDue)
	}

	sent := make(chan []byte, 10)
	send := func(m *ferryv1.ConnectRequest) error {
		sent <- m.GetCertificateRenewal().GetCertificateSigningRequestDer()
		return nil
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan bool, 1)
	go func() { done <- r.Run(ctx, send) }()

	// Nothing before it is due.
	waitTimer(t, fc)
	fc.Step(wantDue.Sub(installed) - time.Second)
	select {
	case <-sent:
		t.Fatal("renewal sent before it was due")
	case <-time.After(50 * time.Millisecond):
	}
	fc.Step(time.Second)
	recv := func() []byte {
		select {
		case csr := <-sent:
			return csr
		case <-time.After(10 * time.Second):
			t.Fatal("no renewal sent")
			return nil
		}
	}
	recv()

	// A refusal keeps the certificate, shows in Err, and is retried after
	// the backoff.
	r.Deliver(&ferryv1.IssuedCertificate{ErrorMessage: "blocked: leaked"})
	deadline := time.Now().Add(10 * time.Second)
	for r.Err() == nil && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	waitTimer(t, fc) // the retry's backoff
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), "blocked: leaked") {
		t.Fatalf("Err after a refusal = %v", err)
	}
	if tlsCfg.Credentials() != creds {
		t.Fatal("a refused renewal replaced the certificate")
	}
	fc.Step(5 * time.Second)
	csr := recv()

	issued, err := pki.signer.Sign(csr, identity)
	if err != nil {
		t.Fatal(err)
	}
	r.Deliver(&ferryv1.IssuedCertificate{CertificateChainPem: issued.ChainPEM, BrokerCaBundlePem: pki.bundle})
	select {
	case renewed := <-done:
		if !renewed {
			t.Fatal("Run returned without a renewal")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the renewal")
	}
	if got := tlsCfg.Credentials().Certificate.Leaf; !got.Equal(issued.Leaf) {
		t.Fatal("the renewed certificate is not installed")
	}
	if len(store.saved) != 1 || !store.saved[0].Certificate.Leaf.Equal(issued.Leaf) {
		t.Fatalf("stored %d credentials, want the renewed one", len(store.saved))
	}
	if r.Err() != nil {
		t.Fatalf("Err after a success = %v", r.Err())
	}
	if counts.n[ResultRefused] != 1 || counts.n[ResultRenewed] != 1 || len(sent) != 0 {
		t.Fatalf("renewals = %v, %d extra sends", counts.n, len(sent))
	}
	// The next renewal is two thirds into the new certificate.
	newLeaf := issued.Leaf
	if want := fc.Now().Add(newLeaf.NotAfter.Sub(fc.Now()) * 2 / 3); !r.Due().Equal(want) {
		t.Fatalf("next due = %s, want %s", r.Due(), want)
	}
}

func TestRenewerRefusesAnotherIdentity(t *testing.T) {
	pki := newTestPKI(t)
	creds := pki.issue(t, "spiffe://x/nora")
	fc := clocktesting.NewFakeClock(creds.Certificate.Leaf.NotAfter) // due at once
	tlsCfg := tlsconfig.NewMemoryClient(creds, "", tlsconfig.Profile{})
	r := NewRenewer(RenewerOptions{TLS: tlsCfg, Store: &memStore{}, Clock: fc, Log: logr.Discard()})
	sent := make(chan []byte, 1)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan bool, 1)
	go func() {
		done <- r.Run(ctx, func(m *ferryv1.ConnectRequest) error {
			sent <- m.GetCertificateRenewal().GetCertificateSigningRequestDer()
			return nil
		})
	}()
	issued, err := pki.signer.Sign(<-sent, "spiffe://x/mallory")
	if err != nil {
		t.Fatal(err)
	}
	r.Deliver(&ferryv1.IssuedCertificate{CertificateChainPem: issued.ChainPEM, BrokerCaBundlePem: pki.bundle})
	deadline := time.Now().Add(10 * time.Second)
	for r.Err() == nil && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), "mallory") {
		t.Fatalf("Err = %v, want the foreign identity named", err)
	}
	if tlsCfg.Credentials() != creds {
		t.Fatal("a certificate for another identity was installed")
	}
	cancel()
	if <-done {
		t.Fatal("Run reported a renewal")
	}
}

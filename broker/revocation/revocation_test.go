package revocation

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	clienttesting "k8s.io/client-go/testing"

	"github.com/ferry-dev/ferry/broker/config"
)

const (
	nora = "spiffe://example.com/edge/nora"
	otto = "spiffe://example.com/edge/otto"
	wsA  = "root:a"
	wsB  = "root:b"
	ns   = "ferry-state"
)

var (
	fpOne = "sha256:" + strings.Repeat("11", 32)
	fpTwo = "sha256:" + strings.Repeat("22", 32)
)

func testConfig(revoked ...config.Revocation) *config.Config {
	return &config.Config{
		Edges: []config.Edge{
			{Identity: nora, APIExport: config.APIExportRef{Workspace: wsA, Name: "nora.example.com"}},
			{Identity: otto, APIExport: config.APIExportRef{Workspace: wsB, Name: "otto.example.com"}},
		},
		Revoked: revoked,
	}
}

// fakeKCP is one fake clientset per workspace.
type fakeKCP struct {
	mu         sync.Mutex
	workspaces map[string]*fake.Clientset
}

func newFakeKCP(objects map[string][]runtime.Object) *fakeKCP {
	f := &fakeKCP{workspaces: map[string]*fake.Clientset{}}
	for _, ws := range []string{wsA, wsB} {
		f.workspaces[ws] = fake.NewSimpleClientset(objects[ws]...)
	}
	return f
}

func (f *fakeKCP) Secrets(workspace string) (corev1client.SecretsGetter, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.workspaces[workspace]
	if !ok {
		return nil, fmt.Errorf("no workspace %s", workspace)
	}
	return c.CoreV1(), nil
}

// lists counts the Secret Lists made in workspace.
func (f *fakeKCP) lists(workspace string) int {
	n := 0
	for _, a := range f.workspaces[workspace].Actions() {
		if a.GetVerb() == "list" && a.GetResource().Resource == "secrets" {
			n++
		}
	}
	return n
}

func newSet(t *testing.T, cfg *config.Config, kcp Clients) *Set {
	t.Helper()
	return New(Options{Config: cfg, Clients: kcp, Namespace: ns, Log: logr.Discard()})
}

func revocationSecret(name, identity, fp, reason string, typ corev1.SecretType) *corev1.Secret {
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{LabelRevocation: "true"}},
		Type:       typ,
		Data:       map[string][]byte{KeyIdentity: []byte(identity), KeyCertificateSHA256: []byte(fp), KeyReason: []byte(reason)},
	}
}

func TestBlockedByConfiguration(t *testing.T) {
	s := newSet(t, testConfig(
		config.Revocation{Identity: nora, CertificateSHA256: strings.ToUpper(strings.Repeat("11:", 31) + "11"), Reason: "laptop stolen"},
		config.Revocation{Identity: otto, Reason: "decommissioned"},
	), newFakeKCP(nil))
	tests := []struct {
		name, identity, fingerprint string
		wantBlocked                 bool
		wantReason, wantMessage     string
	}{
		{name: "revoked certificate (config in openssl form)", identity: nora, fingerprint: fpOne, wantBlocked: true, wantReason: "laptop stolen",
			wantMessage: `client certificate ` + fpOne + ` of identity "` + nora + `" is revoked: laptop stolen`},
		{name: "another certificate of the same identity", identity: nora, fingerprint: fpTwo},
		{name: "no certificate given does not match a certificate block", identity: nora, fingerprint: ""},
		{name: "blocked identity, any certificate", identity: otto, fingerprint: fpTwo, wantBlocked: true, wantReason: "decommissioned",
			wantMessage: `identity "` + otto + `" is blocked: decommissioned`},
		{name: "blocked identity, no certificate", identity: otto, wantBlocked: true, wantReason: "decommissioned"},
		{name: "the revoked fingerprint under another identity", identity: "spiffe://example.com/edge/else", fingerprint: fpOne},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reason, blocked := s.Blocked(tc.identity, tc.fingerprint)
			if blocked != tc.wantBlocked || reason != tc.wantReason {
				t.Fatalf("Blocked(%q, %q) = %q, %v; want %q, %v", tc.identity, tc.fingerprint, reason, blocked, tc.wantReason, tc.wantBlocked)
			}
			if tc.wantMessage != "" {
				b, _ := s.Match(tc.identity, tc.fingerprint)
				if b.Message() != tc.wantMessage || b.Source != SourceConfiguration {
					t.Errorf("Match = %+v, message %q; want %q from the configuration", b, b.Message(), tc.wantMessage)
				}
			}
		})
	}
}

func TestUnparsableConfiguredFingerprintBlocksTheIdentity(t *testing.T) {
	// Config.Validate refuses it; a configuration built in code may not
	// have been validated, and must then block more, not less.
	s := newSet(t, testConfig(config.Revocation{Identity: nora, CertificateSHA256: "sha256:12", Reason: "leaked"}), nil)
	if reason, blocked := s.Blocked(nora, fpTwo); !blocked || reason != "leaked" {
		t.Errorf("Blocked = %q, %v; want the identity blocked", reason, blocked)
	}
}

func TestWithoutKCPClients(t *testing.T) {
	s := newSet(t, testConfig(config.Revocation{Identity: otto, Reason: "decommissioned"}), nil)
	if err := s.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, blocked := s.Blocked(otto, fpOne); !blocked {
		t.Error("the configuration's blocks apply without kcp clients")
	}
	if _, err := s.Revoke(context.Background(), nora, "", "x"); err == nil || !strings.Contains(err.Error(), "revoked[] of the broker configuration") {
		t.Errorf("Revoke = %v, want an error pointing at the configuration", err)
	}
}

func TestCertificateBlockNamedBeforeIdentityBlock(t *testing.T) {
	s := newSet(t, testConfig(
		config.Revocation{Identity: nora, Reason: "whole identity"},
		config.Revocation{Identity: nora, CertificateSHA256: fpOne, Reason: "this certificate"},
	), newFakeKCP(nil))
	if reason, _ := s.Blocked(nora, fpOne); reason != "this certificate" {
		t.Errorf("reason = %q, want the certificate's own", reason)
	}
	if reason, _ := s.Blocked(nora, fpTwo); reason != "whole identity" {
		t.Errorf("reason = %q, want the identity's", reason)
	}
}

func TestLoad(t *testing.T) {
	kcp := newFakeKCP(map[string][]runtime.Object{
		wsA: {
			revocationSecret("good", nora, strings.Repeat("11", 32), "leaked", SecretType),
			revocationSecret("wrong-type", nora, fpTwo, "x", corev1.SecretTypeOpaque),
			// otto's export lives in workspace B: a Secret in A cannot block it.
			revocationSecret("other-workspace", otto, "", "x", SecretType),
			revocationSecret("unknown-identity", "spiffe://example.com/edge/nobody", "", "x", SecretType),
			revocationSecret("bad-fingerprint", nora, "sha256:12", "x", SecretType),
			revocationSecret("no-reason", nora, fpTwo, "", SecretType),
		},
		wsB: {revocationSecret("otto", otto, "", "decommissioned", SecretType)},
	})
	s := newSet(t, testConfig(), kcp)
	if err := s.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := []Block{
		{Identity: nora, CertificateSHA256: fpOne, Reason: "leaked", Source: SourceAdmin},
		{Identity: otto, Reason: "decommissioned", Source: SourceAdmin},
	}
	if got := s.Blocks(); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Blocks = %+v\nwant %+v", got, want)
	}
	// One List per workspace, none again once loaded.
	if err := s.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := s.EnsureLoaded(context.Background(), nora); err != nil {
		t.Fatal(err)
	}
	if a, b := kcp.lists(wsA), kcp.lists(wsB); a != 1 || b != 1 {
		t.Errorf("Lists: %d in %s, %d in %s; want one each", a, wsA, b, wsB)
	}
}

func TestLoadFailureIsRetriedBeforeTrusting(t *testing.T) {
	kcp := newFakeKCP(map[string][]runtime.Object{
		wsA: {revocationSecret("good", nora, "", "leaked", SecretType)},
	})
	failures := 1
	kcp.workspaces[wsA].PrependReactor("list", "secrets", func(clienttesting.Action) (bool, runtime.Object, error) {
		if failures > 0 {
			failures--
			return true, nil, errors.New("kcp is down")
		}
		return false, nil, nil
	})
	s := newSet(t, testConfig(), kcp)
	err := s.Load(context.Background())
	if err == nil || !strings.Contains(err.Error(), "workspace root:a") || !strings.Contains(err.Error(), "kcp is down") {
		t.Fatalf("Load = %v, want the failure naming the workspace", err)
	}
	if _, blocked := s.Blocked(nora, ""); blocked {
		t.Fatal("blocked before any successful List")
	}
	if err := s.EnsureLoaded(context.Background(), otto); err != nil {
		t.Fatalf("workspace B loaded fine: %v", err)
	}
	if err := s.EnsureLoaded(context.Background(), nora); err != nil {
		t.Fatal(err)
	}
	if reason, blocked := s.Blocked(nora, fpOne); !blocked || reason != "leaked" {
		t.Errorf("Blocked after the retried List = %q, %v", reason, blocked)
	}
}

func TestRevokeRefusesInvalidRequests(t *testing.T) {
	tests := []struct {
		name, identity, fingerprint, reason, want string
	}{
		{name: "no identity", reason: "x", want: "identity is required"},
		{name: "unknown identity", identity: "spiffe://example.com/edge/nobody", reason: "x", want: `identity "spiffe://example.com/edge/nobody" is not configured`},
		{name: "unparsable fingerprint", identity: nora, fingerprint: "sha256:xyz", reason: "x", want: `certificate_sha256: certificate fingerprint "sha256:xyz" is not hex`},
		{name: "empty reason", identity: nora, fingerprint: fpOne, reason: " ", want: "reason is required"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			kcp := newFakeKCP(nil)
			s := newSet(t, testConfig(), kcp)
			_, err := s.Revoke(context.Background(), tc.identity, tc.fingerprint, tc.reason)
			var invalid *InvalidError
			if !errors.As(err, &invalid) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Revoke = %v, want an *InvalidError containing %q", err, tc.want)
			}
			if n := len(kcp.workspaces[wsA].Actions()); n != 0 {
				t.Errorf("an invalid request reached kcp: %d actions", n)
			}
		})
	}
}

func TestRevokeIsKeptAndSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	kcp := newFakeKCP(nil)
	s := newSet(t, testConfig(), kcp)
	b, err := s.Revoke(ctx, nora, strings.Repeat("11", 32), "leaked")
	if err != nil {
		t.Fatal(err)
	}
	if b.CertificateSHA256 != fpOne || b.Source != SourceAdmin {
		t.Errorf("block = %+v", b)
	}
	if reason, blocked := s.Blocked(nora, fpOne); !blocked || reason != "leaked" {
		t.Fatalf("Blocked = %q, %v right after Revoke", reason, blocked)
	}
	// Revoking again replaces the reason in the same Secret.
	if _, err := s.Revoke(ctx, nora, fpOne, "leaked, see OPS-1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Revoke(ctx, otto, "", "decommissioned"); err != nil {
		t.Fatal(err)
	}
	sec, err := kcp.workspaces[wsA].CoreV1().Secrets(ns).Get(ctx, SecretName(nora, fpOne), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if sec.Type != SecretType || string(sec.Data[KeyReason]) != "leaked, see OPS-1" || sec.Labels[LabelManagedBy] != ManagedBy {
		t.Errorf("Secret = %+v", sec)
	}
	if _, err := kcp.workspaces[wsB].CoreV1().Secrets(ns).Get(ctx, SecretName(otto, ""), metav1.GetOptions{}); err != nil {
		t.Errorf("otto's block is not kept in its export's workspace: %v", err)
	}

	restarted := newSet(t, testConfig(), kcp)
	if err := restarted.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if reason, blocked := restarted.Blocked(nora, fpOne); !blocked || reason != "leaked, see OPS-1" {
		t.Errorf("after a restart Blocked(nora) = %q, %v", reason, blocked)
	}
	if reason, blocked := restarted.Blocked(otto, fpTwo); !blocked || reason != "decommissioned" {
		t.Errorf("after a restart Blocked(otto) = %q, %v", reason, blocked)
	}
}

func TestRevokeFailsWhenKCPDoes(t *testing.T) {
	kcp := newFakeKCP(nil)
	kcp.workspaces[wsA].PrependReactor("create", "secrets", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("forbidden")
	})
	s := newSet(t, testConfig(), kcp)
	_, err := s.Revoke(context.Background(), nora, "", "x")
	if err == nil || !strings.Contains(err.Error(), "workspace root:a") {
		t.Fatalf("Revoke = %v, want the kcp failure", err)
	}
	if _, blocked := s.Blocked(nora, ""); blocked {
		t.Error("a block that was not kept must not apply (it would vanish at restart)")
	}
}

func TestConcurrentUse(t *testing.T) {
	s := newSet(t, testConfig(), newFakeKCP(nil))
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(2)
		go func() {
			defer wg.Done()
			if _, err := s.Revoke(context.Background(), nora, fmt.Sprintf("%064x", i), "x"); err != nil {
				t.Error(err)
			}
		}()
		go func() {
			defer wg.Done()
			_, _ = s.Blocked(nora, fmt.Sprintf("sha256:%064x", i))
			_ = s.EnsureLoaded(context.Background(), nora)
		}()
	}
	wg.Wait()
	if n := len(s.Blocks()); n != 4 {
		t.Errorf("%d blocks, want 4", n)
	}
}

// TestLoadListsWorkspacesInParallel: a broker with exports in many
// workspaces lists their revocations side by side before it serves, a
// bounded number at once (one after another, 100 workspaces delayed a
// restarted broker's first handshake by more than a second).
func TestLoadListsWorkspacesInParallel(t *testing.T) {
	const workspaces = 40
	cfg := &config.Config{}
	kcp := &fakeKCP{workspaces: map[string]*fake.Clientset{}}
	var inFlight, most atomic.Int32
	for i := range workspaces {
		ws := fmt.Sprintf("root:ws-%02d", i)
		cfg.Edges = append(cfg.Edges, config.Edge{Identity: fmt.Sprintf("spiffe://example.com/edge/e%02d", i), APIExport: config.APIExportRef{Workspace: ws, Name: "x.example.com"}})
		c := fake.NewSimpleClientset()
		c.PrependReactor("list", "secrets", func(clienttesting.Action) (bool, runtime.Object, error) {
			n := inFlight.Add(1)
			for {
				m := most.Load()
				if n <= m || most.CompareAndSwap(m, n) {
					break
				}
			}
			time.Sleep(20 * time.Millisecond)
			inFlight.Add(-1)
			return false, nil, nil
		})
		kcp.workspaces[ws] = c
	}
	s := newSet(t, cfg, kcp)
	if err := s.Load(context.Background()); err != nil {
		t.Fatal(err)
	}
	if m := most.Load(); m < 2 || m > loadParallel {
		t.Errorf("at most %d Lists at once, want between 2 and %d", m, loadParallel)
	}
	for ws := range kcp.workspaces {
		if n := kcp.lists(ws); n != 1 {
			t.Errorf("%d Lists in %s, want 1", n, ws)
		}
	}
}

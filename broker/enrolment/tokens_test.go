package enrolment

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/ferry-dev/ferry/broker/config"
)

// fakeWorkspaces is one fake clientset per workspace.
type fakeWorkspaces map[string]*fake.Clientset

func (f fakeWorkspaces) Secrets(workspace string) (corev1client.SecretsGetter, error) {
	c, ok := f[workspace]
	if !ok {
		c = fake.NewClientset()
		f[workspace] = c
	}
	return c.CoreV1(), nil
}

func testConfig() *config.Config {
	return &config.Config{Edges: []config.Edge{
		{Identity: "spiffe://x/alice", Name: "alice", APIExport: config.APIExportRef{Workspace: "root:a", Name: "a.example.com"}},
		{Identity: "spiffe://x/bob", Name: "bob", APIExport: config.APIExportRef{Workspace: "root:b", Name: "b.example.com"}},
	}}
}

func TestTokenStoreCreate(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name        string
		identity    string
		ttl         time.Duration
		wantErr     string
		wantExpires time.Time
	}{
		{name: "default lifetime", identity: "spiffe://x/alice", wantExpires: now.Add(time.Hour)},
		{name: "explicit lifetime", identity: "spiffe://x/bob", ttl: 48 * time.Hour, wantExpires: now.Add(48 * time.Hour)},
		{name: "not configured", identity: "spiffe://x/eve", wantErr: "not a configured edge"},
		{name: "too long", identity: "spiffe://x/alice", ttl: 8 * 24 * time.Hour, wantErr: "exceeds the maximum"},
		{name: "negative", identity: "spiffe://x/alice", ttl: -time.Second, wantErr: "not positive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ws := fakeWorkspaces{}
			s := NewTokenStore(ws, "ferry-state", testConfig(), clocktesting.NewFakePassiveClock(now))
			tok, err := s.Create(ctx, tc.identity, tc.ttl)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Create error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			entry, _ := testConfig().EdgeFor(tc.identity)
			if !strings.HasPrefix(tok.Value, entry.Name+".") || len(tok.Value) < len(entry.Name)+1+43 {
				t.Errorf("token %q is not <name>.<32 bytes base64url>", tok.Value)
			}
			if !tok.Expires.Equal(tc.wantExpires) {
				t.Errorf("expires = %s, want %s", tok.Expires, tc.wantExpires)
			}
			list, err := ws[entry.APIExport.Workspace].CoreV1().Secrets("ferry-state").List(ctx, metav1.ListOptions{})
			if err != nil || len(list.Items) != 1 {
				t.Fatalf("secrets in the export's workspace = %v, %v; want one", list, err)
			}
			sec := list.Items[0]
			if sec.Type != SecretType || string(sec.Data[keyIdentity]) != tc.identity {
				t.Errorf("secret = type %s, identity %q", sec.Type, sec.Data[keyIdentity])
			}
			for k, v := range sec.Data {
				if strings.Contains(string(v), strings.SplitN(tok.Value, ".", 2)[1]) {
					t.Errorf("the token's secret is stored in plain text (data %s)", k)
				}
			}
			if sec.Labels[labelEdge] != entry.Name {
				t.Errorf("labels = %v", sec.Labels)
			}
		})
	}
}

func TestTokenStoreRedeem(t *testing.T) {
	ctx := context.Background()
	now := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	type step struct {
		token        func(alice, bob string) string
		advance      time.Duration
		wantIdentity string
		wantErr      error
		wantExpired  bool
	}
	aliceToken := func(a, _ string) string { return a }
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{name: "redeemed once, then used", steps: []step{
			{token: aliceToken, wantIdentity: "spiffe://x/alice"},
			{token: aliceToken, wantErr: ErrTokenUnknown},
		}},
		{name: "each token names its own identity", steps: []step{
			{token: func(_, b string) string { return b }, wantIdentity: "spiffe://x/bob"},
			{token: aliceToken, wantIdentity: "spiffe://x/alice"},
		}},
		{name: "another edge's name does not find the token", steps: []step{
			{token: func(a, _ string) string { return "bob." + strings.SplitN(a, ".", 2)[1] }, wantErr: ErrTokenUnknown},
			{token: aliceToken, wantIdentity: "spiffe://x/alice"},
		}},
		{name: "a guessed secret is unknown", steps: []step{
			{token: func(a, _ string) string { return a[:len(a)-2] + "AA" }, wantErr: ErrTokenUnknown},
		}},
		{name: "malformed", steps: []step{{token: func(string, string) string { return "nodot" }, wantErr: ErrTokenFormat}}},
		{name: "expired, and deleted", steps: []step{
			{token: aliceToken, advance: time.Hour, wantExpired: true},
			{token: aliceToken, wantErr: ErrTokenUnknown},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakePassiveClock(now)
			s := NewTokenStore(fakeWorkspaces{}, "ferry-state", testConfig(), clk)
			a, err := s.Create(ctx, "spiffe://x/alice", 0)
			if err != nil {
				t.Fatal(err)
			}
			b, err := s.Create(ctx, "spiffe://x/bob", 0)
			if err != nil {
				t.Fatal(err)
			}
			for i, st := range tc.steps {
				clk.SetTime(clk.Now().Add(st.advance))
				id, err := s.Redeem(ctx, st.token(a.Value, b.Value))
				var expired *TokenExpiredError
				switch {
				case st.wantExpired:
					if !errors.As(err, &expired) || !expired.At.Equal(a.Expires) ||
						err.Error() != "enrolment token expired at 2026-03-01T11:00:00Z" {
						t.Fatalf("step %d: Redeem error = %v, want expired at %s", i, err, a.Expires)
					}
				case st.wantErr != nil:
					if !errors.Is(err, st.wantErr) {
						t.Fatalf("step %d: Redeem error = %v, want %v", i, err, st.wantErr)
					}
				default:
					if err != nil || id != st.wantIdentity {
						t.Fatalf("step %d: Redeem = %q, %v; want %q", i, id, err, st.wantIdentity)
					}
				}
			}
		})
	}
}

// TestTokenStoreRedeemLosesTheRace: a Secret deleted between the read and
// the delete (another redemption won) is "used", never a second identity.
func TestTokenStoreRedeemLosesTheRace(t *testing.T) {
	ctx := context.Background()
	cs := fake.NewClientset()
	ws := fakeWorkspaces{"root:a": cs}
	s := NewTokenStore(ws, "ferry-state", testConfig(), clocktesting.NewFakePassiveClock(time.Now()))
	if _, err := s.Create(ctx, "spiffe://x/alice", 0); err != nil {
		t.Fatal(err)
	}
	secrets := cs.CoreV1().Secrets("ferry-state")
	list, _ := secrets.List(ctx, metav1.ListOptions{})
	obj := list.Items[0]
	if err := secrets.Delete(ctx, obj.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.consume(ctx, secrets, &obj); !errors.Is(err, ErrTokenUsed) {
		t.Fatalf("consume after a concurrent redemption = %v, want ErrTokenUsed", err)
	}
}

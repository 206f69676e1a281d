package enrolment

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/utils/clock"

	"github.com/ferry-dev/ferry/broker/config"
)

const (
	// SecretType marks the Secrets that hold enrolment token hashes.
	SecretType corev1.SecretType = "ferry.dev/enrolment-token"
	// DefaultTokenTTL is how long a token is accepted unless asked for
	// otherwise.
	DefaultTokenTTL = time.Hour
	// MaxTokenTTL bounds a token's lifetime: it is a bearer credential.
	MaxTokenTTL = 7 * 24 * time.Hour
	// secretBytes is the token's randomness.
	secretBytes = 32
	// secretNamePrefix starts every token Secret's name.
	secretNamePrefix = "ferry-enrolment-"

	labelManagedBy = "app.kubernetes.io/managed-by"
	labelComponent = "app.kubernetes.io/component"
	labelEdge      = "ferry.dev/edge"
	// Data keys of a token Secret.
	keyIdentity = "identity"
	keyExpires  = "expires"
	keyHash     = "sha256"
)

// Token errors. Their texts go to the caller; they say what is wrong with
// the token, never whose it is.
var (
	ErrTokenUnknown = errors.New("enrolment token is unknown or was already used")
	ErrTokenUsed    = errors.New("enrolment token was already used")
	ErrTokenFormat  = errors.New("enrolment token is malformed (want <edge name>.<secret>)")
	// ErrNotConfigured refuses a token for an identity the configuration
	// does not list.
	ErrNotConfigured = errors.New("not a configured edge")
)

// TokenExpiredError refuses a token past its expiry.
type TokenExpiredError struct{ At time.Time }

func (e *TokenExpiredError) Error() string {
	return "enrolment token expired at " + e.At.UTC().Format(time.RFC3339)
}

// Token is a created enrolment token.
type Token struct {
	// Value is shown once, to the operator; only its hash is kept.
	Value string
	// Expires is when the token stops being accepted.
	Expires time.Time
	// Secret is the namespace/name of the Secret holding its hash, in
	// Workspace.
	Secret, Workspace string
}

// TokenStore keeps enrolment tokens as hashed Secrets in the workspace of
// the APIExport each edge serves, in one namespace. Tokens name the edge
// (its configuration entry's ResolvedName) so redeeming one reads a single
// Secret in the right workspace without listing anything.
type TokenStore struct {
	clients   Clients
	namespace string
	cfg       *config.Config
	clock     clock.PassiveClock
}

// NewTokenStore returns a store writing to namespace through clients.
func NewTokenStore(clients Clients, namespace string, cfg *config.Config, clk clock.PassiveClock) *TokenStore {
	return &TokenStore{clients: clients, namespace: namespace, cfg: cfg, clock: clk}
}

// ValidateTTL applies the default to zero and checks the bounds.
func ValidateTTL(ttl time.Duration) (time.Duration, error) {
	switch {
	case ttl == 0:
		return DefaultTokenTTL, nil
	case ttl < 0:
		return 0, fmt.Errorf("token lifetime %s is not positive", ttl)
	case ttl > MaxTokenTTL:
		return 0, fmt.Errorf("token lifetime %s exceeds the maximum %s", ttl, MaxTokenTTL)
	}
	return ttl, nil
}

// Create issues a token for the configured identity, valid for ttl (zero:
// the default).
func (s *TokenStore) Create(ctx context.Context, identity string, ttl time.Duration) (*Token, error) {
	entry, ok := s.cfg.EdgeFor(identity)
	if !ok {
		return nil, fmt.Errorf("identity %q is %w", identity, ErrNotConfigured)
	}
	ttl, err := ValidateTTL(ttl)
	if err != nil {
		return nil, err
	}
	secret := make([]byte, secretBytes)
	_, _ = rand.Read(secret) // never fails (crypto/rand, Go 1.24+)
	value := entry.ResolvedName() + "." + base64.RawURLEncoding.EncodeToString(secret)
	hash := tokenHash(value)
	expires := s.clock.Now().Add(ttl).UTC().Truncate(time.Second)
	obj := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{
			Name:      secretName(hash),
			Namespace: s.namespace,
			Labels: map[string]string{
				labelManagedBy: "ferry-broker",
				labelComponent: "enrolment-token",
				labelEdge:      entry.ResolvedName(),
			},
			Annotations: map[string]string{"ferry.dev/expires": expires.Format(time.RFC3339)},
		},
		Type: SecretType,
		Data: map[string][]byte{
			keyIdentity: []byte(identity),
			keyExpires:  []byte(expires.Format(time.RFC3339)),
			keyHash:     []byte(hash),
		},
	}
	workspace := entry.APIExport.Workspace
	client, err := s.clients.Secrets(workspace)
	if err != nil {
		return nil, err
	}
	if _, err := client.Secrets(s.namespace).Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		return nil, fmt.Errorf("cannot store the enrolment token in workspace %s, namespace %s: %w", workspace, s.namespace, err)
	}
	return &Token{Value: value, Expires: expires, Secret: s.namespace + "/" + obj.Name, Workspace: workspace}, nil
}

// Redeem consumes a token and returns the identity it names. The Secret is
// deleted (with UID and resourceVersion preconditions) before the caller
// signs anything, so two concurrent redemptions cannot both succeed.
func (s *TokenStore) Redeem(ctx context.Context, token string) (string, error) {
	name, secret, ok := strings.Cut(token, ".")
	if !ok || name == "" || secret == "" {
		return "", ErrTokenFormat
	}
	hash := tokenHash(token)
	for _, workspace := range s.workspacesOf(name) {
		client, err := s.clients.Secrets(workspace)
		if err != nil {
			return "", err
		}
		secrets := client.Secrets(s.namespace)
		obj, err := secrets.Get(ctx, secretName(hash), metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return "", fmt.Errorf("cannot read the enrolment token: %w", err)
		}
		if obj.Type != SecretType || subtle.ConstantTimeCompare(obj.Data[keyHash], []byte(hash)) != 1 {
			continue
		}
		identity, err := s.consume(ctx, secrets, obj)
		if err != nil {
			return "", err
		}
		return identity, nil
	}
	return "", ErrTokenUnknown
}

// consume deletes the token's Secret and checks it was usable.
func (s *TokenStore) consume(ctx context.Context, secrets corev1client.SecretInterface, obj *corev1.Secret) (string, error) {
	uid, rv := obj.UID, obj.ResourceVersion
	err := secrets.Delete(ctx, obj.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
	switch {
	case apierrors.IsNotFound(err) || apierrors.IsConflict(err):
		return "", ErrTokenUsed
	case err != nil:
		return "", fmt.Errorf("cannot consume the enrolment token: %w", err)
	}
	expires, err := time.Parse(time.RFC3339, string(obj.Data[keyExpires]))
	if err != nil {
		return "", fmt.Errorf("enrolment token record %s has no valid expiry: %w", obj.Name, err)
	}
	if !s.clock.Now().Before(expires) {
		return "", &TokenExpiredError{At: expires}
	}
	identity := string(obj.Data[keyIdentity])
	if _, ok := s.cfg.EdgeFor(identity); !ok {
		return "", fmt.Errorf("the identity of this enrolment token is no longer a configured edge")
	}
	return identity, nil
}

// workspacesOf lists, once each, the workspaces of the APIExports the
// entries named name serve.
func (s *TokenStore) workspacesOf(name string) []string {
	var out []string
	seen := map[string]bool{}
	for _, e := range s.cfg.Edges {
		if e.ResolvedName() != name || seen[e.APIExport.Workspace] {
			continue
		}
		seen[e.APIExport.Workspace] = true
		out = append(out, e.APIExport.Workspace)
	}
	return out
}

// tokenHash is the hex SHA-256 of the whole token.
func tokenHash(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// secretName derives the Secret's name from the hash: finding it needs the
// token, and the name reveals nothing usable.
func secretName(hash string) string { return secretNamePrefix + hash[:40] }

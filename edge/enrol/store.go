package enrol

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// Data keys of the credentials Secret (type kubernetes.io/tls, so kubectl
// and cert tooling read it as usual).
const (
	KeyCertificate = corev1.TLSCertKey       // tls.crt: the chain, leaf first
	KeyPrivateKey  = corev1.TLSPrivateKeyKey // tls.key: PKCS#8
	KeyCABundle    = "ca.crt"                // the broker's CA bundle
)

// DefaultSecretName is the credentials Secret's name unless
// --credentials-secret says otherwise.
const DefaultSecretName = "ferry-edge-credentials"

// serviceAccountNamespaceFile holds the namespace of a pod's service
// account.
const serviceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// DefaultSecret is "<namespace>/ferry-edge-credentials" in the namespace of
// the pod's service account, or ferry-system outside a pod.
func DefaultSecret() string {
	ns := "ferry-system"
	if b, err := os.ReadFile(serviceAccountNamespaceFile); err == nil && strings.TrimSpace(string(b)) != "" {
		ns = strings.TrimSpace(string(b))
	}
	return ns + "/" + DefaultSecretName
}

// ParseSecretRef splits "namespace/name".
func ParseSecretRef(s string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(s, "/")
	if !ok || namespace == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("%q is not namespace/name", s)
	}
	return namespace, name, nil
}

// SecretStore keeps the edge's credentials in a Secret of the service
// cluster, so a restarted edge reuses them (the token is single use).
type SecretStore struct {
	Client          corev1client.SecretsGetter
	Namespace, Name string
}

func (s *SecretStore) String() string { return s.Namespace + "/" + s.Name }

// ErrNoCredentials is returned by Load when the Secret does not exist.
var ErrNoCredentials = errors.New("no credentials stored")

// Load returns the stored credentials. ErrNoCredentials when the Secret is
// absent; another error (naming the Secret) when it is unreadable, invalid
// or expired.
func (s *SecretStore) Load(ctx context.Context, now time.Time) (*tlsconfig.Credentials, error) {
	sec, err := s.Client.Secrets(s.Namespace).Get(ctx, s.Name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil, fmt.Errorf("Secret %s: %w", s, ErrNoCredentials)
	}
	if err != nil {
		return nil, fmt.Errorf("cannot read the credentials Secret %s: %w", s, err)
	}
	creds, err := tlsconfig.ParseCredentials(sec.Data[KeyCertificate], sec.Data[KeyPrivateKey], sec.Data[KeyCABundle], now)
	if err != nil {
		return nil, fmt.Errorf("credentials Secret %s: %w", s, err)
	}
	return creds, nil
}

// The labels that mark the credentials Secret as the edge's own.
const (
	labelManagedBy       = "app.kubernetes.io/managed-by"
	managedByEdge        = "ferry-edge"
	labelComponent       = "app.kubernetes.io/component"
	componentCredentials = "credentials"
)

// Save writes the credentials, creating the Secret or replacing its data;
// it never overwrites a Secret it did not make (its labels say).
func (s *SecretStore) Save(ctx context.Context, creds *tlsconfig.Credentials) error {
	chain, key, err := creds.PEM()
	if err != nil {
		return err
	}
	data := map[string][]byte{KeyCertificate: chain, KeyPrivateKey: key, KeyCABundle: creds.CABundlePEM}
	secrets := s.Client.Secrets(s.Namespace)
	cur, err := secrets.Get(ctx, s.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = secrets.Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace, Labels: map[string]string{
				labelManagedBy: managedByEdge,
				labelComponent: componentCredentials,
			}},
			Type: corev1.SecretTypeTLS,
			Data: data,
		}, metav1.CreateOptions{})
	case err == nil && (cur.Labels[labelManagedBy] != managedByEdge || cur.Labels[labelComponent] != componentCredentials):
		// Somebody else's Secret (a wrong --credentials-secret): never
		// overwrite it.
		return fmt.Errorf("credentials Secret %s exists and was not made by ferry-edge (labels %s=%s, %s=%s missing): choose another --credentials-secret",
			s, labelManagedBy, managedByEdge, labelComponent, componentCredentials)
	case err == nil:
		cur.Data = data
		_, err = secrets.Update(ctx, cur, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("cannot write the credentials Secret %s: %w", s, err)
	}
	return nil
}

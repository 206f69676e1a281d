package kcp

import (
	"fmt"
	"net/http"
	"strings"
	"sync"

	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
)

// SecretsClients returns the Secrets client of a kcp workspace (by path,
// e.g. "root:org"): where the broker keeps its state (hashed enrolment
// tokens, revocations). Implementations must be safe for concurrent use.
type SecretsClients interface {
	Secrets(workspace string) (corev1client.SecretsGetter, error)
}

// SecretsClientsFunc adapts a function to SecretsClients.
type SecretsClientsFunc func(workspace string) (corev1client.SecretsGetter, error)

// Secrets calls f.
func (f SecretsClientsFunc) Secrets(workspace string) (corev1client.SecretsGetter, error) {
	return f(workspace)
}

// workspaceSecrets builds one core/v1 client per workspace on demand, all
// sharing one HTTP client and the rest config's rate limiter.
type workspaceSecrets struct {
	base *rest.Config
	host string
	http *http.Client

	mu      sync.Mutex
	clients map[string]corev1client.SecretsGetter
}

// NewSecretsClients returns SecretsClients for the kcp server of cfg (the broker's kcp
// credentials); any /clusters/... path on its host is replaced by the
// workspace's.
func NewSecretsClients(cfg *rest.Config) (SecretsClients, error) {
	host, err := BaseHost(cfg.Host)
	if err != nil {
		return nil, err
	}
	base := rest.CopyConfig(cfg)
	base.Host = host
	httpClient, err := rest.HTTPClientFor(base)
	if err != nil {
		return nil, fmt.Errorf("cannot build the kcp HTTP client for the broker's state Secrets: %w", err)
	}
	return &workspaceSecrets{base: base, host: strings.TrimRight(host, "/"), http: httpClient, clients: map[string]corev1client.SecretsGetter{}}, nil
}

func (c *workspaceSecrets) Secrets(workspace string) (corev1client.SecretsGetter, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if client, ok := c.clients[workspace]; ok {
		return client, nil
	}
	cfg := rest.CopyConfig(c.base)
	cfg.Host = c.host + "/clusters/" + workspace
	client, err := corev1client.NewForConfigAndClient(cfg, c.http)
	if err != nil {
		return nil, fmt.Errorf("cannot build the Secrets client of workspace %s: %w", workspace, err)
	}
	c.clients[workspace] = client
	return client, nil
}

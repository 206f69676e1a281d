package kcp

import (
	"fmt"
	"net/http"
	"strings"
	"sync"

	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
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

// LeasesClients returns the Leases client of a kcp workspace (the edge
// Leases). Implementations must be safe for concurrent use.
type LeasesClients interface {
	Leases(workspace string) (coordinationv1client.LeasesGetter, error)
}

// LeasesClientsFunc adapts a function to LeasesClients.
type LeasesClientsFunc func(workspace string) (coordinationv1client.LeasesGetter, error)

// Leases calls f.
func (f LeasesClientsFunc) Leases(workspace string) (coordinationv1client.LeasesGetter, error) {
	return f(workspace)
}

// NewSecretsClients returns SecretsClients for the kcp server of cfg (the
// broker's kcp credentials).
func NewSecretsClients(cfg *rest.Config) (SecretsClients, error) {
	c, err := newWorkspaceClients(cfg, "Secrets", func(cfg *rest.Config, h *http.Client) (corev1client.SecretsGetter, error) {
		return corev1client.NewForConfigAndClient(cfg, h)
	})
	if err != nil {
		return nil, err
	}
	return SecretsClientsFunc(c.get), nil
}

// NewLeasesClients returns LeasesClients for the kcp server of cfg (the
// broker's kcp credentials).
func NewLeasesClients(cfg *rest.Config) (LeasesClients, error) {
	c, err := newWorkspaceClients(cfg, "Leases", func(cfg *rest.Config, h *http.Client) (coordinationv1client.LeasesGetter, error) {
		return coordinationv1client.NewForConfigAndClient(cfg, h)
	})
	if err != nil {
		return nil, err
	}
	return LeasesClientsFunc(c.get), nil
}

// workspaceClients builds one typed client per workspace on demand, all
// sharing one HTTP client (connections, TLS) and the rest config's rate
// limiter; any /clusters/... path on the configured host is replaced by
// the workspace's.
type workspaceClients[T any] struct {
	base  *rest.Config
	host  string
	http  *http.Client
	what  string
	build func(*rest.Config, *http.Client) (T, error)

	mu      sync.Mutex
	clients map[string]T
}

func newWorkspaceClients[T any](cfg *rest.Config, what string, build func(*rest.Config, *http.Client) (T, error)) (*workspaceClients[T], error) {
	host, err := BaseHost(cfg.Host)
	if err != nil {
		return nil, err
	}
	base := rest.CopyConfig(cfg)
	base.Host = host
	httpClient, err := rest.HTTPClientFor(base)
	if err != nil {
		return nil, fmt.Errorf("cannot build the kcp HTTP client for %s: %w", what, err)
	}
	return &workspaceClients[T]{base: base, host: strings.TrimRight(host, "/"), http: httpClient, what: what, build: build, clients: map[string]T{}}, nil
}

func (c *workspaceClients[T]) get(workspace string) (T, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if client, ok := c.clients[workspace]; ok {
		return client, nil
	}
	cfg := rest.CopyConfig(c.base)
	cfg.Host = c.host + "/clusters/" + workspace
	client, err := c.build(cfg, c.http)
	if err != nil {
		var zero T
		return zero, fmt.Errorf("cannot build the %s client of workspace %s: %w", c.what, workspace, err)
	}
	c.clients[workspace] = client
	return client, nil
}

package kcp

import (
	"fmt"
	"net/url"
	"slices"

	apisv1alpha1 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha1"
)

// EndpointRewriteFlag is the broker's flag setting an EndpointRewrite.
const EndpointRewriteFlag = "virtual-workspace-url-rewrite"

// EndpointRewriteUsage documents EndpointRewriteFlag.
const EndpointRewriteUsage = "Base URL (scheme://host[:port], e.g. the kcp front-proxy's) that replaces the scheme and host of every virtual workspace URL kcp lists, keeping the path: for a sharded kcp whose shards list URLs the broker cannot reach (kcp issue #3830). Empty uses the URLs as listed."

// EndpointRewrite maps the virtual workspace URLs an APIExportEndpointSlice
// lists to URLs the broker can reach. On a sharded kcp every shard lists its
// own, shard-internal URL (kcp issue #3830): a broker outside kcp's network
// reaches the shards only through the front-proxy, which serves the same
// paths. The zero value keeps every URL as it is.
type EndpointRewrite struct {
	// base holds the scheme and host every endpoint URL gets; nil keeps
	// them.
	base *url.URL
}

// ParseEndpointRewrite parses a base URL ("https://front-proxy:8443"):
// every endpoint URL keeps its path and takes the base's scheme and host.
// "" is no rewrite. A base with a path, query or fragment is refused: it
// would be dropped silently.
func ParseEndpointRewrite(base string) (EndpointRewrite, error) {
	if base == "" {
		return EndpointRewrite{}, nil
	}
	u, err := url.Parse(base)
	if err != nil {
		return EndpointRewrite{}, fmt.Errorf("invalid virtual workspace URL rewrite %q: %w", base, err)
	}
	switch {
	case u.Scheme != "https" && u.Scheme != "http":
		return EndpointRewrite{}, fmt.Errorf("invalid virtual workspace URL rewrite %q: the scheme must be https or http", base)
	case u.Host == "":
		return EndpointRewrite{}, fmt.Errorf("invalid virtual workspace URL rewrite %q: a host is required", base)
	case (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return EndpointRewrite{}, fmt.Errorf("invalid virtual workspace URL rewrite %q: only a scheme and host[:port] are allowed (endpoint paths are kept)", base)
	}
	return EndpointRewrite{base: &url.URL{Scheme: u.Scheme, Host: u.Host}}, nil
}

// Apply returns endpoint with the base's scheme and host; an endpoint that
// is not a URL is returned unchanged (its watches then report why they fail).
func (r EndpointRewrite) Apply(endpoint string) string {
	if r.base == nil {
		return endpoint
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return endpoint
	}
	u.Scheme, u.Host = r.base.Scheme, r.base.Host
	return u.String()
}

// String is the base, or "" for no rewrite.
func (r EndpointRewrite) String() string {
	if r.base == nil {
		return ""
	}
	return r.base.String()
}

// endpointURLs is every virtual workspace URL slice lists (nil slice:
// none), rewritten, sorted and without duplicates: one per shard that serves
// workspaces bound to the export. Sorted, so that an unchanged set compares
// equal whatever order kcp lists it in.
func endpointURLs(slice *apisv1alpha1.APIExportEndpointSlice, rewrite EndpointRewrite) []string {
	if slice == nil {
		return nil
	}
	var urls []string
	for _, e := range slice.Status.APIExportEndpoints {
		if e.URL != "" {
			urls = append(urls, rewrite.Apply(e.URL))
		}
	}
	slices.Sort(urls)
	return slices.Compact(urls)
}

package kcp

import (
	"fmt"
	"net/url"
	"slices"
	"strings"

	apisv1alpha1 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha1"
)

// EndpointRewriteFlag is the broker's flag setting an EndpointRewrite.
const EndpointRewriteFlag = "virtual-workspace-url-rewrite"

// EndpointRewriteUsage documents EndpointRewriteFlag.
const EndpointRewriteUsage = "FROM=TO, repeatable: a virtual workspace URL kcp lists whose scheme and host[:port] are FROM is reached at TO's scheme and host[:port] instead, its path kept (e.g. https://shard-1.kcp.svc:6443=https://shard-1.kcp.example.com). For shards that list URLs the broker cannot reach (kcp issue #3830). URLs no entry names are used as listed."

// EndpointRewrite maps the virtual workspace URLs an APIExportEndpointSlice
// lists to URLs the broker can reach. On a sharded kcp every shard lists its
// own, often shard-internal URL (kcp issue #3830). Each shard is mapped on
// its own, by scheme and host: the paths are the same on every shard
// (/services/apiexport/<cluster>/<export>), so one base for all shards would
// turn every shard's endpoint into the same URL and watch only one of them.
// The zero value keeps every URL as it is.
type EndpointRewrite struct {
	// hosts maps "scheme://host[:port]" to the scheme and host to use.
	hosts map[string]*url.URL
}

// ParseEndpointRewrite parses FROM=TO entries, each side a scheme and a
// host[:port]. An entry with a path, query or credentials is refused (they
// would be dropped silently), and so are two entries for one FROM or two
// FROMs mapped to one TO (that would merge two shards' endpoints into one).
func ParseEndpointRewrite(entries []string) (EndpointRewrite, error) {
	r := EndpointRewrite{}
	targets := map[string]string{}
	for _, entry := range entries {
		from, to, ok := strings.Cut(entry, "=")
		if !ok {
			return EndpointRewrite{}, fmt.Errorf("invalid virtual workspace URL rewrite %q: want FROM=TO, e.g. https://shard-1.kcp.svc:6443=https://shard-1.kcp.example.com", entry)
		}
		fromURL, err := parseSchemeHost(from)
		if err != nil {
			return EndpointRewrite{}, fmt.Errorf("invalid virtual workspace URL rewrite %q: FROM: %w", entry, err)
		}
		toURL, err := parseSchemeHost(to)
		if err != nil {
			return EndpointRewrite{}, fmt.Errorf("invalid virtual workspace URL rewrite %q: TO: %w", entry, err)
		}
		key, target := fromURL.String(), toURL.String()
		if _, dup := r.hosts[key]; dup {
			return EndpointRewrite{}, fmt.Errorf("invalid virtual workspace URL rewrite %q: %s is rewritten twice", entry, key)
		}
		if other, dup := targets[target]; dup {
			return EndpointRewrite{}, fmt.Errorf("invalid virtual workspace URL rewrite %q: %s and %s would both become %s, and their shards' endpoints one URL", entry, other, key, target)
		}
		if r.hosts == nil {
			r.hosts = map[string]*url.URL{}
		}
		r.hosts[key], targets[target] = toURL, key
	}
	return r, nil
}

// parseSchemeHost parses "scheme://host[:port]" (a trailing slash allowed).
func parseSchemeHost(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, err
	}
	switch {
	case u.Scheme != "https" && u.Scheme != "http":
		return nil, fmt.Errorf("%q: the scheme must be https or http", s)
	case u.Host == "":
		return nil, fmt.Errorf("%q: a host is required", s)
	case (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" || u.User != nil:
		return nil, fmt.Errorf("%q: only a scheme and host[:port] are allowed (endpoint paths are kept)", s)
	}
	return &url.URL{Scheme: u.Scheme, Host: strings.ToLower(u.Host)}, nil
}

// Apply returns endpoint with its scheme and host mapped; an endpoint that no
// entry names, or that is not a URL, is returned unchanged (the watches then
// report why they fail).
func (r EndpointRewrite) Apply(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil || len(r.hosts) == 0 {
		return endpoint
	}
	to, ok := r.hosts[(&url.URL{Scheme: u.Scheme, Host: strings.ToLower(u.Host)}).String()]
	if !ok {
		return endpoint
	}
	u.Scheme, u.Host = to.Scheme, to.Host
	return u.String()
}

// String lists the entries as FROM=TO, sorted; "" for no rewrite.
func (r EndpointRewrite) String() string {
	out := make([]string, 0, len(r.hosts))
	for from, to := range r.hosts {
		out = append(out, from+"="+to.String())
	}
	slices.Sort(out)
	return strings.Join(out, ",")
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

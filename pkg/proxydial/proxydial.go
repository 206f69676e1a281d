// Package proxydial is how the edge opens TCP connections to the broker:
// directly, or through an HTTP CONNECT proxy, which is how most corporate
// networks let traffic out.
//
// The proxy is --proxy-url when given (used for every address), else the
// environment as Go's net/http reads it for https URLs: HTTPS_PROXY (or
// https_proxy), except for hosts NO_PROXY (no_proxy) matches and for
// localhost and loopback addresses. HTTP_PROXY is not used: the
// connection to the broker is TLS. Proxies are http:// (the CONNECT
// request in clear, as is usual) or https:// (TLS to the proxy, verified
// against the system roots); credentials in the URL's user info are sent
// as Basic Proxy-Authorization. SOCKS proxies are not supported.
package proxydial

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"golang.org/x/net/http/httpproxy"
)

// Options configure a Dialer.
type Options struct {
	// ProxyURL is the proxy for every address (--proxy-url); empty takes
	// the proxy from Env.
	ProxyURL string
	// Env is the proxy configuration of the environment; nil reads the
	// process's (httpproxy.FromEnvironment).
	Env *httpproxy.Config
	// ProxyTLS is the TLS configuration for https:// proxies; nil verifies
	// them against the system roots. ServerName is set per proxy.
	ProxyTLS *tls.Config
}

// Dialer dials addresses directly or through the proxy its options name.
// Safe for concurrent use.
type Dialer struct {
	// proxyFor returns the proxy for addr, nil for a direct connection.
	proxyFor func(addr string) (*url.URL, error)
	source   string
	tls      *tls.Config
	net      net.Dialer
}

// New checks the options and returns a Dialer.
func New(o Options) (*Dialer, error) {
	d := &Dialer{tls: o.ProxyTLS}
	if o.ProxyURL != "" {
		u, err := parseProxyURL(o.ProxyURL)
		if err != nil {
			return nil, fmt.Errorf("--proxy-url: %w", err)
		}
		d.proxyFor = func(string) (*url.URL, error) { return u, nil }
		d.source = "--proxy-url"
		return d, nil
	}
	env := o.Env
	if env == nil {
		env = httpproxy.FromEnvironment()
	}
	if env.HTTPSProxy == "" {
		d.proxyFor = func(string) (*url.URL, error) { return nil, nil }
		return d, nil
	}
	// Checked now so that a malformed variable fails at start, not at the
	// first dial.
	if _, err := parseProxyURL(env.HTTPSProxy); err != nil {
		return nil, fmt.Errorf("HTTPS_PROXY: %w", err)
	}
	proxyFunc := env.ProxyFunc()
	d.proxyFor = func(addr string) (*url.URL, error) {
		u, err := proxyFunc(&url.URL{Scheme: "https", Host: addr})
		if err != nil || u == nil {
			return nil, err
		}
		return parseProxyURL(u.String())
	}
	d.source = "HTTPS_PROXY"
	return d, nil
}

// parseProxyURL reads a proxy URL; a bare host:port means http://.
func parseProxyURL(s string) (*url.URL, error) {
	if !strings.Contains(s, "://") {
		s = "http://" + s
	}
	u, err := url.Parse(s)
	if err != nil {
		// url's error quotes the whole input, credentials included.
		return nil, errors.New("not a URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return nil, fmt.Errorf("proxy scheme %q is not supported (http or https)", u.Scheme)
	}
	if u.Hostname() == "" {
		return nil, errors.New("proxy URL has no host")
	}
	return u, nil
}

// Route describes how addr is reached, without credentials: "direct" or
// "proxy http://proxy:3128 (HTTPS_PROXY)". For the start-up log.
func (d *Dialer) Route(addr string) string {
	u, err := d.proxyFor(addr)
	switch {
	case err != nil:
		return "invalid proxy configuration: " + err.Error()
	case u == nil:
		return "direct"
	}
	return fmt.Sprintf("proxy %s (%s)", redacted(u), d.source)
}

// Dial connects to addr (host:port), through the proxy when there is one.
// It returns when ctx ends, with ctx's error. Bytes the proxy sent past
// its CONNECT answer are the first the returned connection reads.
func (d *Dialer) Dial(ctx context.Context, addr string) (net.Conn, error) {
	proxy, err := d.proxyFor(addr)
	if err != nil {
		return nil, fmt.Errorf("proxy for %s: %w", addr, err)
	}
	if proxy == nil {
		return d.net.DialContext(ctx, "tcp", addr)
	}
	return d.viaProxy(ctx, proxy, addr)
}

func (d *Dialer) viaProxy(ctx context.Context, proxy *url.URL, addr string) (_ net.Conn, err error) {
	name := redacted(proxy)
	conn, err := d.net.DialContext(ctx, "tcp", proxyAddress(proxy))
	if err != nil {
		return nil, fmt.Errorf("cannot reach proxy %s (for %s): %w", name, addr, err)
	}
	defer func() {
		if err != nil {
			_ = conn.Close()
		}
	}()
	// The exchange below is plain reads and writes: ctx's end (its
	// deadline included) interrupts them at once, and the error then says
	// it was ctx. Not a connection deadline copied from ctx: it could fire
	// before ctx reports its end, as a bare i/o timeout.
	raw := conn
	stop := context.AfterFunc(ctx, func() { _ = raw.SetDeadline(time.Unix(1, 0)) })
	defer func() {
		if !stop() || ctx.Err() != nil {
			err = errors.Join(err, ctx.Err()) // interrupted: say so
		}
	}()
	if proxy.Scheme == "https" {
		cfg := &tls.Config{}
		if d.tls != nil {
			cfg = d.tls.Clone()
		}
		cfg.ServerName = proxy.Hostname()
		cfg.NextProtos = []string{"http/1.1"}
		tlsConn := tls.Client(conn, cfg)
		if err := tlsConn.HandshakeContext(ctx); err != nil {
			return nil, fmt.Errorf("TLS handshake with proxy %s: %w", name, err)
		}
		conn = tlsConn
	}

	req := &http.Request{
		Method: http.MethodConnect,
		URL:    &url.URL{Opaque: addr},
		Host:   addr,
		Header: http.Header{},
	}
	if u := proxy.User; u != nil {
		pass, _ := u.Password()
		req.Header.Set("Proxy-Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(u.Username()+":"+pass)))
	}
	if err := req.Write(conn); err != nil {
		return nil, fmt.Errorf("proxy %s: sending CONNECT to %s: %w", name, addr, err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		return nil, fmt.Errorf("proxy %s: reading the answer to CONNECT %s: %w", name, addr, err)
	}
	// A CONNECT answer's body, if any, is not the tunnel's: only a 200 is
	// followed by tunnel bytes, and then there is no body.
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("proxy %s refused CONNECT to %s: %s", name, addr, resp.Status)
	}
	if err := raw.SetDeadline(time.Time{}); err != nil {
		return nil, err
	}
	if br.Buffered() > 0 {
		// The proxy (or the broker, through it) already sent tunnel bytes
		// that the reader holds: they come first.
		return &bufferedConn{Conn: conn, r: br}, nil
	}
	return conn, nil
}

// proxyAddress is the proxy's host:port, with the scheme's default port.
func proxyAddress(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// redacted is the proxy's URL without user info, path or query.
func redacted(u *url.URL) string { return u.Scheme + "://" + u.Host }

// bufferedConn reads what the CONNECT answer's reader holds first.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

package proxydial

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/net/http/httpproxy"

	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/test/connectproxy"
)

// echoServer answers every connection by echoing its lines; it returns
// its address.
func echoServer(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return lis.Addr().String()
}

// startProxy runs a connectproxy on loopback (over TLS when tlsCfg is not
// nil) and returns it and its address.
func startProxy(t *testing.T, o connectproxy.Options, tlsCfg *tls.Config) (*connectproxy.Proxy, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	if tlsCfg != nil {
		lis = tls.NewListener(lis, tlsCfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := connectproxy.New(o)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = p.Serve(ctx, lis)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	return p, addr
}

// roundTrip writes a line on conn and expects it back.
func roundTrip(t *testing.T, conn net.Conn) {
	t.Helper()
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := conn.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || line != "ping\n" {
		t.Fatalf("echo = %q, %v", line, err)
	}
}

func TestDialThroughProxyWithCredentials(t *testing.T) {
	target := echoServer(t)
	proxy, proxyAddr := startProxy(t, connectproxy.Options{Auth: "ferry:s3cret", Allow: []string{target}, Log: logr.Discard()}, nil)
	d, err := New(Options{ProxyURL: "http://ferry:s3cret@" + proxyAddr})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := d.Dial(context.Background(), target)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	roundTrip(t, conn)
	if c := proxy.Counts(); c.Accepted != 1 || c.Refused != 0 {
		t.Errorf("proxy counts %+v, want one accepted CONNECT", c)
	}
}

func TestDialRefusedByProxyNamesProxyAndStatus(t *testing.T) {
	target := echoServer(t)
	_, proxyAddr := startProxy(t, connectproxy.Options{Auth: "ferry:s3cret", Allow: []string{target}, Log: logr.Discard()}, nil)
	tests := []struct {
		name, proxyURL, target, want string
	}{
		{name: "wrong password", proxyURL: "http://ferry:wrong@" + proxyAddr, target: target,
			want: "proxy http://" + proxyAddr + " refused CONNECT to " + target + ": 407 Proxy Authentication Required"},
		{name: "no credentials", proxyURL: proxyAddr, target: target,
			want: "proxy http://" + proxyAddr + " refused CONNECT to " + target + ": 407 Proxy Authentication Required"},
		{name: "target not allowed", proxyURL: "http://ferry:s3cret@" + proxyAddr, target: "127.0.0.1:1",
			want: "proxy http://" + proxyAddr + " refused CONNECT to 127.0.0.1:1: 403 Forbidden"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := New(Options{ProxyURL: tt.proxyURL})
			if err != nil {
				t.Fatal(err)
			}
			_, err = d.Dial(context.Background(), tt.target)
			if err == nil || err.Error() != tt.want {
				t.Fatalf("error = %v, want %q", err, tt.want)
			}
			if strings.Contains(err.Error(), "wrong") || strings.Contains(err.Error(), "ferry:") {
				t.Errorf("error %q shows credentials", err)
			}
		})
	}
}

func TestDialThroughHTTPSProxy(t *testing.T) {
	dir := t.TempDir()
	ca, err := devpki.LoadOrCreateCA(dir, "proxy CA")
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.IssueServer(dir, "proxy", []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	cert, err := tls.LoadX509KeyPair(devpki.CertFile(dir, "proxy"), devpki.KeyFile(dir, "proxy"))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(dir, devpki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)

	target := echoServer(t)
	proxy, proxyAddr := startProxy(t, connectproxy.Options{Auth: "u:p", Log: logr.Discard()}, &tls.Config{Certificates: []tls.Certificate{cert}})
	d, err := New(Options{ProxyURL: "https://u:p@" + proxyAddr, ProxyTLS: &tls.Config{RootCAs: roots}})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := d.Dial(context.Background(), target)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	roundTrip(t, conn)
	if c := proxy.Counts(); c.Accepted != 1 {
		t.Errorf("proxy counts %+v, want one accepted CONNECT", c)
	}

	// Not trusting the proxy's certificate fails, naming the proxy.
	d, err = New(Options{ProxyURL: "https://u:p@" + proxyAddr})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Dial(context.Background(), target); err == nil || !strings.Contains(err.Error(), "TLS handshake with proxy https://"+proxyAddr) {
		t.Fatalf("error = %v, want a failed TLS handshake with the proxy", err)
	}
}

// TestDialKeepsBytesSentWithTheAnswer: a proxy may send tunnel bytes in the
// same segment as its 200; the reader that parsed the answer holds them.
func TestDialKeepsBytesSentWithTheAnswer(t *testing.T) {
	proxyAddr := rawProxy(t, func(c net.Conn) {
		_, _ = bufio.NewReader(c).ReadString('\n') // the request line is enough
		_, _ = c.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\nhello from the broker"))
		time.Sleep(time.Second)
	})
	d, err := New(Options{ProxyURL: "http://" + proxyAddr})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := d.Dial(context.Background(), "broker.test:9443")
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	got := make([]byte, len("hello from the broker"))
	if _, err := io.ReadFull(conn, got); err != nil || string(got) != "hello from the broker" {
		t.Fatalf("first bytes = %q, %v", got, err)
	}
}

// TestDialHonoursContext: a proxy that never answers holds the dial only
// until the context's deadline, or its cancellation.
func TestDialHonoursContext(t *testing.T) {
	proxyAddr := rawProxy(t, func(net.Conn) { time.Sleep(10 * time.Second) })
	d, err := New(Options{ProxyURL: "http://" + proxyAddr})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
		want error
	}{
		{name: "deadline", want: context.DeadlineExceeded, ctx: func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 200*time.Millisecond)
		}},
		{name: "cancel", want: context.Canceled, ctx: func() (context.Context, context.CancelFunc) {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(200*time.Millisecond, cancel)
			return ctx, cancel
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := tt.ctx()
			defer cancel()
			start := time.Now()
			_, err := d.Dial(ctx, "broker.test:9443")
			if !errors.Is(err, tt.want) {
				t.Fatalf("error = %v, want %v", err, tt.want)
			}
			if took := time.Since(start); took > 3*time.Second {
				t.Fatalf("dial returned after %s", took)
			}
		})
	}
}

// rawProxy serves every connection with handle: a proxy that misbehaves
// in ways connectproxy does not.
func rawProxy(t *testing.T, handle func(net.Conn)) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return lis.Addr().String()
}

func TestRoute(t *testing.T) {
	tests := []struct {
		name    string
		opts    Options
		addr    string
		want    string
		wantErr string
	}{
		{name: "nothing set", opts: Options{Env: &httpproxy.Config{}}, addr: "broker.example:9443", want: "direct"},
		{name: "flag, credentials hidden", opts: Options{ProxyURL: "http://u:secret@proxy.corp:3128", Env: &httpproxy.Config{HTTPSProxy: "other:1"}},
			addr: "broker.example:9443", want: "proxy http://proxy.corp:3128 (--proxy-url)"},
		{name: "flag without scheme", opts: Options{ProxyURL: "proxy.corp:3128"}, addr: "127.0.0.1:9443", want: "proxy http://proxy.corp:3128 (--proxy-url)"},
		{name: "HTTPS_PROXY", opts: Options{Env: &httpproxy.Config{HTTPSProxy: "http://u:secret@proxy.corp:3128"}},
			addr: "broker.example:9443", want: "proxy http://proxy.corp:3128 (HTTPS_PROXY)"},
		{name: "HTTP_PROXY is not for TLS", opts: Options{Env: &httpproxy.Config{HTTPProxy: "http://proxy.corp:3128"}},
			addr: "broker.example:9443", want: "direct"},
		{name: "NO_PROXY domain", opts: Options{Env: &httpproxy.Config{HTTPSProxy: "proxy.corp:3128", NoProxy: ".example"}},
			addr: "broker.example:9443", want: "direct"},
		{name: "NO_PROXY other domain", opts: Options{Env: &httpproxy.Config{HTTPSProxy: "proxy.corp:3128", NoProxy: ".internal"}},
			addr: "broker.example:9443", want: "proxy http://proxy.corp:3128 (HTTPS_PROXY)"},
		{name: "loopback goes direct", opts: Options{Env: &httpproxy.Config{HTTPSProxy: "proxy.corp:3128"}},
			addr: "127.0.0.1:9443", want: "direct"},
		{name: "SOCKS is not supported", opts: Options{ProxyURL: "socks5://proxy.corp:1080"}, wantErr: `--proxy-url: proxy scheme "socks5" is not supported (http or https)`},
		{name: "bad HTTPS_PROXY", opts: Options{Env: &httpproxy.Config{HTTPSProxy: "socks5://u:secret@proxy.corp:1080"}}, wantErr: `HTTPS_PROXY: proxy scheme "socks5" is not supported`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := New(tt.opts)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || strings.Contains(err.Error(), "secret") {
					t.Fatalf("error = %v, want %q without credentials", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := d.Route(tt.addr); got != tt.want {
				t.Fatalf("Route(%s) = %q, want %q", tt.addr, got, tt.want)
			}
		})
	}
}

func TestDialDirect(t *testing.T) {
	target := echoServer(t)
	d, err := New(Options{Env: &httpproxy.Config{}})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := d.Dial(context.Background(), target)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	roundTrip(t, conn)
}

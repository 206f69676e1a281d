// Package connectproxy is a small HTTP CONNECT proxy for tests: the kind of
// proxy a corporate network lets traffic out through. It can require Basic
// proxy authentication, allow only listed targets, map target host names
// to other hosts (so a test can dial a name only the proxy resolves, which
// proves the client did not go direct), close tunnels that stay idle, and
// counts what it did. test/cmd/connect-proxy runs it as a program.
package connectproxy

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
)

// Options configure a Proxy. All are optional.
type Options struct {
	// Auth is "user:password" a client must present as Basic
	// Proxy-Authorization; empty requires none.
	Auth string
	// Allow lists the host:port targets a CONNECT may name; empty allows
	// all.
	Allow []string
	// Resolve maps a target host to the host dialled instead (the port is
	// kept).
	Resolve map[string]string
	// IdleTimeout closes a tunnel through which no byte passed in either
	// direction for this long, as idle-timing middleboxes do; 0 never.
	IdleTimeout time.Duration
	// Log receives one line per CONNECT.
	Log logr.Logger
}

// Proxy is an HTTP CONNECT proxy.
type Proxy struct {
	opts                          Options
	accepted, refused, idleClosed atomic.Int64
}

// New returns a proxy.
func New(o Options) *Proxy { return &Proxy{opts: o} }

// Counts are what a proxy did so far.
type Counts struct {
	// Accepted CONNECTs (tunnels opened), Refused ones (any non-200
	// answer), tunnels closed for idleness.
	Accepted, Refused, IdleClosed int64
}

// Counts returns the proxy's counters.
func (p *Proxy) Counts() Counts {
	return Counts{Accepted: p.accepted.Load(), Refused: p.refused.Load(), IdleClosed: p.idleClosed.Load()}
}

// Serve answers on lis until ctx ends. Besides CONNECT it answers
// GET /counts with the counters, for tests that run it as a program.
func (p *Proxy) Serve(ctx context.Context, lis net.Listener) error {
	var tunnels sync.WaitGroup
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodConnect {
				tunnels.Add(1)
				defer tunnels.Done()
				p.connect(ctx, w, r)
				return
			}
			if r.Method == http.MethodGet && r.URL.Path == "/counts" {
				c := p.Counts()
				fmt.Fprintf(w, "accepted %d\nrefused %d\nidle_closed %d\n", c.Accepted, c.Refused, c.IdleClosed)
				return
			}
			http.Error(w, "this proxy only tunnels (CONNECT)", http.StatusMethodNotAllowed)
		}),
		ReadHeaderTimeout: 10 * time.Second,
		// net/http's own complaints (failed TLS handshakes of clients that
		// do not trust the proxy, say) go to the proxy's log too.
		ErrorLog: log.New(logWriter{p.opts.Log}, "", 0),
	}
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	err := srv.Serve(lis)
	tunnels.Wait()
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func (p *Proxy) connect(ctx context.Context, w http.ResponseWriter, r *http.Request) {
	target := r.Host
	log := p.opts.Log.WithValues("target", target, "client", r.RemoteAddr)
	refuse := func(code int, why string) {
		n := p.refused.Add(1)
		log.Info("CONNECT refused", "status", code, "reason", why, "refused", n)
		if code == http.StatusProxyAuthRequired {
			w.Header().Set("Proxy-Authenticate", `Basic realm="connect-proxy"`)
		}
		http.Error(w, why, code)
	}
	if p.opts.Auth != "" {
		want := "Basic " + base64.StdEncoding.EncodeToString([]byte(p.opts.Auth))
		if got := r.Header.Get("Proxy-Authorization"); got != want {
			refuse(http.StatusProxyAuthRequired, "missing or wrong proxy credentials")
			return
		}
	}
	if len(p.opts.Allow) > 0 && !slices.Contains(p.opts.Allow, target) {
		refuse(http.StatusForbidden, "target not allowed")
		return
	}
	host, port, err := net.SplitHostPort(target)
	if err != nil {
		refuse(http.StatusBadRequest, "target is not host:port")
		return
	}
	if to, ok := p.opts.Resolve[host]; ok {
		host = to
	}
	var d net.Dialer
	dialCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	upstream, err := d.DialContext(dialCtx, "tcp", net.JoinHostPort(host, port))
	cancel()
	if err != nil {
		refuse(http.StatusBadGateway, err.Error())
		return
	}
	defer upstream.Close()
	client, buf, err := http.NewResponseController(w).Hijack()
	if err != nil {
		refuse(http.StatusInternalServerError, err.Error())
		return
	}
	defer client.Close()
	if _, err := client.Write([]byte("HTTP/1.1 200 Connection established\r\n\r\n")); err != nil {
		return
	}
	n := p.accepted.Add(1)
	log.Info("CONNECT accepted", "dialled", upstream.RemoteAddr().String(), "accepted", n)
	why := p.relay(ctx, client, buf.Reader, upstream)
	log.Info("tunnel closed", "reason", why)
}

// relay copies both ways until either side ends, ctx ends or the tunnel
// is idle for IdleTimeout; it returns why it stopped. from holds the
// client's bytes read past the CONNECT request.
func (p *Proxy) relay(ctx context.Context, client net.Conn, from io.Reader, upstream net.Conn) string {
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	done := make(chan string, 2)
	pipe := func(dst net.Conn, src io.Reader, name string) {
		buf := make([]byte, 32*1024)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				last.Store(time.Now().UnixNano())
				if _, werr := dst.Write(buf[:n]); werr != nil {
					done <- name + ": " + werr.Error()
					return
				}
			}
			if err != nil {
				if errors.Is(err, io.EOF) {
					done <- name + " closed"
				} else {
					done <- name + ": " + err.Error()
				}
				return
			}
		}
	}
	go pipe(upstream, from, "client")
	go pipe(client, upstream, "target")
	var idle <-chan time.Time
	if p.opts.IdleTimeout > 0 {
		t := time.NewTicker(p.opts.IdleTimeout / 10)
		defer t.Stop()
		idle = t.C
	}
	for {
		select {
		case why := <-done:
			return why
		case <-ctx.Done():
			return "proxy stopping"
		case <-idle:
			if time.Since(time.Unix(0, last.Load())) >= p.opts.IdleTimeout {
				p.idleClosed.Add(1)
				return fmt.Sprintf("idle for %s", p.opts.IdleTimeout)
			}
		}
	}
}

// logWriter turns net/http's error log lines into log entries.
type logWriter struct{ log logr.Logger }

func (w logWriter) Write(b []byte) (int, error) {
	w.log.Info("http server", "error", strings.TrimSpace(string(b)))
	return len(b), nil
}

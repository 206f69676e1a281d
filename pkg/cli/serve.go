package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/pkg/logging"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/pflag"
)

// Defaults of the observability listeners: loopback, so nothing is exposed
// beyond the host unless asked for (the Helm charts bind all interfaces).
// The broker and the edge differ, so that both run on one host with their
// defaults.
const (
	BrokerMetricsAddress = "127.0.0.1:8080"
	BrokerHealthAddress  = "127.0.0.1:8081"
	EdgeMetricsAddress   = "127.0.0.1:8090"
	EdgeHealthAddress    = "127.0.0.1:8091"
)

// AddObservabilityFlags registers --metrics-bind-address and
// --health-probe-bind-address.
func AddObservabilityFlags(fs *pflag.FlagSet, metricsAddr, healthAddr *string) {
	fs.StringVar(metricsAddr, "metrics-bind-address", *metricsAddr,
		`Serve Prometheus metrics at /metrics on this host:port; "0" turns them off. Use ":PORT" to expose them beyond loopback (e.g. to a Prometheus in the cluster).`)
	fs.StringVar(healthAddr, "health-probe-bind-address", *healthAddr,
		`Serve /healthz (liveness) and /readyz (readiness, with the failing check's reason) on this host:port; "0" turns them off.`)
}

// ServeMetrics serves g's metrics at /metrics on addr until ctx ends
// ("0": not at all). Like ServeProfiles it listens before returning.
func ServeMetrics(ctx context.Context, addr string, g prometheus.Gatherer, log logr.Logger) (net.Addr, error) {
	if addr == "0" {
		return nil, nil
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorLog: promLogger{log}, ErrorHandling: promhttp.ContinueOnError}))
	return serveHTTP(ctx, "--metrics-bind-address", addr, mux, log, "serving metrics")
}

// Checks are named health checks; a check returns nil when healthy, else
// the reason.
type Checks map[string]func(*http.Request) error

// Degraded is what a check returns when the process serves, but not all of
// what it should: the probe passes (taking the process out of service would
// stop what still works too) and its body says what is missing, so
// `curl /readyz?verbose` answers "why are some workspaces not synced".
type Degraded struct{ Reason string }

func (d *Degraded) Error() string { return d.Reason }

// Ping is a check that always passes: the process serves HTTP.
func Ping(*http.Request) error { return nil }

// ServeHealth serves /healthz from live and /readyz from ready on addr until
// ctx ends ("0": not at all). Each check is also served on its own path
// (/readyz/<name>), and ?verbose lists them all, as in Kubernetes.
func ServeHealth(ctx context.Context, addr string, live, ready Checks, log logr.Logger) (net.Addr, error) {
	if addr == "0" {
		return nil, nil
	}
	mux := http.NewServeMux()
	for path, checks := range map[string]Checks{"/healthz": live, "/readyz": ready} {
		mux.Handle(path, checks)
		for name, check := range checks {
			mux.Handle(path+"/"+name, Checks{name: check})
		}
	}
	return serveHTTP(ctx, "--health-probe-bind-address", addr, mux, log, "serving health probes")
}

// ServeHTTP runs every check and answers 200 when all pass, else 500; the
// body lists each check with its failure reason (like Kubernetes' verbose
// output). Not controller-runtime's healthz.Handler: it withholds the
// reasons, and "why is the edge not ready" is the question a probe's body
// should answer at 3 a.m. The port serves nothing secret (see the flag).
func (c Checks) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	names := slices.Sorted(maps.Keys(c))
	var body strings.Builder
	failed := false
	for _, name := range names {
		err := c[name](r)
		if d := (*Degraded)(nil); errors.As(err, &d) {
			fmt.Fprintf(&body, "[+]%s ok, degraded: %s\n", name, d.Reason)
			continue
		}
		if err != nil {
			failed = true
			fmt.Fprintf(&body, "[-]%s failed: %v\n", name, err)
			continue
		}
		fmt.Fprintf(&body, "[+]%s ok\n", name)
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if failed {
		w.WriteHeader(http.StatusInternalServerError)
		fmt.Fprintf(&body, "%s check failed\n", strings.TrimPrefix(r.URL.Path, "/"))
	} else {
		body.WriteString("ok\n")
	}
	_, _ = io.WriteString(w, body.String())
}

// serveHTTP listens on addr (so a bad or busy address stops the program at
// start with a message naming flag) and serves h until ctx ends.
func serveHTTP(ctx context.Context, flag, addr string, h http.Handler, log logr.Logger, what string) (net.Addr, error) {
	lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("cannot listen on %s %s: %w", flag, addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(err, "HTTP server stopped", "flag", flag)
		}
	}()
	log.Info(what, logging.KeyAddress, lis.Addr().String())
	return lis.Addr(), nil
}

// promLogger logs the metrics handler's errors.
type promLogger struct{ log logr.Logger }

func (l promLogger) Println(v ...any) { l.log.Error(nil, "serving metrics", "error", fmt.Sprint(v...)) }

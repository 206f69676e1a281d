// Package metrics defines ferry's Prometheus metrics: those both programs
// expose (common.go), the broker's (broker.go) and the edge's (edge.go).
// README.md lists every name.
//
// Metrics live in structs registered on a prometheus.Registerer the program
// passes in (controller-runtime's registry in the binaries, a fresh one in
// tests), never in package variables. Every method is safe on a nil
// receiver and then does nothing, so unit tests of the sync logic need no
// metrics.
package metrics

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/stats"
	"k8s.io/client-go/rest"
)

const namespace = "ferry"

// Directions of ferry_sync_latency_seconds.
const (
	// ToServiceCluster: a kcp change seen by the broker until the edge
	// applied it and the broker got the acknowledgement.
	ToServiceCluster = "to_service_cluster"
	// ToKCP: a local status or related object seen by the edge until the
	// broker wrote it to kcp and the edge got the answer.
	ToKCP = "to_kcp"
)

// latencyBuckets span a fast sync (a few ms) to a stuck one (minutes).
func latencyBuckets() []float64 {
	return []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}
}

// Common are the metrics both programs expose.
type Common struct {
	messageBytes   *prometheus.HistogramVec
	syncLatency    *prometheus.HistogramVec
	clientRequests *prometheus.CounterVec
	clientLatency  *prometheus.HistogramVec
}

func newCommon(reg prometheus.Registerer, certs []Certificate) (*Common, error) {
	c := &Common{
		messageBytes: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "stream_message_size_bytes",
			Help:    "Size of the messages on the edge-broker stream, as sent or received by this process (gRPC payload bytes on the wire).",
			Buckets: prometheus.ExponentialBuckets(64, 4, 10), // 64 B … 16 MiB
		}, []string{"direction"}),
		syncLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "sync_latency_seconds",
			Help: "End-to-end sync latency. to_service_cluster (broker): from a kcp change queued as an intent to the edge's " +
				"acknowledgement that it applied it. to_kcp (edge): from a local status or related object queued as a report to the " +
				"broker's answer that it wrote it to kcp.",
			Buckets: latencyBuckets(),
		}, []string{"direction"}),
		clientRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Name: "client_requests_total",
			Help: "Requests this process made to Kubernetes API servers, by cluster (kcp for the broker, service for the edge), method and HTTP status code.",
		}, []string{"cluster", "method", "code"}),
		clientLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Name: "client_request_duration_seconds",
			Help: "Latency of the requests this process made to Kubernetes API servers (to the response headers; watches count until they open), by cluster and method.",
			// Watches are long requests, but their duration counts only until the
			// headers arrive, so the usual request buckets fit.
			Buckets: []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
		}, []string{"cluster", "method"}),
	}
	cols := []prometheus.Collector{c.messageBytes, c.syncLatency, c.clientRequests, c.clientLatency}
	if len(certs) > 0 {
		cols = append(cols, &certCollector{certs: certs, desc: prometheus.NewDesc(
			prometheus.BuildFQName(namespace, "", "certificate_expiry_timestamp_seconds"),
			"When this process's certificate expires (Unix seconds), read from its file at every scrape (certificates are reloaded when their files change).",
			[]string{"role"}, nil)})
	}
	if err := register(reg, cols...); err != nil {
		return nil, err
	}
	return c, nil
}

func register(reg prometheus.Registerer, cols ...prometheus.Collector) error {
	for _, col := range cols {
		if err := reg.Register(col); err != nil {
			return fmt.Errorf("registering ferry metrics: %w", err)
		}
	}
	return nil
}

// ObserveSyncLatency records one sync's latency in direction (ToKCP or
// ToServiceCluster) from queued until now.
func (c *Common) ObserveSyncLatency(direction string, queued time.Time) {
	if c == nil || queued.IsZero() {
		return
	}
	c.syncLatency.WithLabelValues(direction).Observe(time.Since(queued).Seconds())
}

// InstrumentClient counts and times every request cfg's clients make, as
// cluster ("kcp" or "service") in ferry_client_requests_total and
// ferry_client_request_duration_seconds. Call it before clients are built
// from cfg.
func (c *Common) InstrumentClient(cfg *rest.Config, cluster string) {
	if c == nil {
		return
	}
	counter := c.clientRequests.MustCurryWith(prometheus.Labels{"cluster": cluster})
	latency := c.clientLatency.MustCurryWith(prometheus.Labels{"cluster": cluster})
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return promhttp.InstrumentRoundTripperCounter(counter, promhttp.InstrumentRoundTripperDuration(latency, rt))
	})
}

// StatsHandler returns a gRPC stats handler that records the size of every
// message of the methods named (full method names, e.g.
// "/ferry.v1alpha1.SyncService/Connect") in ferry_stream_message_size_bytes.
func (c *Common) StatsHandler(methods ...string) stats.Handler {
	return &messageSizes{common: c, methods: methods}
}

// messageSizes is a grpc stats.Handler; gRPC calls it with each payload's
// wire length, which no interceptor sees.
type messageSizes struct {
	common  *Common
	methods []string
}

type countedKey struct{}

func (h *messageSizes) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	for _, m := range h.methods {
		if info.FullMethodName == m {
			return context.WithValue(ctx, countedKey{}, true)
		}
	}
	return ctx
}

func (h *messageSizes) HandleRPC(ctx context.Context, s stats.RPCStats) {
	if h.common == nil || ctx.Value(countedKey{}) == nil {
		return
	}
	switch p := s.(type) {
	case *stats.InPayload:
		h.common.messageBytes.WithLabelValues("received").Observe(float64(p.WireLength))
	case *stats.OutPayload:
		h.common.messageBytes.WithLabelValues("sent").Observe(float64(p.WireLength))
	}
}

func (h *messageSizes) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (h *messageSizes) HandleConn(context.Context, stats.ConnStats)                       {}

// Certificate names a PEM certificate file whose expiry is exported.
type Certificate struct {
	// Role is the label value, e.g. "server", "client".
	Role string
	// File is the PEM file; its first certificate is the leaf.
	File string
	// Expiry, when set, is used instead of File: the certificate is held
	// in memory (an enrolled edge's, replaced on renewal).
	Expiry func() (time.Time, error)
}

// certCollector reads the certificate files at scrape time: they are
// reloaded from disk by the TLS configuration, so the file is the truth.
type certCollector struct {
	certs []Certificate
	desc  *prometheus.Desc
}

func (c *certCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *certCollector) Collect(ch chan<- prometheus.Metric) {
	for _, cert := range c.certs {
		expiry := cert.Expiry
		if expiry == nil {
			file := cert.File
			expiry = func() (time.Time, error) { return certificateExpiry(file) }
		}
		notAfter, err := expiry()
		if err != nil {
			ch <- prometheus.NewInvalidMetric(c.desc, err)
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(notAfter.Unix()), cert.Role)
	}
}

func certificateExpiry(file string) (time.Time, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return time.Time{}, fmt.Errorf("reading certificate: %w", err)
	}
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return time.Time{}, fmt.Errorf("no certificate in %s", file)
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		cert, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return time.Time{}, fmt.Errorf("parsing certificate %s: %w", file, err)
		}
		return cert.NotAfter, nil
	}
}

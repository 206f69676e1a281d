package metrics

import (
	"sync"
	"time"

	"google.golang.org/grpc/stats"
	"k8s.io/client-go/rest"

	"github.com/prometheus/client_golang/prometheus"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/protocol"
)

// Edge holds ferry-edge's metrics. One per process: the leader-scoped
// parts of the edge (stream, sync engine) are rebuilt after a lost lease
// and point the state gauges at themselves with SetSource.
type Edge struct {
	*Common

	connected      prometheus.Gauge
	sessionStart   prometheus.Gauge
	streamAttempts *prometheus.CounterVec
	intentsRecv    *prometheus.CounterVec
	intentsApplied *prometheus.CounterVec
	intentsFailed  *prometheus.CounterVec
	reportsQueued  *prometheus.CounterVec
	reportsDone    *prometheus.CounterVec
	renewals       *prometheus.CounterVec

	mu     sync.Mutex
	source EdgeSource
}

// EdgeSource describes the edge's sync engine at scrape time; it must not
// block.
type EdgeSource func() EdgeEngineState

// EdgeEngineState is the edge's sync engine as a scrape sees it.
type EdgeEngineState struct {
	// Report outbox: reports waiting to be sent, and sent but not answered.
	Pending, InFlight int
	// OldestInFlight is when the oldest unanswered report was queued.
	OldestInFlight time.Time
	// Objects (local copies) per published resource.
	Objects map[string]int
}

// NewEdge registers the edge's metrics on reg.
func NewEdge(reg prometheus.Registerer, certs ...Certificate) (*Edge, error) {
	common, err := newCommon(reg, certs)
	if err != nil {
		return nil, err
	}
	e := &Edge{
		Common: common,
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: "edge", Name: "connected",
			Help: "1 while this edge has an accepted stream to the broker, else 0 (also 0 on a standby replica).",
		}),
		sessionStart: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: namespace, Subsystem: "edge", Name: "session_start_timestamp_seconds",
			Help: "When the current (or last) stream to the broker was accepted (Unix seconds); time() minus it is the session's age.",
		}),
		streamAttempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "edge", Name: "stream_attempts_total",
			Help: "Attempts to open a stream to the broker, by result: accepted, refused (the broker refused the handshake) or failed (unreachable, TLS, lost).",
		}, []string{"result"}),
		intentsRecv: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "edge", Name: "intents_received_total",
			Help: "Sync intents received from the broker, by operation (upsert, delete, related_upsert, related_delete).",
		}, []string{"operation"}),
		intentsApplied: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "edge", Name: "intents_applied_total",
			Help: "Sync intents applied in the service cluster and acknowledged, by operation.",
		}, []string{"operation"}),
		intentsFailed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "edge", Name: "intents_failed_total",
			Help: "Sync intents answered with an error, by reason (ApplyErrorReason, e.g. rejected, not_ready, forbidden).",
		}, []string{"reason"}),
		reportsQueued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "edge", Name: "reports_queued_total",
			Help: "Reports queued for the broker, by kind (status, related, deletion, resend); a newer report of an object replaces a queued one.",
		}, []string{"kind"}),
		reportsDone: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "edge", Name: "reports_answered_total",
			Help: "Reports the broker answered, by result: written (applied to kcp or found applied) or refused.",
		}, []string{"result"}),
	}
	e.renewals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "edge", Name: "certificate_renewals_total",
		Help: "Renewals of the enrolled client certificate over the stream, by result: renewed, refused (the broker said why), failed (no answer, or the credentials Secret could not be written).",
	}, []string{"result"})
	col := newEdgeCollector(e)
	if err := register(reg, e.connected, e.sessionStart, e.streamAttempts, e.intentsRecv, e.intentsApplied, e.intentsFailed,
		e.reportsQueued, e.reportsDone, e.renewals, col); err != nil {
		return nil, err
	}
	return e, nil
}

// SetSource points the state gauges at the current sync engine (nil: none).
func (e *Edge) SetSource(s EdgeSource) {
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.source = s
}

func (e *Edge) currentSource() EdgeSource {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.source
}

// StreamAttempt counts an attempt to open a stream; result is accepted,
// refused or failed.
func (e *Edge) StreamAttempt(result string) {
	if e == nil {
		return
	}
	e.streamAttempts.WithLabelValues(result).Inc()
}

// CertificateRenewal counts one renewal attempt by result.
func (e *Edge) CertificateRenewal(result string) {
	if e == nil {
		return
	}
	e.renewals.WithLabelValues(result).Inc()
}

// Connected records an accepted stream (true) or its end (false).
func (e *Edge) Connected(connected bool) {
	if e == nil {
		return
	}
	if connected {
		e.connected.Set(1)
		e.sessionStart.SetToCurrentTime()
		return
	}
	e.connected.Set(0)
}

// IntentReceived counts an intent from the broker.
func (e *Edge) IntentReceived(in *ferryv1.SyncIntent) {
	if e == nil {
		return
	}
	e.intentsRecv.WithLabelValues(OperationLabel(in)).Inc()
}

// IntentDone counts the answer to an intent.
func (e *Edge) IntentDone(in *ferryv1.SyncIntent, res *ferryv1.IntentResult) {
	if e == nil {
		return
	}
	if ae := res.GetError(); ae != nil {
		e.intentsFailed.WithLabelValues(ApplyErrorReason(ae.GetReason())).Inc()
		return
	}
	e.intentsApplied.WithLabelValues(OperationLabel(in)).Inc()
}

// ReportQueued counts a report queued for the broker.
func (e *Edge) ReportQueued(m *ferryv1.ConnectRequest) {
	if e == nil {
		return
	}
	e.reportsQueued.WithLabelValues(ReportKind(m)).Inc()
}

// ReportAnswered counts the broker's answer to a report queued at queued;
// a written one also records the sync latency.
func (e *Edge) ReportAnswered(r *ferryv1.ReportResult, queued time.Time) {
	if e == nil {
		return
	}
	if r.GetError() != nil {
		e.reportsDone.WithLabelValues("refused").Inc()
		return
	}
	e.reportsDone.WithLabelValues("written").Inc()
	e.ObserveSyncLatency(ToKCP, queued)
}

// ReportKind is the kind label of an edge report.
func ReportKind(m *ferryv1.ConnectRequest) string {
	switch m.GetMessage().(type) {
	case *ferryv1.ConnectRequest_StatusReport:
		return protocol.ReportKindStatus
	case *ferryv1.ConnectRequest_RelatedObjectReport:
		return protocol.ReportKindRelated
	case *ferryv1.ConnectRequest_DeletionConfirmation:
		return protocol.ReportKindDeletion
	case *ferryv1.ConnectRequest_ResendRequest:
		return protocol.ReportKindResend
	}
	return "other"
}

// edgeCollector reads the edge's engine state at scrape time.
type edgeCollector struct {
	edge    *Edge
	outbox  *prometheus.Desc
	oldest  *prometheus.Desc
	objects *prometheus.Desc
}

func newEdgeCollector(e *Edge) *edgeCollector {
	name := func(n string) string { return prometheus.BuildFQName(namespace, "edge", n) }
	return &edgeCollector{
		edge: e,
		outbox: prometheus.NewDesc(name("outbox_depth"),
			"Reports in the edge's outbox: pending (waiting to be sent) or in_flight (sent, not answered).", []string{"state"}, nil),
		oldest: prometheus.NewDesc(name("outbox_oldest_unacked_age_seconds"),
			"Age of the oldest report sent and not answered yet (0 when none).", nil, nil),
		objects: prometheus.NewDesc(name("objects"),
			"Local copies this edge applied, by published resource.", []string{"published_resource"}, nil),
	}
}

func (c *edgeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.outbox
	ch <- c.oldest
	ch <- c.objects
}

func (c *edgeCollector) Collect(ch chan<- prometheus.Metric) {
	source := c.edge.currentSource()
	var st EdgeEngineState
	if source != nil {
		st = source()
	}
	ch <- prometheus.MustNewConstMetric(c.outbox, prometheus.GaugeValue, float64(st.Pending), "pending")
	ch <- prometheus.MustNewConstMetric(c.outbox, prometheus.GaugeValue, float64(st.InFlight), "in_flight")
	age := 0.0
	if !st.OldestInFlight.IsZero() {
		age = time.Since(st.OldestInFlight).Seconds()
	}
	ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, age)
	for pr, n := range st.Objects {
		ch <- prometheus.MustNewConstMetric(c.objects, prometheus.GaugeValue, float64(n), pr)
	}
}

// common is the shared metrics, nil on a nil receiver: the embedded
// pointer's methods are reached through these, so a nil *Edge records
// nothing instead of dereferencing nil.
func (e *Edge) common() *Common {
	if e == nil {
		return nil
	}
	return e.Common
}

// ObserveSyncLatency is Common.ObserveSyncLatency, safe on a nil receiver.
func (e *Edge) ObserveSyncLatency(direction string, queued time.Time) {
	e.common().ObserveSyncLatency(direction, queued)
}

// InstrumentClient is Common.InstrumentClient, safe on a nil receiver.
func (e *Edge) InstrumentClient(cfg *rest.Config, cluster string) {
	e.common().InstrumentClient(cfg, cluster)
}

// StatsHandler is Common.StatsHandler, safe on a nil receiver (it then
// records nothing).
func (e *Edge) StatsHandler(methods ...string) stats.Handler {
	return e.common().StatsHandler(methods...)
}

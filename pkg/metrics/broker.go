package metrics

import (
	"time"

	"google.golang.org/grpc/stats"
	"k8s.io/client-go/rest"

	"github.com/prometheus/client_golang/prometheus"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/protocol"
)

// Broker holds ferry-broker's metrics. Counters are updated as things
// happen; gauges describing state (edges, outboxes) are read from a
// BrokerSource at scrape time, so they can never drift from the truth.
type Broker struct {
	*Common

	handshakeRefusals *prometheus.CounterVec
	attachments       *prometheus.CounterVec
	intentsSent       *prometheus.CounterVec
	intentsAcked      *prometheus.CounterVec
	intentsNacked     *prometheus.CounterVec
	reportsReceived   *prometheus.CounterVec
	reportsWritten    *prometheus.CounterVec
	reportsRefused    *prometheus.CounterVec
	resyncDuration    *prometheus.HistogramVec
	resyncObjects     *prometheus.CounterVec
}

// BrokerSource lists the configured edges and their state; called at
// every scrape, it must not block.
type BrokerSource func() []EdgeState

// EdgeState is one configured edge identity as a scrape sees it.
type EdgeState struct {
	Identity string
	Export   string
	// Connected tells whether a stream is open; ConnectedAt is when its
	// handshake completed.
	Connected   bool
	ConnectedAt time.Time
	// Engine is the export's sync engine, when it runs (it outlives streams).
	Engine *EngineState
}

// EngineState is the state of one APIExport's sync engine.
type EngineState struct {
	// Outbox: intents waiting to be sent, and sent but not answered.
	Pending, InFlight int
	// OldestInFlight is when the oldest unanswered intent was queued.
	OldestInFlight time.Time
	// Objects per published resource in the engine's caches.
	Objects map[string]int
	// Refused edge messages since the engine started.
	Refused uint64
	// Endpoints are the export's virtual workspace endpoints (one per kcp
	// shard) by URL: true while the engine's watches reach it.
	Endpoints map[string]bool
}

// NewBroker registers the broker's metrics on reg. source may be nil and set
// later with SetSource.
func NewBroker(reg prometheus.Registerer, certs ...Certificate) (*Broker, error) {
	common, err := newCommon(reg, certs)
	if err != nil {
		return nil, err
	}
	b := &Broker{
		Common: common,
		handshakeRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "broker", Name: "handshake_refusals_total",
			Help: "Edge streams the broker refused during the handshake, by reason.",
		}, []string{"reason"}),
		attachments: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "broker", Name: "stream_attachments_total",
			Help: "Edge streams accepted and attached to an APIExport's sync engine (connects and reconnects).",
		}, []string{"export"}),
		intentsSent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "broker", Name: "intents_sent_total",
			Help: "Sync intents sent to the edge, by operation (upsert, delete, related_upsert, related_delete).",
		}, []string{"export", "operation"}),
		intentsAcked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "broker", Name: "intents_acked_total",
			Help: "Sync intents the edge applied (acknowledged).",
		}, []string{"export"}),
		intentsNacked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "broker", Name: "intents_nacked_total",
			Help: "Sync intents the edge could not apply, by reason (ApplyErrorReason, e.g. rejected, not_ready, forbidden, too_large).",
		}, []string{"export", "reason"}),
		reportsReceived: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "broker", Name: "reports_received_total",
			Help: "Reports received from the edge, by kind (status, related, deletion, resend).",
		}, []string{"export", "kind"}),
		reportsWritten: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "broker", Name: "reports_written_total",
			Help: "Edge reports the broker applied to kcp (or found already applied), by kind.",
		}, []string{"export", "kind"}),
		reportsRefused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "broker", Name: "reports_refused_total",
			Help: "Edge reports answered with an error for good (not synced by the edge, refused by the broker, invalid in kcp), by kind.",
		}, []string{"export", "kind"}),
		resyncDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: namespace, Subsystem: "broker", Name: "resync_duration_seconds",
			Help:    "From a stream's attachment to the comparison of the edge's complete inventory of one published resource with kcp.",
			Buckets: latencyBuckets(),
		}, []string{"export"}),
		resyncObjects: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: namespace, Subsystem: "broker", Name: "resync_objects_total",
			Help: "Objects of kcp compared with an edge's inventory after a (re)connect (result=compared), and the outcome of each once processed: unchanged (the edge has its desired state) or sent (the intent goes out again).",
		}, []string{"export", "result"}),
	}
	if err := register(reg, b.handshakeRefusals, b.attachments, b.intentsSent, b.intentsAcked, b.intentsNacked,
		b.reportsReceived, b.reportsWritten, b.reportsRefused, b.resyncDuration, b.resyncObjects); err != nil {
		return nil, err
	}
	return b, nil
}

// RegisterSource registers the collector of the broker's state gauges,
// which calls source at every scrape.
func (b *Broker) RegisterSource(reg prometheus.Registerer, source BrokerSource) error {
	if b == nil {
		return nil
	}
	return register(reg, newBrokerCollector(source))
}

// HandshakeRefused counts a refused stream.
func (b *Broker) HandshakeRefused(reason string) {
	if b == nil {
		return
	}
	b.handshakeRefusals.WithLabelValues(reason).Inc()
}

// Export returns the metrics of one APIExport's engine.
func (b *Broker) Export(export string) *Export {
	if b == nil {
		return nil
	}
	l := prometheus.Labels{"export": export}
	return &Export{
		common:          b.Common,
		attachments:     b.attachments.With(l),
		intentsSent:     b.intentsSent.MustCurryWith(l),
		intentsAcked:    b.intentsAcked.With(l),
		intentsNacked:   b.intentsNacked.MustCurryWith(l),
		reportsReceived: b.reportsReceived.MustCurryWith(l),
		reportsWritten:  b.reportsWritten.MustCurryWith(l),
		reportsRefused:  b.reportsRefused.MustCurryWith(l),
		resyncDuration:  b.resyncDuration.With(l),
		resyncObjects:   b.resyncObjects.MustCurryWith(l),
	}
}

// Export is the broker's metrics for one APIExport. Its methods are safe on
// a nil receiver.
type Export struct {
	common          *Common
	attachments     prometheus.Counter
	intentsSent     *prometheus.CounterVec
	intentsAcked    prometheus.Counter
	intentsNacked   *prometheus.CounterVec
	reportsReceived *prometheus.CounterVec
	reportsWritten  *prometheus.CounterVec
	reportsRefused  *prometheus.CounterVec
	resyncDuration  prometheus.Observer
	resyncObjects   *prometheus.CounterVec
}

// Attached counts a stream attached to the engine.
func (e *Export) Attached() {
	if e == nil {
		return
	}
	e.attachments.Inc()
}

// IntentSent counts an intent sent to the edge.
func (e *Export) IntentSent(in *ferryv1.SyncIntent) {
	if e == nil {
		return
	}
	e.intentsSent.WithLabelValues(OperationLabel(in)).Inc()
}

// IntentAnswered counts the edge's answer res to an intent queued at
// queued; an applied one also records the sync latency.
func (e *Export) IntentAnswered(_ *ferryv1.SyncIntent, res *ferryv1.IntentResult, queued time.Time) {
	if e == nil {
		return
	}
	applyErr := res.GetError()
	if applyErr == nil {
		e.intentsAcked.Inc()
		e.common.ObserveSyncLatency(ToServiceCluster, queued)
		return
	}
	e.intentsNacked.WithLabelValues(ApplyErrorReason(applyErr.GetReason())).Inc()
}

// ReportReceived counts a report of kind from the edge.
func (e *Export) ReportReceived(kind string) {
	if e == nil {
		return
	}
	e.reportsReceived.WithLabelValues(kind).Inc()
}

// IntentTooLarge is not counted: the intent was never sent, and the
// object's Event and admin record show it.
func (*Export) IntentTooLarge(*ferryv1.SyncIntent, *ferryv1.ApplyError) {}

// InventoryReceived is not counted: Resynced counts the comparisons.
func (*Export) InventoryReceived(*ferryv1.Inventory) {}

// ReportAnswered counts a report of kind answered with res: written (or
// found written) without an error, refused for good otherwise.
func (e *Export) ReportAnswered(kind string, _ *ferryv1.ObjectKey, res *ferryv1.ReportResult) {
	if e == nil {
		return
	}
	if res.GetError() == nil {
		e.reportsWritten.WithLabelValues(kind).Inc()
		return
	}
	e.reportsRefused.WithLabelValues(kind).Inc()
}

// Resynced records one published resource's inventory comparison after a
// stream attached at since, over compared objects.
func (e *Export) Resynced(since time.Time, compared int) {
	if e == nil {
		return
	}
	if !since.IsZero() {
		e.resyncDuration.Observe(time.Since(since).Seconds())
	}
	e.resyncObjects.WithLabelValues("compared").Add(float64(compared))
}

// ResyncObject counts the outcome of one compared object: unchanged (the
// edge has its desired state) or sent again.
func (e *Export) ResyncObject(unchanged bool) {
	if e == nil {
		return
	}
	result := "sent"
	if unchanged {
		result = "unchanged"
	}
	e.resyncObjects.WithLabelValues(result).Inc()
}

// ApplyErrorReason is the label value of an ApplyErrorReason.
func ApplyErrorReason(r ferryv1.ApplyErrorReason) string {
	return protocol.ReasonName(r)
}

// brokerCollector turns a BrokerSource into gauges at scrape time.
type brokerCollector struct {
	source     BrokerSource
	connected  *prometheus.Desc
	sessionAge *prometheus.Desc
	outbox     *prometheus.Desc
	oldest     *prometheus.Desc
	objects    *prometheus.Desc
	refused    *prometheus.Desc
	reachable  *prometheus.Desc
}

func newBrokerCollector(source BrokerSource) *brokerCollector {
	name := func(n string) string { return prometheus.BuildFQName(namespace, "broker", n) }
	return &brokerCollector{
		source: source,
		connected: prometheus.NewDesc(name("edge_connected"),
			"1 while the configured edge identity has a stream open, else 0.", []string{"identity", "export"}, nil),
		sessionAge: prometheus.NewDesc(name("edge_session_age_seconds"),
			"How long the edge's current stream has been open.", []string{"identity", "export"}, nil),
		outbox: prometheus.NewDesc(name("outbox_depth"),
			"Intents in the APIExport's outbox: pending (waiting to be sent) or in_flight (sent, not answered).", []string{"export", "state"}, nil),
		oldest: prometheus.NewDesc(name("outbox_oldest_unacked_age_seconds"),
			"Age of the oldest intent sent and not answered yet (0 when none).", []string{"export"}, nil),
		objects: prometheus.NewDesc(name("objects"),
			"Objects in the engine's kcp caches, by published resource.", []string{"export", "published_resource"}, nil),
		refused: prometheus.NewDesc(name("refused_messages_total"),
			"Edge messages the engine refused because they claimed something the broker checked and found untrue (since the engine started).", []string{"export"}, nil),
		reachable: prometheus.NewDesc(name("virtual_workspace_endpoint_reachable"),
			"1 while the engine's lists and watches at a virtual workspace endpoint (one kcp shard's) succeed, 0 while they fail: that shard's workspaces are not synced meanwhile.", []string{"export", "url"}, nil),
	}
}

func (c *brokerCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.connected, c.sessionAge, c.outbox, c.oldest, c.objects, c.refused, c.reachable} {
		ch <- d
	}
}

func (c *brokerCollector) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	engines := map[string]*EngineState{}
	for _, e := range c.source() {
		connected := 0.0
		if e.Connected {
			connected = 1
			ch <- prometheus.MustNewConstMetric(c.sessionAge, prometheus.GaugeValue, now.Sub(e.ConnectedAt).Seconds(), e.Identity, e.Export)
		}
		ch <- prometheus.MustNewConstMetric(c.connected, prometheus.GaugeValue, connected, e.Identity, e.Export)
		if e.Engine != nil {
			engines[e.Export] = e.Engine // identities serving one export share its engine
		}
	}
	for export, st := range engines {
		ch <- prometheus.MustNewConstMetric(c.outbox, prometheus.GaugeValue, float64(st.Pending), export, "pending")
		ch <- prometheus.MustNewConstMetric(c.outbox, prometheus.GaugeValue, float64(st.InFlight), export, "in_flight")
		age := 0.0
		if !st.OldestInFlight.IsZero() {
			age = now.Sub(st.OldestInFlight).Seconds()
		}
		ch <- prometheus.MustNewConstMetric(c.oldest, prometheus.GaugeValue, age, export)
		for pr, n := range st.Objects {
			ch <- prometheus.MustNewConstMetric(c.objects, prometheus.GaugeValue, float64(n), export, pr)
		}
		ch <- prometheus.MustNewConstMetric(c.refused, prometheus.CounterValue, float64(st.Refused), export)
		for url, reachable := range st.Endpoints {
			v := 0.0
			if reachable {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(c.reachable, prometheus.GaugeValue, v, export, url)
		}
	}
}

// OperationLabel is the label value of an intent's operation.
func OperationLabel(in *ferryv1.SyncIntent) string {
	op := "delete"
	if in.GetUpsert() != nil {
		op = "upsert"
	}
	if in.GetRelatedTo() != nil {
		op = "related_" + op
	}
	return op
}

// common is the shared metrics, nil on a nil receiver: the embedded
// pointer's methods are reached through these, so a nil *Broker records
// nothing instead of dereferencing nil.
func (b *Broker) common() *Common {
	if b == nil {
		return nil
	}
	return b.Common
}

// ObserveSyncLatency is Common.ObserveSyncLatency, safe on a nil receiver.
func (b *Broker) ObserveSyncLatency(direction string, queued time.Time) {
	b.common().ObserveSyncLatency(direction, queued)
}

// InstrumentClient is Common.InstrumentClient, safe on a nil receiver.
func (b *Broker) InstrumentClient(cfg *rest.Config, cluster string) {
	b.common().InstrumentClient(cfg, cluster)
}

// StatsHandler is Common.StatsHandler, safe on a nil receiver (it then
// records nothing).
func (b *Broker) StatsHandler(methods ...string) stats.Handler {
	return b.common().StatsHandler(methods...)
}

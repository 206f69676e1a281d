package metrics

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/stats"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/rest"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/devpki"
)

func TestNilMetricsRecordNothing(t *testing.T) {
	var b *Broker
	var e *Edge
	var x *Export
	// None of these may panic.
	b.HandshakeRefused("x")
	b.Export("e").IntentSent(&ferryv1.SyncIntent{})
	x.IntentAnswered(nil, nil, time.Now())
	x.ReportReceived("status")
	x.ReportAnswered("status", nil, &ferryv1.ReportResult{})
	x.Resynced(time.Now(), 1)
	x.ResyncObject(true)
	x.Attached()
	e.StreamAttempt("accepted")
	e.Connected(true)
	e.IntentReceived(&ferryv1.SyncIntent{})
	e.IntentDone(&ferryv1.SyncIntent{}, &ferryv1.IntentResult{})
	e.ReportQueued(&ferryv1.ConnectRequest{})
	e.ReportAnswered(&ferryv1.ReportResult{}, time.Now())
	e.SetSource(nil)
	var c *Common
	c.ObserveSyncLatency(ToKCP, time.Now())
	c.InstrumentClient(&rest.Config{}, "kcp")
	b.ObserveSyncLatency(ToKCP, time.Now())
	b.InstrumentClient(&rest.Config{}, "kcp")
	e.ObserveSyncLatency(ToKCP, time.Now())
	e.InstrumentClient(&rest.Config{}, "service")
	h := e.StatsHandler("/m")
	h.HandleRPC(h.TagRPC(context.Background(), &stats.RPCTagInfo{FullMethodName: "/m"}), &stats.OutPayload{WireLength: 10})
	_ = b.StatsHandler("/m")
}

func TestBrokerCounters(t *testing.T) {
	reg := prometheus.NewRegistry()
	b, err := NewBroker(reg)
	if err != nil {
		t.Fatal(err)
	}
	x := b.Export("root:a/a.example.com")
	x.IntentSent(&ferryv1.SyncIntent{Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{}}})
	x.IntentSent(&ferryv1.SyncIntent{RelatedTo: &ferryv1.RelatedTo{}})
	x.IntentAnswered(nil, &ferryv1.IntentResult{}, time.Now().Add(-2*time.Second))
	x.IntentAnswered(nil, &ferryv1.IntentResult{Error: &ferryv1.ApplyError{Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN}}, time.Now())
	x.ReportReceived("status")
	x.ReportAnswered("status", nil, &ferryv1.ReportResult{Error: &ferryv1.ApplyError{}})
	b.HandshakeRefused("identity_not_configured")

	for _, tc := range []struct {
		c    prometheus.Collector
		want float64
	}{
		{b.intentsSent.WithLabelValues("root:a/a.example.com", "upsert"), 1},
		{b.intentsSent.WithLabelValues("root:a/a.example.com", "related_delete"), 1},
		{b.intentsAcked.WithLabelValues("root:a/a.example.com"), 1},
		{b.intentsNacked.WithLabelValues("root:a/a.example.com", "forbidden"), 1},
		{b.reportsReceived.WithLabelValues("root:a/a.example.com", "status"), 1},
		{b.reportsRefused.WithLabelValues("root:a/a.example.com", "status"), 1},
		{b.handshakeRefusals.WithLabelValues("identity_not_configured"), 1},
	} {
		if got := testutil.ToFloat64(tc.c); got != tc.want {
			t.Errorf("%v = %v, want %v", tc.c, got, tc.want)
		}
	}
	if n := testutil.CollectAndCount(b.syncLatency); n != 1 {
		t.Errorf("latency series = %d, want 1", n)
	}
	// The 2 s acked intent falls in the 2.5 s bucket, not in the 1 s one.
	want := `
# HELP ferry_sync_latency_seconds End-to-end sync latency. to_service_cluster (broker): from a kcp change queued as an intent to the edge's acknowledgement that it applied it. to_kcp (edge): from a local status or related object queued as a report to the broker's answer that it wrote it to kcp.
# TYPE ferry_sync_latency_seconds histogram
`
	out := gatherText(t, reg, "ferry_sync_latency_seconds")
	if !strings.HasPrefix(out, strings.TrimPrefix(want, "\n")) ||
		!strings.Contains(out, `ferry_sync_latency_seconds_bucket{direction="to_service_cluster",le="1"} 0`) ||
		!strings.Contains(out, `ferry_sync_latency_seconds_bucket{direction="to_service_cluster",le="2.5"} 1`) {
		t.Errorf("latency histogram:\n%s", out)
	}
}

func TestBrokerStateGaugesReadTheSource(t *testing.T) {
	reg := prometheus.NewRegistry()
	b, err := NewBroker(reg)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	err = b.RegisterSource(reg, func() []EdgeState {
		eng := &EngineState{Pending: 3, InFlight: 2, OldestInFlight: now.Add(-time.Minute), Objects: map[string]int{"dbs": 7}, Refused: 4,
			Endpoints: map[string]bool{"https://shard-1/vw": true, "https://shard-2/vw": false}}
		return []EdgeState{
			{Identity: "a", Export: "root:x/x", Connected: true, ConnectedAt: now.Add(-time.Hour), Engine: eng},
			{Identity: "b", Export: "root:x/x", Engine: eng},
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	out := gatherText(t, reg, "")
	for _, want := range []string{
		`ferry_broker_edge_connected{export="root:x/x",identity="a"} 1`,
		`ferry_broker_edge_connected{export="root:x/x",identity="b"} 0`,
		`ferry_broker_outbox_depth{export="root:x/x",state="pending"} 3`,
		`ferry_broker_outbox_depth{export="root:x/x",state="in_flight"} 2`,
		`ferry_broker_objects{export="root:x/x",published_resource="dbs"} 7`,
		`ferry_broker_refused_messages_total{export="root:x/x"} 4`,
		`ferry_broker_virtual_workspace_endpoint_reachable{export="root:x/x",url="https://shard-1/vw"} 1`,
		`ferry_broker_virtual_workspace_endpoint_reachable{export="root:x/x",url="https://shard-2/vw"} 0`,
		`ferry_broker_outbox_oldest_unacked_age_seconds{export="root:x/x"} 6`, // 60.x
		`ferry_broker_edge_session_age_seconds{export="root:x/x",identity="a"} 3600`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %s in\n%s", want, out)
		}
	}
	if strings.Contains(out, `edge_session_age_seconds{export="root:x/x",identity="b"}`) {
		t.Error("a disconnected edge has a session age")
	}
}

func TestEdgeGaugesFollowTheCurrentEngine(t *testing.T) {
	reg := prometheus.NewRegistry()
	e, err := NewEdge(reg)
	if err != nil {
		t.Fatal(err)
	}
	if out := gatherText(t, reg, "ferry_edge_outbox_depth"); !strings.Contains(out, `state="pending"} 0`) {
		t.Errorf("without an engine the outbox is empty:\n%s", out)
	}
	e.SetSource(func() EdgeEngineState { return EdgeEngineState{Pending: 5, Objects: map[string]int{"dbs": 2}} })
	e.Connected(true)
	e.ReportQueued(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_StatusReport{}})
	e.ReportAnswered(&ferryv1.ReportResult{}, time.Now())
	e.IntentDone(&ferryv1.SyncIntent{}, &ferryv1.IntentResult{Error: &ferryv1.ApplyError{Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_READY}})
	out := gatherText(t, reg, "")
	for _, want := range []string{
		`ferry_edge_outbox_depth{state="pending"} 5`,
		`ferry_edge_objects{published_resource="dbs"} 2`,
		`ferry_edge_connected 1`,
		`ferry_edge_reports_queued_total{kind="status"} 1`,
		`ferry_edge_reports_answered_total{result="written"} 1`,
		`ferry_edge_intents_failed_total{reason="not_ready"} 1`,
		`ferry_sync_latency_seconds_count{direction="to_kcp"} 1`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %s in\n%s", want, out)
		}
	}
}

func TestCertificateExpiry(t *testing.T) {
	dir := t.TempDir()
	ca, err := devpki.LoadOrCreateCA(dir, "test")
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.IssueServer(dir, "broker", []string{"localhost"}); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if _, err := NewBroker(reg, Certificate{Role: "server", File: devpki.CertFile(dir, "broker")}); err != nil {
		t.Fatal(err)
	}
	out := gatherText(t, reg, "ferry_certificate_expiry_timestamp_seconds")
	if !strings.Contains(out, `ferry_certificate_expiry_timestamp_seconds{role="server"} `) {
		t.Errorf("no expiry:\n%s", out)
	}
	// A missing file is an error of that metric only, not of the scrape.
	reg = prometheus.NewRegistry()
	if _, err := NewEdge(reg, Certificate{Role: "client", File: filepath.Join(dir, "missing.crt")}); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Gather(); err == nil || !strings.Contains(err.Error(), "missing.crt") {
		t.Errorf("gather error = %v, want one naming the file", err)
	}
}

func TestInstrumentClientCountsRequests(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNotFound) }))
	defer srv.Close()
	reg := prometheus.NewRegistry()
	e, err := NewEdge(reg)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &rest.Config{Host: srv.URL}
	e.InstrumentClient(cfg, "service")
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := client.Get(srv.URL + "/api")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if got := testutil.ToFloat64(e.clientRequests.WithLabelValues("service", "get", "404")); got != 1 {
		t.Errorf("requests = %v, want 1", got)
	}
}

// gatherText is the registry's exposition, filtered to the metric family
// name when not empty.
func gatherText(t *testing.T, reg *prometheus.Registry, name string) string {
	t.Helper()
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if name == "" {
		return string(body)
	}
	var out strings.Builder
	for _, line := range strings.SplitAfter(string(body), "\n") {
		if strings.Contains(line, name) {
			out.WriteString(line)
		}
	}
	return out.String()
}

package e2e

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/test/framework"
)

// TestMetricsFollowTheWork scrapes both programs' /metrics before and after
// objects sync both ways, and checks the values that must move with the
// work: intents, reports, latency histograms, requests, message sizes, and
// the outboxes back to 0. Then it stops the broker: the edge's readiness
// fails, naming the broker, and passes again once the broker is back.
func TestMetricsFollowTheWork(t *testing.T) {
	ctx := context.Background()
	const n = 10
	e := newSyncEnv(t, "metrics.example.com", "Meter", "meters", nil)
	export := map[string]string{"export": e.export.String()}
	before := scrapeBoth(t, e)

	for i := range n {
		e.createRemote(t, "default", fmt.Sprintf("m%d", i), map[string]any{"fieldV1": "x"})
	}
	for i := range n {
		// Synced: the copy exists and the broker's finalizer landed (it is
		// written beside the intent, and a status write racing it makes it
		// retry, which this test does not count on).
		e.waitFinalizer(t, "default", fmt.Sprintf("m%d", i), true)
		local := e.waitLocal(t, "default", fmt.Sprintf("m%d", i), func(*unstructured.Unstructured) (bool, string) { return true, "" })
		_ = unstructured.SetNestedField(local.Object, "Ready", "status", "phase")
		if _, err := e.local.Namespace(local.GetNamespace()).UpdateStatus(ctx, local, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		e.waitRemote(t, "default", fmt.Sprintf("m%d", i), func(u *unstructured.Unstructured, err error) (bool, string) {
			if err != nil {
				return false, err.Error()
			}
			phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
			return phase == "Ready", "status.phase = " + phase
		})
	}

	// The outboxes drain: nothing pending or unanswered on either side.
	var broker, edge framework.Metrics
	err := framework.Eventually(ctx, time.Minute, 200*time.Millisecond, func(ctx context.Context) (bool, string) {
		s := scrapeBoth(t, e)
		broker, edge = s.broker, s.edge
		for _, c := range []struct {
			m      framework.Metrics
			name   string
			labels map[string]string
		}{
			{broker, "ferry_broker_outbox_depth", export},
			{broker, "ferry_broker_outbox_oldest_unacked_age_seconds", export},
			{edge, "ferry_edge_outbox_depth", nil},
			{edge, "ferry_edge_outbox_oldest_unacked_age_seconds", nil},
		} {
			if v, ok := c.m.Value(c.name, c.labels); !ok || v != 0 {
				return false, fmt.Sprintf("%s = %v (present %v)", c.name, v, ok)
			}
		}
		return true, ""
	})
	if err != nil {
		t.Fatal(err)
	}

	grew := func(side string, after, before framework.Metrics, name string, labels map[string]string, atLeast float64) {
		t.Helper()
		a, ok := after.Value(name, labels)
		if !ok {
			t.Errorf("%s: %s%v missing", side, name, labels)
			return
		}
		b, _ := before.Value(name, labels)
		if a-b < atLeast {
			t.Errorf("%s: %s%v grew by %v, want at least %v", side, name, labels, a-b, atLeast)
		}
	}
	up := map[string]string{"export": e.export.String(), "operation": "upsert"}
	grew("broker", broker, before.broker, "ferry_broker_intents_sent_total", up, n)
	grew("broker", broker, before.broker, "ferry_broker_intents_acked_total", export, n)
	grew("broker", broker, before.broker, "ferry_broker_reports_received_total", map[string]string{"export": e.export.String(), "kind": "status"}, n)
	grew("broker", broker, before.broker, "ferry_broker_reports_written_total", map[string]string{"export": e.export.String(), "kind": "status"}, n)
	grew("broker", broker, before.broker, "ferry_sync_latency_seconds", map[string]string{"direction": "to_service_cluster"}, n)
	grew("broker", broker, before.broker, "ferry_stream_message_size_bytes", map[string]string{"direction": "sent"}, n)
	grew("broker", broker, before.broker, "ferry_stream_message_size_bytes", map[string]string{"direction": "received"}, n)
	grew("broker", broker, before.broker, "ferry_client_requests_total", map[string]string{"cluster": "kcp"}, n)
	grew("edge", edge, before.edge, "ferry_edge_intents_received_total", map[string]string{"operation": "upsert"}, n)
	grew("edge", edge, before.edge, "ferry_edge_intents_applied_total", map[string]string{"operation": "upsert"}, n)
	grew("edge", edge, before.edge, "ferry_edge_reports_answered_total", map[string]string{"result": "written"}, n)
	grew("edge", edge, before.edge, "ferry_sync_latency_seconds", map[string]string{"direction": "to_kcp"}, n)
	grew("edge", edge, before.edge, "ferry_client_requests_total", map[string]string{"cluster": "service"}, n)

	// Every synced object fell into a finite latency bucket.
	for side, m := range map[string]framework.Metrics{"broker": broker, "edge": edge} {
		dir := map[string]string{"broker": "to_service_cluster", "edge": "to_kcp"}[side]
		buckets := m.Buckets("ferry_sync_latency_seconds", map[string]string{"direction": dir})
		total, _ := m.Value("ferry_sync_latency_seconds", map[string]string{"direction": dir})
		if buckets[60] != uint64(total) || buckets[math.Inf(1)] != uint64(total) {
			t.Errorf("%s latency: %v of %v syncs within 60 s (buckets %v)", side, buckets[60], total, buckets)
		}
	}
	for name, want := range map[string]float64{
		"ferry_broker_edge_connected": 1,
		"ferry_broker_objects":        n,
	} {
		labels := map[string]string{"export": e.export.String()}
		if name == "ferry_broker_edge_connected" {
			labels["identity"] = devpki.IdentityFor("edge")
		}
		if v, _ := broker.Value(name, labels); v != want {
			t.Errorf("broker: %s%v = %v, want %v", name, labels, v, want)
		}
	}
	if v, _ := edge.Value("ferry_edge_objects", map[string]string{"published_resource": "meters"}); v != n {
		t.Errorf("edge: ferry_edge_objects{published_resource=meters} = %v, want %d", v, n)
	}
	if v, _ := edge.Value("ferry_edge_connected", nil); v != 1 {
		t.Errorf("edge: ferry_edge_connected = %v, want 1", v)
	}
	for side, m := range map[string]framework.Metrics{"broker": broker, "edge": edge} {
		if v, ok := m.Value("ferry_certificate_expiry_timestamp_seconds", nil); !ok || time.Unix(int64(v), 0).Before(time.Now()) {
			t.Errorf("%s: certificate expiry %v (present %v)", side, time.Unix(int64(v), 0), ok)
		}
	}

	// Readiness: both ready; with the broker gone the edge is not, and
	// says why; once the broker is back it is ready again.
	waitProbe(t, e.broker.Process, "/readyz", http.StatusOK, "")
	waitProbe(t, e.edge, "/readyz", http.StatusOK, "")
	if err := e.broker.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	waitProbe(t, e.edge, "/readyz", http.StatusInternalServerError, "no established stream to the broker")
	waitProbe(t, e.edge, "/healthz", http.StatusOK, "") // alive all along: restarting it would not help
	if err := e.broker.Restart(ctx, false); err != nil {
		t.Fatal(err)
	}
	waitProbe(t, e.broker.Process, "/readyz", http.StatusOK, "")
	waitProbe(t, e.edge, "/readyz", http.StatusOK, "")
	after := scrapeBoth(t, e)
	if v, _ := after.edge.Value("ferry_edge_stream_attempts_total", map[string]string{"result": "accepted"}); v < 2 {
		t.Errorf("edge: accepted stream attempts = %v, want at least 2 (the reconnect)", v)
	}
}

type scrapes struct{ broker, edge framework.Metrics }

func scrapeBoth(t *testing.T, e *syncEnv) scrapes {
	t.Helper()
	b, err := framework.Scrape(context.Background(), e.broker.Process)
	if err != nil {
		t.Fatal(err)
	}
	ed, err := framework.Scrape(context.Background(), e.edge)
	if err != nil {
		t.Fatal(err)
	}
	return scrapes{broker: b, edge: ed}
}

// waitProbe waits until p's health endpoint path answers code with a body
// containing substr.
func waitProbe(t testing.TB, p *framework.Process, path string, code int, substr string) {
	t.Helper()
	err := framework.Eventually(context.Background(), time.Minute, 100*time.Millisecond, func(ctx context.Context) (bool, string) {
		got, body, err := framework.Probe(ctx, p, path)
		if err != nil {
			return false, err.Error()
		}
		return got == code && strings.Contains(body, substr), fmt.Sprintf("%d %q", got, body)
	})
	if err != nil {
		t.Fatalf("%s %s: %v", p.Name, path, err)
	}
}

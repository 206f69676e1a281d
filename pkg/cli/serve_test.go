package cli

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestServeHealthReportsTheFailingCheck(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var connected atomic.Bool
	broker := func(*http.Request) error {
		if !connected.Load() {
			return errors.New("no established stream to the broker")
		}
		return nil
	}
	addr, err := ServeHealth(ctx, "127.0.0.1:0", Checks{"ping": Ping}, Checks{"broker": broker}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	base := "http://" + addr.String()
	if code, _ := get(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d, want 200", code)
	}
	if code, body := get(t, base+"/readyz?verbose"); code != http.StatusInternalServerError || !strings.Contains(body, "[-]broker failed: no established stream to the broker") {
		t.Errorf("/readyz while disconnected = %d %q, want 500 naming the check", code, body)
	}
	connected.Store(true)
	if code, _ := get(t, base+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz once connected = %d, want 200", code)
	}
	if code, _ := get(t, base+"/readyz/broker"); code != http.StatusOK {
		t.Errorf("/readyz/broker = %d, want 200", code)
	}
}

func TestServeMetricsAndOff(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "ferry_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	addr, err := ServeMetrics(ctx, "127.0.0.1:0", reg, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, "http://"+addr.String()+"/metrics"); code != http.StatusOK || !strings.Contains(body, "ferry_test_total 3") {
		t.Errorf("/metrics = %d %q", code, body)
	}
	if addr, err := ServeMetrics(ctx, "0", reg, logr.Discard()); addr != nil || err != nil {
		t.Errorf(`"0" = %v, %v; want off`, addr, err)
	}
	if _, err := ServeHealth(ctx, "256.0.0.1:1", nil, nil, logr.Discard()); err == nil || !strings.Contains(err.Error(), "--health-probe-bind-address") {
		t.Errorf("bad address error = %v, want it to name the flag", err)
	}
}

// TestServeHealthDegraded: a degraded check passes the probe and says why
// in the body.
func TestServeHealthDegraded(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	shards := func(*http.Request) error {
		return &Degraded{Reason: "https://127.0.0.1:6445/services/apiexport/x/y unreachable"}
	}
	addr, err := ServeHealth(ctx, "127.0.0.1:0", Checks{"ping": Ping}, Checks{"virtual-workspaces": shards, "grpc": Ping}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	code, body := get(t, "http://"+addr.String()+"/readyz?verbose")
	if code != http.StatusOK || !strings.Contains(body, "[+]virtual-workspaces ok, degraded: https://127.0.0.1:6445/services/apiexport/x/y unreachable") || !strings.HasSuffix(body, "ok\n") {
		t.Errorf("/readyz with a degraded check = %d %q, want 200 naming what is degraded", code, body)
	}
}

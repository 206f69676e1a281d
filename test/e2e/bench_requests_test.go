package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// apiRequests counts, from an API server's own apiserver_request_total,
// the requests for one API group (every verb but WATCH, whose count is
// the number of watches opened, not of changes). The bench reads it
// before and after each phase on both servers: each side has groups of its
// own, so the difference is that side's requests plus the harness's (one
// write per object, one list per watch).
type apiRequests struct {
	client *http.Client
	url    string
	group  string
}

func newAPIRequests(tb testing.TB, cfg *rest.Config, group string) *apiRequests {
	tb.Helper()
	c, err := rest.HTTPClientFor(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	base, _, _ := strings.Cut(cfg.Host, "/clusters/")
	return &apiRequests{client: c, url: strings.TrimRight(base, "/") + "/metrics", group: group}
}

// kcpMetricsConfig is kcp's shard admin (its workspace admin may not read
// /metrics).
func kcpMetricsConfig(tb testing.TB) *rest.Config {
	tb.Helper()
	cfg, err := clientcmd.BuildConfigFromFlags("", env.kcp.StableKubeconfig)
	if err != nil {
		tb.Fatal(err)
	}
	return cfg
}

// count returns the server's request count for the group so far.
func (a *apiRequests) count(tb testing.TB) float64 {
	tb.Helper()
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, a.url, nil)
	if err != nil {
		tb.Fatal(err)
	}
	resp, err := a.client.Do(req)
	if err != nil {
		tb.Fatalf("metrics of %s: %v", a.url, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		tb.Fatalf("metrics of %s: %s %v", a.url, resp.Status, err)
	}
	n, err := sumRequests(string(data), a.group)
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// sumRequests adds up apiserver_request_total for group in a Prometheus
// text exposition, WATCH requests left out.
func sumRequests(exposition, group string) (float64, error) {
	var sum float64
	for _, line := range strings.Split(exposition, "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") ||
			!strings.Contains(line, `group="`+group+`"`) || strings.Contains(line, `verb="WATCH"`) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("cannot parse %q: %w", line, err)
		}
		sum += v
	}
	return sum, nil
}

func TestSumRequests(t *testing.T) {
	exposition := `# TYPE apiserver_request_total counter
apiserver_request_total{code="200",group="a.example",resource="things",verb="PATCH"} 7
apiserver_request_total{code="201",group="a.example",resource="things",verb="POST"} 3
apiserver_request_total{code="200",group="a.example",resource="things",verb="WATCH"} 100
apiserver_request_total{code="200",group="b.example",resource="things",verb="PATCH"} 5
apiserver_request_duration_seconds_count{group="a.example",verb="PATCH"} 7
`
	got, err := sumRequests(exposition, "a.example")
	if err != nil || got != 10 {
		t.Fatalf("got %v, %v; want 10", got, err)
	}
}

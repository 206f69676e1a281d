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

	"github.com/ferry-dev/ferry/test/framework"
)

// apiRequests counts by verb, from an API server's own
// apiserver_request_total, the requests for one API group (every verb but
// WATCH, whose count is the number of watches opened, not of changes). The
// bench reads it before and after each phase on both servers: each side
// has groups of its own, so the difference is that side's requests plus
// the harness's (one write per object, one list per watch).
type apiRequests struct {
	client *http.Client
	url    string
	group  string
	// also are further servers whose counts add to this one's: the other
	// shards of a sharded kcp, each counting only what it served.
	also []*apiRequests
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

// shardedKCPRequests counts the requests for group on every shard of k,
// each asked directly as its admin.
func shardedKCPRequests(tb testing.TB, k *framework.ShardedKCP, group string) *apiRequests {
	tb.Helper()
	var all []*apiRequests
	for _, s := range k.Shards {
		cfg, err := k.ShardConfig(s.Name)
		if err != nil {
			tb.Fatal(err)
		}
		all = append(all, newAPIRequests(tb, cfg, group))
	}
	all[0].also = all[1:]
	return all[0]
}

// count returns the server's request count for the group so far, by verb
// (summed with those of also).
func (a *apiRequests) count(tb testing.TB) requestCounts {
	tb.Helper()
	n := a.countOne(tb)
	for _, more := range a.also {
		for verb, c := range more.countOne(tb) {
			n[verb] += c
		}
	}
	return n
}

func (a *apiRequests) countOne(tb testing.TB) requestCounts {
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

// requestCounts are request counts by verb.
type requestCounts map[string]float64

// total is the count over every verb.
func (c requestCounts) total() float64 {
	var sum float64
	for _, n := range c {
		sum += n
	}
	return sum
}

// perObject is c - before per object, by verb (verbs without requests
// left out).
func (c requestCounts) perObject(before requestCounts, objects int) map[string]float64 {
	out := map[string]float64{}
	for verb, n := range c {
		if d := n - before[verb]; d > 0 {
			out[verb] = d / float64(objects)
		}
	}
	return out
}

// sumRequests adds up apiserver_request_total for group by verb in a
// Prometheus text exposition, WATCH requests left out.
func sumRequests(exposition, group string) (requestCounts, error) {
	sum := requestCounts{}
	for _, line := range strings.Split(exposition, "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") ||
			!strings.Contains(line, `group="`+group+`"`) || strings.Contains(line, `verb="WATCH"`) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return nil, fmt.Errorf("cannot parse %q: %w", line, err)
		}
		_, verb, ok := strings.Cut(line[:i], `verb="`)
		if verb, _, ok = strings.Cut(verb, `"`); !ok || verb == "" {
			return nil, fmt.Errorf("no verb in %q", line)
		}
		sum[verb] += v
	}
	return sum, nil
}

func TestSumRequests(t *testing.T) {
	exposition := `# TYPE apiserver_request_total counter
apiserver_request_total{code="200",group="a.example",resource="things",verb="PATCH"} 7
apiserver_request_total{code="409",group="a.example",resource="things",verb="PATCH"} 1
apiserver_request_total{code="201",group="a.example",resource="things",verb="POST"} 3
apiserver_request_total{code="200",group="a.example",resource="things",verb="WATCH"} 100
apiserver_request_total{code="200",group="b.example",resource="things",verb="PATCH"} 5
apiserver_request_duration_seconds_count{group="a.example",verb="PATCH"} 7
`
	got, err := sumRequests(exposition, "a.example")
	if err != nil || got.total() != 11 || got["PATCH"] != 8 || got["POST"] != 3 || len(got) != 2 {
		t.Fatalf("got %v, %v; want PATCH 8, POST 3", got, err)
	}
	per := requestCounts{"PATCH": 12, "POST": 3, "GET": 1}.perObject(got, 2)
	if len(per) != 2 || per["PATCH"] != 2 || per["GET"] != 0.5 {
		t.Errorf("per object: %v; want PATCH 2, GET 0.5", per)
	}
	if _, err := sumRequests(`apiserver_request_total{group="a.example"} 1`, "a.example"); err == nil {
		t.Error("a line without a verb was counted")
	}
}

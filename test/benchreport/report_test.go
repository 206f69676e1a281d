package benchreport

import (
	"bytes"
	"encoding/json"
	"encoding/xml"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	vals := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for _, tc := range []struct {
		p    int
		want float64
	}{{50, 5}, {90, 9}, {99, 10}, {100, 10}, {1, 1}} {
		if got := Percentile(vals, tc.p); got != tc.want {
			t.Errorf("p%d = %v, want %v", tc.p, got, tc.want)
		}
	}
	if got := Percentile(nil, 50); got != 0 {
		t.Errorf("p50 of nothing = %v", got)
	}
}

func sample() Report {
	ms := func(v ...int) []time.Duration {
		var out []time.Duration
		for _, x := range v {
			out = append(out, time.Duration(x)*time.Millisecond)
		}
		return out
	}
	phase := func(name string, wall time.Duration, kcpCPU float64, verbs map[string]float64, latencies ...int) Phase {
		p := NewPhase(name, 4, wall, ms(latencies...))
		p.KCPCPUSeconds, p.KCPRequestsByVerb = kcpCPU, verbs
		for _, n := range verbs {
			p.KCPRequests += n
		}
		if name == "delete" {
			p.SetLocalLatencies(ms(latencies...)[:2])
		}
		return p
	}
	return Report{Date: time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC), Machine: "2 cores <test>", Workspaces: 1, PerWS: 4,
		Runs: []Run{
			{System: Floor, Phases: []Phase{
				phase("create", time.Second, 0.4, map[string]float64{"POST": 1}, 100, 200, 300, 400),
				phase("delete", time.Second, 0.2, map[string]float64{"DELETE": 1}, 100, 200, 300, 400)},
				Processes: []Process{{Name: "directcopy", PeakRSSBytes: 40 << 20, CPUSeconds: 1}}},
			{System: Direct, Phases: []Phase{
				phase("create", 2*time.Second, 0.8, map[string]float64{"POST": 1, "PATCH": 1}, 400, 100, 200, 300),
				phase("delete", 2*time.Second, 0.6, map[string]float64{"DELETE": 1, "PATCH": 1}, 400, 100, 200, 300)},
				Processes: []Process{{Name: "directcopy", PeakRSSBytes: 50 << 20, CPUSeconds: 2}}},
			{System: Ferry, Phases: []Phase{
				phase("create", 3*time.Second, 1.2, map[string]float64{"POST": 1, "PATCH": 2}, 500, 600, 700, 800),
				{Name: "edge-restart", WallSeconds: 0.5},
				phase("delete", 4*time.Second, 0.6, map[string]float64{"DELETE": 1, "PATCH": 1}, 1500, 600, 700, 800)},
				Processes: []Process{{Name: "ferry-broker", PeakRSSBytes: 40 << 20, CPUSeconds: 1}, {Name: "ferry-edge", PeakRSSBytes: 35 << 20, CPUSeconds: 2}}},
		}}
}

func TestTableShowsRatios(t *testing.T) {
	var b bytes.Buffer
	if err := sample().Table(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{
		"ferry/direct  ferry/floor", "3.00s         1.50x        3.00x", "p50", "edge-restart", "75 MiB", "ferry-broker peak RSS 40 MiB",
		"kcp CPU/obj", "300.0ms", "kcp PATCH/obj", "kcp POST/obj", "local gone p50",
		"create wall             3.00x (<= 2x)", "create p99              0.80s, floor 0.40s",
		"delete local gone p50   0.60s, floor 0.10s", "kcp CPU per object      3.00x over create, update, status and delete; create 3.00x, delete 3.00x",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestAgainstFloor(t *testing.T) {
	c, ok := sample().AgainstFloor()
	want := FloorComparison{CreateWallRatio: 3, CreateP99: 0.8, FloorCreateP99: 0.4, DeleteWallRatio: 4,
		DeleteLocalP50: 0.6, FloorDeleteLocalP50: 0.1, KCPCPUPerObjectRatio: 3, CreateKCPCPUPerObjectRatio: 3, DeleteKCPCPUPerObjectRatio: 3}
	// Rounded: the CPU ratios are divisions of divisions.
	round := func(c FloorComparison) FloorComparison {
		for _, v := range []*float64{&c.KCPCPUPerObjectRatio, &c.CreateKCPCPUPerObjectRatio, &c.DeleteKCPCPUPerObjectRatio} {
			*v = math.Round(*v*1e6) / 1e6
		}
		return c
	}
	if !ok || round(c) != want {
		t.Errorf("got %+v, %v; want %+v", c, ok, want)
	}
	r := sample()
	r.Runs = r.Runs[1:]
	if _, ok := r.AgainstFloor(); ok {
		t.Error("compared without a floor")
	}
	var b bytes.Buffer
	if err := r.Table(&b); err != nil || strings.Contains(b.String(), "floor") {
		t.Errorf("a report without a floor shows one (%v):\n%s", err, b.String())
	}
}

func TestWriteJSON(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bench.json")
	if err := sample().WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Runs []struct {
			System string  `json:"system"`
			Phases []Phase `json:"phases"`
		} `json:"runs"`
		AgainstFloor *FloorComparison `json:"againstFloor"`
	}
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Runs) != 3 || got.AgainstFloor == nil || got.AgainstFloor.CreateWallRatio != 3 {
		t.Fatalf("JSON %s", data)
	}
	if p := got.Runs[0].Phases[0]; p.KCPCPUSeconds != 0.4 || p.KCPRequestsByVerb["POST"] != 1 {
		t.Errorf("floor create in JSON: %+v", p)
	}
}

func TestSVGIsWellFormed(t *testing.T) {
	var b bytes.Buffer
	if err := sample().SVG(&b); err != nil {
		t.Fatal(err)
	}
	svg := b.String()
	d := xml.NewDecoder(strings.NewReader(svg))
	polylines := 0
	for {
		tok, err := d.Token()
		if err != nil {
			break
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
			polylines++
		}
	}
	if polylines != 9 {
		t.Errorf("%d curves, want 9 (create: 3 systems; delete: 3 systems and their local copies gone)", polylines)
	}
	if !strings.Contains(svg, "ferry / floor: create wall 3.00x") {
		t.Error("no comparison with the floor")
	}
	if !strings.Contains(svg, "2 cores &lt;test&gt;") {
		t.Error("machine name not escaped")
	}
}

func TestReadUsage(t *testing.T) {
	u, err := ReadUsage(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if u.PeakRSSBytes < 1<<20 || u.RSSBytes < 1<<20 || u.RSSBytes > u.PeakRSSBytes || u.CPUSeconds < 0 {
		t.Errorf("usage of the test process: %+v", u)
	}
	sum := u.Add(Usage{PeakRSSBytes: 1, CPUSeconds: 1})
	if sum.PeakRSSBytes != u.PeakRSSBytes || sum.CPUSeconds != u.CPUSeconds+1 {
		t.Errorf("Add: %+v", sum)
	}
}

func TestWorkspacesReport(t *testing.T) {
	r := WorkspacesReport{Workspaces: 4, PerWS: 2, Parallel: 8, Machine: "2 cores", Memory: []MemorySample{
		{At: "idle", BrokerRSS: 40 << 20, BrokerHeap: 10 << 20},
		{At: "synced", BrokerRSS: 44 << 20, BrokerHeap: 12 << 20},
	}, Phases: []Phase{NewPhase("create", 8, time.Second, []time.Duration{time.Second})},
		PerWorkspace: []WorkspaceLatencies{NewWorkspaceLatencies("create", []time.Duration{2 * time.Second, time.Second})}}
	rss, heap, ok := r.PerWorkspaceBytes()
	if !ok || rss != 1<<20 || heap != 512<<10 {
		t.Errorf("per workspace: %v %v %v; want 1 MiB and 512 KiB", rss, heap, ok)
	}
	if l := r.PerWorkspace[0]; l.P50 != 1 || l.Max != 2 {
		t.Errorf("per-workspace latencies: %+v", l)
	}
	var b strings.Builder
	if err := r.Table(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"no floor or direct copy", "broker per workspace", "1024.0 KiB", "create"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	path := filepath.Join(t.TempDir(), "ws.json")
	if err := r.WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(data), `"brokerRSSBytesPerWorkspace": 1048576`) {
		t.Errorf("JSON: %s %v", data, err)
	}
}

func TestWorkspacesReportShards(t *testing.T) {
	r := WorkspacesReport{Workspaces: 4, PerWS: 2, Machine: "2 cores", Shards: []ShardFigures{
		{Name: "root", Workspaces: 2, Phases: []ShardPhase{{
			WorkspaceLatencies: NewWorkspaceLatencies("create", []time.Duration{time.Second, 3 * time.Second}), WallSeconds: 3.5}}},
		{Name: "shard-1", Workspaces: 2, Phases: []ShardPhase{{
			WorkspaceLatencies: NewWorkspaceLatencies("create", []time.Duration{2 * time.Second, 2 * time.Second}), WallSeconds: 2.5}}},
	}}
	var b strings.Builder
	if err := r.Table(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"on 2 kcp shards", "all done after", "root", "3.50s", "shard-1", "2.50s"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, b.String())
		}
	}
	path := filepath.Join(t.TempDir(), "ws.json")
	if err := r.WriteJSON(path); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(data), `"wallSeconds": 3.5`) || !strings.Contains(string(data), `"name": "shard-1"`) {
		t.Errorf("JSON: %s %v", data, err)
	}
	// One kcp: no shard table.
	b.Reset()
	r.Shards = nil
	if err := r.Table(&b); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "all done after") || !strings.Contains(b.String(), "on one kcp") {
		t.Errorf("one kcp's table:\n%s", b.String())
	}
}

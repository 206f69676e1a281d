package edgeload

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is what `make bench-edges` measures.
type Report struct {
	Date    time.Time `json:"date"`
	Machine string    `json:"machine"`
	Edges   int       `json:"edges"`
	// Workspaces are the workspaces the edges' APIExports are spread
	// over, round-robin.
	Workspaces int `json:"workspaces"`
	// BrokerArgs are the flags the broker ran with beyond the harness's.
	BrokerArgs []string `json:"brokerArgs,omitempty"`
	// HeartbeatSeconds is the negotiated heartbeat interval.
	HeartbeatSeconds float64 `json:"heartbeatSeconds"`
	// WorkspacesSetupSeconds is the time kcp took to create those
	// workspaces and make them ready.
	WorkspacesSetupSeconds float64 `json:"workspacesSetupSeconds"`
	// ExportsSetupSeconds is the time kcp took to create the edges'
	// APIExports (N across the workspaces).
	ExportsSetupSeconds float64 `json:"exportsSetupSeconds"`
	// Samples are the broker at each point: idle (every edge configured,
	// none connected), connected (every edge connected, after the steady
	// window) and after each storm.
	Samples []Sample `json:"samples"`
	// KCPSettle is the wait, before the idle window, for kcp to be quiet
	// after the APIExports were created.
	KCPSettle Settle `json:"kcpSettle"`
	// Idle is the CPU use before any edge connected: broker and kcp.
	Idle CPUWindow `json:"idle"`
	// Steady is the CPU use over the steady window, every edge connected
	// and idle but for heartbeats and the traffic edges' intents and
	// reports: broker, kcp and this generator.
	Steady CPUWindow `json:"steady"`
	// Traffic is the intent and report traffic of the steady window; nil
	// when no edge had traffic.
	Traffic *Traffic `json:"traffic,omitempty"`
	// Waves are the connect waves: the cold start of every edge at once,
	// then the reconnect storms.
	Waves []Wave `json:"waves"`
}

// Settle is a wait for kcp to be quiet: how long, and its CPU use in
// the last window (cores).
type Settle struct {
	Seconds float64 `json:"seconds"`
	Cores   float64 `json:"cores"`
	Quiet   bool    `json:"quiet"`
}

// PerEdge is the broker's cost per connected edge: the difference between
// the connected and the idle sample, divided by the edges, and the steady
// CPU per edge.
type PerEdge struct {
	RSSBytes   float64
	HeapBytes  float64
	Goroutines float64
	MilliCores float64
}

// PerEdge computes the per-edge figures; false without both samples.
func (r *Report) PerEdge() (PerEdge, bool) {
	idle, ok1 := r.sample("idle")
	conn, ok2 := r.sample("connected")
	if !ok1 || !ok2 || r.Edges == 0 {
		return PerEdge{}, false
	}
	n := float64(r.Edges)
	return PerEdge{
		RSSBytes:   float64(conn.RSSBytes-idle.RSSBytes) / n,
		HeapBytes:  float64(conn.HeapBytes-idle.HeapBytes) / n,
		Goroutines: float64(conn.Goroutines-idle.Goroutines) / n,
		MilliCores: r.Steady.Cores["broker"] * 1000 / n,
	}, true
}

func (r *Report) sample(at string) (Sample, bool) {
	i := slices.IndexFunc(r.Samples, func(s Sample) bool { return s.At == at })
	if i < 0 {
		return Sample{}, false
	}
	return r.Samples[i], true
}

// WriteTable writes the human-readable table.
func (r *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "ferry bench-edges, %s, %s\n", r.Date.Format(time.RFC3339), r.Machine)
	fmt.Fprintf(w, "%d simulated edges (own certificate and APIExport each, ferry's edge stream client, real mTLS on loopback), heartbeat %gs\n",
		r.Edges, r.HeartbeatSeconds)
	if len(r.BrokerArgs) > 0 {
		fmt.Fprintf(w, "broker flags: %s\n", strings.Join(r.BrokerArgs, " "))
	}
	fmt.Fprintf(w, "kcp created the %d APIExports in %.1fs", r.Edges, r.ExportsSetupSeconds)
	switch {
	case r.Workspaces > 1:
		fmt.Fprintf(w, ", spread over %d workspaces (created in %.1fs)", r.Workspaces, r.WorkspacesSetupSeconds)
	case r.Workspaces == 1:
		fmt.Fprint(w, ", all in one workspace")
	}
	if r.KCPSettle.Seconds > 0 {
		quiet := "quiet"
		if !r.KCPSettle.Quiet {
			quiet = "NOT quiet"
		}
		fmt.Fprintf(w, "; the waves started when kcp was %s (%.2f cores) %.0fs later", quiet, r.KCPSettle.Cores, r.KCPSettle.Seconds)
	}
	fmt.Fprintf(w, "\n\n")

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "broker at\tedges connected\tRSS MiB\theap MiB\tgoroutines\tCPU s (total)\t")
	for _, s := range r.Samples {
		fmt.Fprintf(tw, "%s\t%d\t%.1f\t%.1f\t%d\t%.1f\t\n", s.At, s.Connected, mib(s.RSSBytes), mib(s.HeapBytes), s.Goroutines, s.CPUSeconds)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(w)
	writeCPU(w, "idle, no edge connected", r.Idle)
	steady := "steady state, every edge connected"
	if r.Traffic != nil {
		steady += fmt.Sprintf(", %d with traffic", r.Traffic.Edges)
	}
	writeCPU(w, steady, r.Steady)
	if r.Traffic != nil {
		writeTraffic(w, r.Traffic)
	}
	if p, ok := r.PerEdge(); ok {
		fmt.Fprintf(w, "per connected edge at the broker: RSS %.1f KiB, heap %.1f KiB, %.1f goroutines, %.2f millicores\n",
			p.RSSBytes/1024, p.HeapBytes/1024, p.Goroutines, p.MilliCores)
	}
	fmt.Fprintln(w)

	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "wave\taccepted\tall in s\thandshakes/s\tp50 s\tp99 s\tmax s\tattempts\tfailed\tmax/edge\tover cap\tbroker CPU s\tkcp requests\trefusals\t")
	for _, v := range r.Waves {
		fmt.Fprintf(tw, "%s\t%d/%d\t%.2f\t%.0f\t%.2f\t%.2f\t%.2f\t%d\t%d\t%d\t%d (>%gs)\t%.1f\t%.0f\t%s\t\n", v.Name, v.Accepted, v.Edges, v.Seconds,
			v.HandshakesPerSecond, v.P50Seconds, v.P99Seconds, v.MaxSeconds, v.Attempts, v.FailedAttempts, v.MaxAttempts,
			v.OverCap, v.CapSeconds, v.BrokerCPUSeconds, v.KCPRequests, refusals(v.Refusals))
	}
	return tw.Flush()
}

// writeCPU writes one CPU window's line.
func writeCPU(w io.Writer, what string, c CPUWindow) {
	fmt.Fprintf(w, "%s, %.0fs window (CPU cores):", what, c.Seconds)
	names := make([]string, 0, len(c.Cores))
	for n := range c.Cores {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(w, " %s %.3f", n, c.Cores[n])
	}
	if c.KCPRequestsPerSecond > 0 {
		fmt.Fprintf(w, "; broker requests to kcp %.1f/s", c.KCPRequestsPerSecond)
	}
	fmt.Fprintln(w)
}

// writeTraffic writes the steady window's intent and report lines.
func writeTraffic(w io.Writer, t *Traffic) {
	fmt.Fprintf(w, "traffic: %d edges publish a CRD each (published and bound in one consumer workspace in %.1fs, every edge's first intent %.1fs after the first write); in the window the generator wrote %d objects in kcp (%d failed), %.1f/s for a target of %g/s\n",
		t.Edges, t.SetupSeconds, t.FirstIntentsSeconds, t.Writes, t.WriteErrors, float64(t.Writes)/max(t.Seconds, 1e-9), t.TargetObjectsPerSecond)
	fmt.Fprintf(w, "  at the edges: %.1f intents/s (%d, %d refused), %.1f reports/s (%d), %.1f report answers/s (%d, %d failed), %d reports unanswered at the end\n",
		t.IntentsPerSecond, t.Counts.Intents, t.Counts.Nacks, t.ReportsPerSecond, t.Counts.Reports,
		t.ReportResultsPerSecond, t.Counts.ReportResults, t.Counts.ReportErrors, t.PendingReports)
	if t.RoundTrips > 0 {
		fmt.Fprintf(w, "  intent round trip (generator's kcp write → intent at the edge), %d intents: p50 %.3fs, p99 %.3fs, max %.3fs\n",
			t.RoundTrips, t.RoundTripP50Seconds, t.RoundTripP99Seconds, t.RoundTripMaxSeconds)
	}
}

func refusals(m map[string]float64) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for reason, n := range m {
		parts = append(parts, fmt.Sprintf("%s=%.0f", reason, n))
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// Write writes bench-edges.txt (the table) and bench-edges.json to dir.
func (r *Report) Write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var sb strings.Builder
	if err := r.WriteTable(&sb); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "bench-edges.txt"), []byte(sb.String()), 0o644); err != nil {
		return err
	}
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "bench-edges.json"), append(data, '\n'), 0o644)
}

package benchreport

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"text/tabwriter"
	"time"
)

// WorkspacesReport is what `make bench-workspaces` measures: many
// workspaces with few objects each, through ferry alone. The figures asked
// of this shape are ferry's own (memory per workspace, time until every
// workspace is synced), so the floor and the direct copy, which answer
// "how much does ferry cost over a plain copy", do not run here.
type WorkspacesReport struct {
	Date       time.Time `json:"date"`
	Machine    string    `json:"machine"`
	Workspaces int       `json:"workspaces"`
	PerWS      int       `json:"objectsPerWorkspace"`
	// Parallel is how many workspaces were created and bound at once.
	Parallel int `json:"createParallelism"`
	// SetupSeconds is the time to create every workspace and bind the
	// export in it (kcp's cost, ferry only watches).
	SetupSeconds float64 `json:"setupSeconds"`
	// Memory is ferry's memory at each point of the run, in order: idle
	// (no consumer workspace bound), bound (every workspace bound, no
	// object) and synced (every object synced, its status back).
	Memory []MemorySample `json:"memory"`
	// Phases are create, status and delete over every object, as in the
	// sync bench.
	Phases []Phase `json:"phases"`
	// PerWorkspace are, per phase, the times from a workspace's first
	// write until all of its objects were done.
	PerWorkspace []WorkspaceLatencies `json:"perWorkspace"`
	// Processes are broker's and edge's usage over the whole run.
	Processes []Process `json:"processes"`
	// Shards are the per-shard figures on a sharded kcp (none on one kcp).
	Shards []ShardFigures `json:"shards,omitempty"`
}

// ShardFigures are one kcp shard's part of the run: its workspaces and,
// per phase, how long until every one of them was done.
type ShardFigures struct {
	Name       string       `json:"name"`
	Workspaces int          `json:"workspaces"`
	Phases     []ShardPhase `json:"phases"`
}

// ShardPhase is one phase on one shard: from the phase's first write until
// the shard's last workspace was done (WallSeconds), and the shard's
// per-workspace times.
type ShardPhase struct {
	WorkspaceLatencies
	WallSeconds float64 `json:"wallSeconds"`
}

// MemorySample is broker's and edge's memory at one point of the run.
type MemorySample struct {
	At        string `json:"at"`
	BrokerRSS int64  `json:"brokerRSSBytes"`
	EdgeRSS   int64  `json:"edgeRSSBytes"`
	// BrokerHeap and EdgeHeap are the Go heap in use right after a GC:
	// what the programs keep, without the garbage RSS still holds.
	BrokerHeap int64 `json:"brokerHeapInuseBytes"`
	EdgeHeap   int64 `json:"edgeHeapInuseBytes"`
}

// WorkspaceLatencies are one phase's per-workspace times, sorted.
type WorkspaceLatencies struct {
	Phase   string    `json:"phase"`
	Seconds []float64 `json:"-"`
	P50     float64   `json:"p50Seconds"`
	P99     float64   `json:"p99Seconds"`
	Max     float64   `json:"maxSeconds"`
}

// NewWorkspaceLatencies sorts latencies and computes their percentiles.
func NewWorkspaceLatencies(phase string, latencies []time.Duration) WorkspaceLatencies {
	l := WorkspaceLatencies{Phase: phase}
	for _, d := range latencies {
		l.Seconds = append(l.Seconds, d.Seconds())
	}
	slices.Sort(l.Seconds)
	l.P50, l.P99, l.Max = Percentile(l.Seconds, 50), Percentile(l.Seconds, 99), Percentile(l.Seconds, 100)
	return l
}

// Sample returns the memory sample taken at at.
func (r WorkspacesReport) Sample(at string) (MemorySample, bool) {
	for _, m := range r.Memory {
		if m.At == at {
			return m, true
		}
	}
	return MemorySample{}, false
}

// PerWorkspaceBytes is how much more the broker holds (resident, and Go
// heap in use after a GC) with every workspace synced than idle, divided
// by the number of workspaces; false without both samples.
func (r WorkspacesReport) PerWorkspaceBytes() (rss, heap float64, ok bool) {
	idle, ok1 := r.Sample("idle")
	synced, ok2 := r.Sample("synced")
	if !ok1 || !ok2 || r.Workspaces == 0 {
		return 0, 0, false
	}
	w := float64(r.Workspaces)
	return float64(synced.BrokerRSS-idle.BrokerRSS) / w, float64(synced.BrokerHeap-idle.BrokerHeap) / w, true
}

// Phase returns the phase named name.
func (r WorkspacesReport) Phase(name string) (Phase, bool) {
	for _, p := range r.Phases {
		if p.Name == name {
			return p, true
		}
	}
	return Phase{}, false
}

// Table prints the report for people.
func (r WorkspacesReport) Table(w io.Writer) error {
	on := "one kcp"
	if len(r.Shards) > 0 {
		on = fmt.Sprintf("%d kcp shards", len(r.Shards))
	}
	fmt.Fprintf(w, "%d workspaces x %d objects on %s, ferry only (figures per workspace; no floor or direct copy), %s, %s\n",
		r.Workspaces, r.PerWS, on, r.Machine, r.Date.Format(time.DateOnly))
	fmt.Fprintf(w, "setup: %d workspaces created and bound, %d at once, in %.1fs\n", r.Workspaces, r.Parallel, r.SetupSeconds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "memory\tbroker RSS\tbroker heap\tedge RSS\tedge heap\t")
	for _, m := range r.Memory {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", m.At, mib(float64(m.BrokerRSS)), mib(float64(m.BrokerHeap)),
			mib(float64(m.EdgeRSS)), mib(float64(m.EdgeHeap)))
	}
	if rss, heap, ok := r.PerWorkspaceBytes(); ok {
		fmt.Fprintf(tw, "broker per workspace\t%s\t%s\t\t\t\n", kib(rss), kib(heap))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\tobjects\twall\tobject p50\tobject p99\tworkspace p50\tworkspace p99\tworkspace max\tkcp req/object\t")
	for _, p := range r.Phases {
		var ws WorkspaceLatencies
		for _, l := range r.PerWorkspace {
			if l.Phase == p.Name {
				ws = l
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%.2fs\t%.2fs\t%.2fs\t%.2fs\t%.2fs\t%.2fs\t%.2f\t\n", p.Name, p.Objects, p.WallSeconds, p.P50, p.P99,
			ws.P50, ws.P99, ws.Max, p.KCPRequests)
	}
	for _, p := range r.Processes {
		fmt.Fprintf(tw, "process %s\tpeak %s\tCPU %.1fs\t\t\t\t\t\t\t\n", p.Name, mib(float64(p.PeakRSSBytes)), p.CPUSeconds)
	}
	if err := tw.Flush(); err != nil || len(r.Shards) == 0 {
		return err
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "shard\tworkspaces\tphase\tall done after\tworkspace p50\tworkspace p99\tworkspace max\t")
	for _, sh := range r.Shards {
		for _, p := range sh.Phases {
			fmt.Fprintf(tw, "%s\t%d\t%s\t%.2fs\t%.2fs\t%.2fs\t%.2fs\t\n", sh.Name, sh.Workspaces, p.Phase, p.WallSeconds, p.P50, p.P99, p.Max)
		}
	}
	return tw.Flush()
}

// WriteJSON writes the report to path, with the broker's memory per
// workspace.
func (r WorkspacesReport) WriteJSON(path string) error {
	out := struct {
		WorkspacesReport
		BrokerRSSPerWorkspace  float64 `json:"brokerRSSBytesPerWorkspace"`
		BrokerHeapPerWorkspace float64 `json:"brokerHeapInuseBytesPerWorkspace"`
	}{WorkspacesReport: r}
	out.BrokerRSSPerWorkspace, out.BrokerHeapPerWorkspace, _ = r.PerWorkspaceBytes()
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

func mib(b float64) string { return fmt.Sprintf("%.1f MiB", b/(1<<20)) }
func kib(b float64) string { return fmt.Sprintf("%.1f KiB", b/(1<<10)) }

// Package benchreport holds what `make bench` measures and how it shows it:
// per system (the direct-copy baseline and ferry) and phase, wall time and
// per-object latencies, and per process peak memory and CPU time; printed
// as a table of ratios ferry / direct, written as JSON and drawn as an SVG
// of latency distributions.
package benchreport

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Systems the bench compares.
const (
	Direct = "direct"
	Ferry  = "ferry"
)

// Phase is one step of a run.
type Phase struct {
	// Name is create, update, status, delete, edge-restart or broker-restart.
	Name string `json:"name"`
	// Objects is how many objects the phase touched.
	Objects int `json:"objects"`
	// WallSeconds is from the first write to the last object done.
	WallSeconds float64 `json:"wallSeconds"`
	// Latencies are per object, from the write on one side to the change
	// seen on the other, in seconds, sorted. Empty for restart phases.
	Latencies []float64 `json:"-"`
	P50       float64   `json:"p50Seconds,omitempty"`
	P90       float64   `json:"p90Seconds,omitempty"`
	P99       float64   `json:"p99Seconds,omitempty"`
	// Writes counts objects rewritten where nothing should have been
	// (restart phases: resourceVersions that moved on either side).
	Writes int `json:"writes"`
	// KCPRequests and LocalRequests are the API requests per object kcp
	// and the service cluster served for the system's resources (WATCH
	// left out), the harness's own write included.
	KCPRequests   float64 `json:"kcpRequestsPerObject"`
	LocalRequests float64 `json:"localRequestsPerObject"`
	// WireBytes is the bytes per object between edge and broker, both
	// ways, TLS included (ferry only: the direct copy has no such hop).
	WireBytes float64 `json:"wireBytesPerObject,omitempty"`
}

// ObjectsPerSecond is the phase's throughput.
func (p Phase) ObjectsPerSecond() float64 {
	if p.WallSeconds == 0 {
		return 0
	}
	return float64(p.Objects) / p.WallSeconds
}

// NewPhase returns a phase with its latency percentiles computed.
func NewPhase(name string, objects int, wall time.Duration, latencies []time.Duration) Phase {
	p := Phase{Name: name, Objects: objects, WallSeconds: wall.Seconds()}
	for _, d := range latencies {
		p.Latencies = append(p.Latencies, d.Seconds())
	}
	slices.Sort(p.Latencies)
	p.P50, p.P90, p.P99 = Percentile(p.Latencies, 50), Percentile(p.Latencies, 90), Percentile(p.Latencies, 99)
	return p
}

// Percentile is the nearest-rank percentile of sorted values (0 for none).
func Percentile(sorted []float64, p int) float64 {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(float64(p) / 100 * float64(len(sorted))))
	return sorted[min(max(rank, 1), len(sorted))-1]
}

// Process is one program's resource use over a run (all its incarnations
// when it was restarted).
type Process struct {
	Name         string  `json:"name"`
	PeakRSSBytes int64   `json:"peakRSSBytes"`
	CPUSeconds   float64 `json:"cpuSeconds"`
	// FileRSSBytes is the file-backed resident memory (program code) at
	// the end of the run.
	FileRSSBytes int64 `json:"fileRSSBytes"`
}

// Run is one system's measurements.
type Run struct {
	System    string    `json:"system"`
	Phases    []Phase   `json:"phases"`
	Processes []Process `json:"processes"`
}

// Phase returns the run's phase called name.
func (r Run) Phase(name string) (Phase, bool) {
	for _, p := range r.Phases {
		if p.Name == name {
			return p, true
		}
	}
	return Phase{}, false
}

// PeakRSS is the sum of the processes' peak RSS: what the system needs at
// most at once (an upper bound: the peaks need not coincide).
func (r Run) PeakRSS() int64 {
	var n int64
	for _, p := range r.Processes {
		n += p.PeakRSSBytes
	}
	return n
}

// CPU is the processes' CPU time.
func (r Run) CPU() float64 {
	var s float64
	for _, p := range r.Processes {
		s += p.CPUSeconds
	}
	return s
}

// Report is one `make bench`.
type Report struct {
	Date       time.Time `json:"date"`
	Machine    string    `json:"machine"`
	Workspaces int       `json:"workspaces"`
	PerWS      int       `json:"objectsPerWorkspace"`
	Runs       []Run     `json:"runs"`
}

// Run returns the run of system.
func (r Report) Run(system string) (Run, bool) {
	for _, run := range r.Runs {
		if run.System == system {
			return run, true
		}
	}
	return Run{}, false
}

// WriteJSON writes the report to path.
func (r Report) WriteJSON(path string) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// Table prints the comparison: one row per phase and figure, with the
// ratio ferry / direct (the headline).
func (r Report) Table(w io.Writer) error {
	direct, _ := r.Run(Direct)
	ferry, _ := r.Run(Ferry)
	fmt.Fprintf(w, "%d workspaces x %d objects, %s, %s\n", r.Workspaces, r.PerWS, r.Machine, r.Date.Format(time.DateOnly))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "phase\tfigure\tdirect\tferry\tferry/direct\t")
	row := func(phase, figure string, d, f float64, unit string, haveDirect bool) {
		ds, ratio := "-", "-"
		if haveDirect {
			ds = format(d, unit)
			if d > 0 {
				ratio = fmt.Sprintf("%.2fx", f/d)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t\n", phase, figure, ds, format(f, unit), ratio)
	}
	for _, fp := range ferry.Phases {
		dp, ok := direct.Phase(fp.Name)
		row(fp.Name, "wall", dp.WallSeconds, fp.WallSeconds, "s", ok)
		if len(fp.Latencies) > 0 {
			row("", "objects/s", dp.ObjectsPerSecond(), fp.ObjectsPerSecond(), "", ok)
			row("", "p50", dp.P50, fp.P50, "s", ok)
			row("", "p90", dp.P90, fp.P90, "s", ok)
			row("", "p99", dp.P99, fp.P99, "s", ok)
			row("", "kcp req/obj", dp.KCPRequests, fp.KCPRequests, "r", ok)
			row("", "local req/obj", dp.LocalRequests, fp.LocalRequests, "r", ok)
			row("", "wire bytes/obj", 0, fp.WireBytes, "", false)
		} else {
			row("", "writes", float64(dp.Writes), float64(fp.Writes), "", ok)
		}
	}
	row("all", "peak RSS", float64(direct.PeakRSS())/(1<<20), float64(ferry.PeakRSS())/(1<<20), "MiB", true)
	row("", "CPU", direct.CPU(), ferry.CPU(), "s", true)
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, run := range []Run{direct, ferry} {
		var parts []string
		for _, p := range run.Processes {
			parts = append(parts, fmt.Sprintf("%s peak RSS %.0f MiB (program code %.0f MiB), %.1f s CPU",
				p.Name, float64(p.PeakRSSBytes)/(1<<20), float64(p.FileRSSBytes)/(1<<20), p.CPUSeconds))
		}
		if _, err := fmt.Fprintf(w, "%s: %s\n", run.System, strings.Join(parts, "; ")); err != nil {
			return err
		}
	}
	return nil
}

func format(v float64, unit string) string {
	switch unit {
	case "s":
		return fmt.Sprintf("%.2fs", v)
	case "":
		return fmt.Sprintf("%.0f", v)
	case "r":
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.0f %s", v, unit)
	}
}

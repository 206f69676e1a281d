// Package benchreport holds what `make bench` measures and how it shows it:
// per system (the floor, the direct-copy baseline and ferry) and phase,
// wall time, per-object latencies, requests and kcp CPU, and per process
// peak memory and CPU time; printed as a table of ratios ferry / direct and
// ferry / floor, written as JSON and drawn as an SVG of latency
// distributions.
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
	// Floor is the direct copy without a finalizer: the physical floor of
	// a copy (watch kcp, apply locally, copy status back).
	Floor = "floor"
	// Direct is the direct copy with a finalizer on every kcp object, the
	// same safety ferry pays for.
	Direct = "direct"
	Ferry  = "ferry"
)

// systems is the order of the table's columns and the picture's legend.
var systems = []string{Floor, Direct, Ferry}

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
	// KCPRequestsByVerb and LocalRequestsByVerb split them by verb
	// (apiserver_request_total's: GET, LIST, POST, PATCH, APPLY, ...).
	KCPRequestsByVerb   map[string]float64 `json:"kcpRequestsPerObjectByVerb,omitempty"`
	LocalRequestsByVerb map[string]float64 `json:"localRequestsPerObjectByVerb,omitempty"`
	// KCPCPUSeconds is the CPU time (user and system) kcp's process spent
	// over the phase, its own background work included.
	KCPCPUSeconds float64 `json:"kcpCPUSeconds,omitempty"`
	// WireBytes is the bytes per object between edge and broker, both
	// ways, TLS included (ferry only: the direct copy has no such hop).
	WireBytes float64 `json:"wireBytesPerObject,omitempty"`
	// LocalLatencies are, for a phase that waits on both sides (delete),
	// per object until the local copy was seen changed (gone), sorted.
	LocalLatencies []float64 `json:"-"`
	LocalP50       float64   `json:"localP50Seconds,omitempty"`
	LocalP99       float64   `json:"localP99Seconds,omitempty"`
}

// KCPCPUPerObject is kcp's CPU seconds per object over the phase.
func (p Phase) KCPCPUPerObject() float64 {
	if p.Objects == 0 {
		return 0
	}
	return p.KCPCPUSeconds / float64(p.Objects)
}

// SetLocalLatencies records the latencies until the local side saw each
// object's change, with their percentiles.
func (p *Phase) SetLocalLatencies(latencies []time.Duration) {
	p.LocalLatencies = nil
	for _, d := range latencies {
		p.LocalLatencies = append(p.LocalLatencies, d.Seconds())
	}
	slices.Sort(p.LocalLatencies)
	p.LocalP50, p.LocalP99 = Percentile(p.LocalLatencies, 50), Percentile(p.LocalLatencies, 99)
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

// WriteJSON writes the report to path, with ferry against the floor when
// both ran.
func (r Report) WriteJSON(path string) error {
	out := struct {
		Report
		AgainstFloor *FloorComparison `json:"againstFloor,omitempty"`
	}{Report: r}
	if c, ok := r.AgainstFloor(); ok {
		out.AgainstFloor = &c
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// Targets ferry is held to against the floor.
const (
	// TargetRatio bounds ferry's create and delete wall time and kcp CPU
	// per object as multiples of the floor's: one finalizer write each way
	// is the price of safety, everything beyond it is not.
	TargetRatio = 2.0
	// TargetCreateP99 and TargetDeleteLocalP50 bound, in seconds, the
	// create p99 and the p50 until local copies are gone on delete.
	TargetCreateP99      = 2.0
	TargetDeleteLocalP50 = 1.0
)

// FloorComparison is ferry against the floor, the figures its targets are
// stated in. Ratios are ferry / floor (0 when the floor's figure is 0).
type FloorComparison struct {
	CreateWallRatio float64 `json:"createWallRatio"`
	CreateP99       float64 `json:"createP99Seconds"`
	FloorCreateP99  float64 `json:"floorCreateP99Seconds"`
	DeleteWallRatio float64 `json:"deleteWallRatio"`
	// DeleteLocalP50 is the p50 from the delete in kcp until the local copy
	// was seen gone.
	DeleteLocalP50      float64 `json:"deleteLocalGoneP50Seconds"`
	FloorDeleteLocalP50 float64 `json:"floorDeleteLocalGoneP50Seconds"`
	// KCPCPUPerObjectRatio is over every phase both ran (create, update,
	// status, delete); Create and Delete are those phases alone.
	KCPCPUPerObjectRatio       float64 `json:"kcpCPUPerObjectRatio"`
	CreateKCPCPUPerObjectRatio float64 `json:"createKCPCPUPerObjectRatio"`
	DeleteKCPCPUPerObjectRatio float64 `json:"deleteKCPCPUPerObjectRatio"`
}

// AgainstFloor compares ferry with the floor; false unless both ran.
func (r Report) AgainstFloor() (FloorComparison, bool) {
	floor, ok1 := r.Run(Floor)
	ferry, ok2 := r.Run(Ferry)
	if !ok1 || !ok2 {
		return FloorComparison{}, false
	}
	fc, _ := ferry.Phase("create")
	lc, _ := floor.Phase("create")
	fd, _ := ferry.Phase("delete")
	ld, _ := floor.Phase("delete")
	var fCPU, lCPU float64
	var fObjects, lObjects int
	for _, lp := range floor.Phases {
		if fp, ok := ferry.Phase(lp.Name); ok {
			fCPU, fObjects = fCPU+fp.KCPCPUSeconds, fObjects+fp.Objects
			lCPU, lObjects = lCPU+lp.KCPCPUSeconds, lObjects+lp.Objects
		}
	}
	perObject := func(cpu float64, n int) float64 {
		if n == 0 {
			return 0
		}
		return cpu / float64(n)
	}
	return FloorComparison{
		CreateWallRatio: ratio(fc.WallSeconds, lc.WallSeconds),
		CreateP99:       fc.P99, FloorCreateP99: lc.P99,
		DeleteWallRatio: ratio(fd.WallSeconds, ld.WallSeconds),
		DeleteLocalP50:  fd.LocalP50, FloorDeleteLocalP50: ld.LocalP50,
		KCPCPUPerObjectRatio:       ratio(perObject(fCPU, fObjects), perObject(lCPU, lObjects)),
		CreateKCPCPUPerObjectRatio: ratio(fc.KCPCPUPerObject(), lc.KCPCPUPerObject()),
		DeleteKCPCPUPerObjectRatio: ratio(fd.KCPCPUPerObject(), ld.KCPCPUPerObject()),
	}, true
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// Table prints the comparison: one row per phase and figure, a column per
// system, and the ratios ferry / direct and ferry / floor (the headlines);
// then each program's usage and ferry against the floor's targets.
func (r Report) Table(w io.Writer) error {
	var runs []Run
	for _, sys := range systems {
		if run, ok := r.Run(sys); ok {
			runs = append(runs, run)
		}
	}
	ferry, _ := r.Run(Ferry)
	var against []string // systems ferry is divided by
	for _, sys := range []string{Direct, Floor} {
		if _, ok := r.Run(sys); ok {
			against = append(against, sys)
		}
	}
	fmt.Fprintf(w, "%d workspaces x %d objects, %s, %s\n", r.Workspaces, r.PerWS, r.Machine, r.Date.Format(time.DateOnly))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	header := "phase\tfigure\t"
	for _, run := range runs {
		header += run.System + "\t"
	}
	for _, sys := range against {
		header += "ferry/" + sys + "\t"
	}
	fmt.Fprintln(tw, header)
	// row prints one figure of every run; get is false where a run has none.
	row := func(phase, figure, unit string, get func(Run) (float64, bool)) {
		line := phase + "\t" + figure + "\t"
		for _, run := range runs {
			if v, ok := get(run); ok {
				line += format(v, unit) + "\t"
			} else {
				line += "-\t"
			}
		}
		f, fok := get(ferry)
		for _, sys := range against {
			run, _ := r.Run(sys)
			if v, ok := get(run); ok && fok && v > 0 {
				line += fmt.Sprintf("%.2fx\t", f/v)
			} else {
				line += "-\t"
			}
		}
		fmt.Fprintln(tw, line)
	}
	for _, fp := range ferry.Phases {
		fig := func(v func(Phase) float64) func(Run) (float64, bool) {
			return func(run Run) (float64, bool) {
				p, ok := run.Phase(fp.Name)
				return v(p), ok
			}
		}
		row(fp.Name, "wall", "s", fig(func(p Phase) float64 { return p.WallSeconds }))
		if len(fp.Latencies) == 0 {
			row("", "writes", "", fig(func(p Phase) float64 { return float64(p.Writes) }))
			continue
		}
		row("", "objects/s", "", fig(Phase.ObjectsPerSecond))
		row("", "p50", "s", fig(func(p Phase) float64 { return p.P50 }))
		row("", "p90", "s", fig(func(p Phase) float64 { return p.P90 }))
		row("", "p99", "s", fig(func(p Phase) float64 { return p.P99 }))
		if len(fp.LocalLatencies) > 0 {
			row("", "local gone p50", "s", fig(func(p Phase) float64 { return p.LocalP50 }))
			row("", "local gone p99", "s", fig(func(p Phase) float64 { return p.LocalP99 }))
		}
		row("", "kcp CPU/obj", "ms", fig(func(p Phase) float64 { return p.KCPCPUPerObject() * 1000 }))
		row("", "kcp req/obj", "r", fig(func(p Phase) float64 { return p.KCPRequests }))
		for _, verb := range verbs(runs, fp.Name) {
			row("", "kcp "+verb+"/obj", "r", fig(func(p Phase) float64 { return p.KCPRequestsByVerb[verb] }))
		}
		row("", "local req/obj", "r", fig(func(p Phase) float64 { return p.LocalRequests }))
		row("", "wire bytes/obj", "", func(run Run) (float64, bool) {
			p, ok := run.Phase(fp.Name)
			return p.WireBytes, ok && run.System == Ferry
		})
	}
	row("all", "peak RSS", "MiB", func(run Run) (float64, bool) { return float64(run.PeakRSS()) / (1 << 20), true })
	row("", "CPU", "s", func(run Run) (float64, bool) { return run.CPU(), true })
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, run := range runs {
		var parts []string
		for _, p := range run.Processes {
			parts = append(parts, fmt.Sprintf("%s peak RSS %.0f MiB (program code %.0f MiB), %.1f s CPU",
				p.Name, float64(p.PeakRSSBytes)/(1<<20), float64(p.FileRSSBytes)/(1<<20), p.CPUSeconds))
		}
		if _, err := fmt.Fprintf(w, "%s: %s\n", run.System, strings.Join(parts, "; ")); err != nil {
			return err
		}
	}
	if c, ok := r.AgainstFloor(); ok {
		_, err := fmt.Fprintf(w, `ferry against the floor (target):
  create wall             %.2fx (<= %.0fx)
  create p99              %.2fs, floor %.2fs (<= %.0fs)
  delete wall             %.2fx (<= %.0fx)
  delete local gone p50   %.2fs, floor %.2fs (<= %.0fs)
  kcp CPU per object      %.2fx over create, update, status and delete; create %.2fx, delete %.2fx (<= %.0fx)
`, c.CreateWallRatio, TargetRatio, c.CreateP99, c.FloorCreateP99, TargetCreateP99, c.DeleteWallRatio, TargetRatio,
			c.DeleteLocalP50, c.FloorDeleteLocalP50, TargetDeleteLocalP50,
			c.KCPCPUPerObjectRatio, c.CreateKCPCPUPerObjectRatio, c.DeleteKCPCPUPerObjectRatio, TargetRatio)
		return err
	}
	return nil
}

// verbs are the verbs any run sent kcp in phase, sorted.
func verbs(runs []Run, phase string) []string {
	var out []string
	for _, run := range runs {
		if p, ok := run.Phase(phase); ok {
			for v, n := range p.KCPRequestsByVerb {
				if n > 0 && !slices.Contains(out, v) {
					out = append(out, v)
				}
			}
		}
	}
	slices.Sort(out)
	return out
}

func format(v float64, unit string) string {
	switch unit {
	case "s":
		return fmt.Sprintf("%.2fs", v)
	case "":
		return fmt.Sprintf("%.0f", v)
	case "r":
		return fmt.Sprintf("%.2f", v)
	case "ms":
		return fmt.Sprintf("%.1fms", v)
	default:
		return fmt.Sprintf("%.0f %s", v, unit)
	}
}

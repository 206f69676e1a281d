package benchreport

import (
	"fmt"
	"io"
	"slices"
	"strings"
)

// Colors of the systems in the picture.
var colors = map[string]string{Floor: "#228833", Direct: "#4477aa", Ferry: "#ee6677"}

const (
	panelW, panelH = 300, 200
	marginL        = 45
	marginT        = 40
	marginB        = 75 // axis labels and a line of figures per system
	gap            = 20
)

// SVG draws, per phase with latencies, the cumulative distribution of the
// per-object latencies of every system: a curve further left is faster, and
// where the curves part shows which objects pay for the difference. Where a
// phase waits on both sides (delete), a dashed curve shows the time until
// the local copy was gone. Below the legend, ferry against the floor.
func (r Report) SVG(w io.Writer) error {
	var phases []string
	for _, run := range r.Runs {
		for _, p := range run.Phases {
			if len(p.Latencies) > 0 && !slices.Contains(phases, p.Name) {
				phases = append(phases, p.Name)
			}
		}
	}
	width := marginL + len(phases)*(panelW+gap+marginL)
	height := marginT + panelH + marginB + 45
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="11">`+"\n", width, height)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%d" y="16" font-size="13">Latency per object, cumulative (%d workspaces x %d objects, %s)</text>`+"\n",
		marginL, r.Workspaces, r.PerWS, escape(r.Machine))
	for i, name := range phases {
		x0 := marginL + i*(panelW+gap+marginL)
		r.panel(&b, name, x0, marginT)
	}
	// Legend.
	ly := marginT + panelH + marginB + 15
	for i, sys := range systems {
		x := marginL + i*120
		fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>`, x, ly-4, x+20, ly-4, colors[sys])
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", x+25, ly, sys)
	}
	x := marginL + len(systems)*120
	fmt.Fprintf(&b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#999" stroke-width="2" stroke-dasharray="4 3"/>`, x, ly-4, x+20, ly-4)
	fmt.Fprintf(&b, `<text x="%d" y="%d">local copy gone</text>`+"\n", x+25, ly)
	if c, ok := r.AgainstFloor(); ok {
		fmt.Fprintf(&b, `<text x="%d" y="%d">%s</text>`+"\n", marginL, ly+18, escape(fmt.Sprintf(
			"ferry / floor: create wall %.2fx, create p99 %.2fs (floor %.2fs); delete wall %.2fx, local gone p50 %.2fs (floor %.2fs); kcp CPU per object %.2fx",
			c.CreateWallRatio, c.CreateP99, c.FloorCreateP99, c.DeleteWallRatio, c.DeleteLocalP50, c.FloorDeleteLocalP50, c.KCPCPUPerObjectRatio)))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

func (r Report) panel(b *strings.Builder, name string, x0, y0 int) {
	maxX := 0.0
	for _, run := range r.Runs {
		if p, ok := run.Phase(name); ok && len(p.Latencies) > 0 {
			maxX = max(maxX, p.Latencies[len(p.Latencies)-1])
		}
	}
	maxX = niceCeil(maxX)
	fmt.Fprintf(b, `<text x="%d" y="%d" font-weight="bold">%s</text>`+"\n", x0, y0-6, escape(name))
	fmt.Fprintf(b, `<rect x="%d" y="%d" width="%d" height="%d" fill="none" stroke="#999"/>`+"\n", x0, y0, panelW, panelH)
	for i := 0; i <= 4; i++ { // grid and axis labels
		gx := x0 + i*panelW/4
		gy := y0 + panelH - i*panelH/4
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#eee"/>`, gx, y0, gx, y0+panelH)
		fmt.Fprintf(b, `<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="#eee"/>`, x0, gy, x0+panelW, gy)
		fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="middle">%.3gs</text>`, gx, y0+panelH+14, maxX*float64(i)/4)
		fmt.Fprintf(b, `<text x="%d" y="%d" text-anchor="end">%d%%</text>`+"\n", x0-4, gy+4, i*25)
	}
	for _, run := range r.Runs {
		p, ok := run.Phase(name)
		if !ok || len(p.Latencies) == 0 {
			continue
		}
		curve(b, x0, y0, p.Latencies, maxX, colors[run.System], "")
		curve(b, x0, y0, p.LocalLatencies, maxX, colors[run.System], ` stroke-dasharray="4 3"`)
	}
	// The p50 and p99 of each system under the panel, a line each.
	ty := y0 + panelH + 28
	for _, run := range r.Runs {
		if p, ok := run.Phase(name); ok && len(p.Latencies) > 0 {
			line := fmt.Sprintf("%s p50 %.2fs p99 %.2fs", run.System, p.P50, p.P99)
			if len(p.LocalLatencies) > 0 {
				line += fmt.Sprintf(" (local gone p50 %.2fs)", p.LocalP50)
			}
			fmt.Fprintf(b, `<text x="%d" y="%d">%s</text>`+"\n", x0, ty, escape(line))
			ty += 13
		}
	}
}

// curve draws the cumulative distribution of sorted latencies (nothing for
// none).
func curve(b *strings.Builder, x0, y0 int, latencies []float64, maxX float64, color, attrs string) {
	n := len(latencies)
	if n == 0 {
		return
	}
	var pts []string
	step := max(1, n/200) // at most ~200 points per curve
	for i := 0; i < n; i += step {
		pts = append(pts, point(x0, y0, latencies[i], float64(i+1)/float64(n), maxX))
	}
	pts = append(pts, point(x0, y0, latencies[n-1], 1, maxX))
	fmt.Fprintf(b, `<polyline fill="none" stroke="%s" stroke-width="2"%s points="%s"/>`+"\n", color, attrs, strings.Join(pts, " "))
}

func point(x0, y0 int, x, y, maxX float64) string {
	px := float64(x0)
	if maxX > 0 {
		px += x / maxX * panelW
	}
	py := float64(y0) + panelH - y*panelH
	return fmt.Sprintf("%.1f,%.1f", px, py)
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := 1e-3
	for p*10 <= v {
		p *= 10
	}
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= v {
			return m * p
		}
	}
	return 10 * p
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}

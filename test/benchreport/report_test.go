package benchreport

import (
	"bytes"
	"encoding/xml"
	"os"
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
	return Report{Date: time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC), Machine: "2 cores <test>", Workspaces: 1, PerWS: 4,
		Runs: []Run{
			{System: Direct, Phases: []Phase{NewPhase("create", 4, 2*time.Second, ms(400, 100, 200, 300))},
				Processes: []Process{{Name: "directcopy", PeakRSSBytes: 50 << 20, CPUSeconds: 2}}},
			{System: Ferry, Phases: []Phase{NewPhase("create", 4, 3*time.Second, ms(500, 600, 700, 800)),
				{Name: "edge-restart", WallSeconds: 0.5}},
				Processes: []Process{{Name: "ferry-broker", PeakRSSBytes: 40 << 20, CPUSeconds: 1}, {Name: "ferry-edge", PeakRSSBytes: 35 << 20, CPUSeconds: 2}}},
		}}
}

func TestTableShowsRatios(t *testing.T) {
	var b bytes.Buffer
	if err := sample().Table(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"1.50x", "p50", "edge-restart", "75 MiB", "1.50x", "ferry-broker peak RSS 40 MiB"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
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
	if polylines != 2 {
		t.Errorf("%d curves, want 2 (create: direct and ferry)", polylines)
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
	if u.PeakRSSBytes < 1<<20 || u.CPUSeconds < 0 {
		t.Errorf("usage of the test process: %+v", u)
	}
	sum := u.Add(Usage{PeakRSSBytes: 1, CPUSeconds: 1})
	if sum.PeakRSSBytes != u.PeakRSSBytes || sum.CPUSeconds != u.CPUSeconds+1 {
		t.Errorf("Add: %+v", sum)
	}
}

package edgeload

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/test/benchreport"
)

// Sample is one reading of a Go process: resident memory from /proc, and,
// through its pprof endpoint, the heap in use right after a GC and its
// goroutines.
type Sample struct {
	At         string  `json:"at"`
	Connected  int     `json:"connected"`
	RSSBytes   int64   `json:"rssBytes"`
	HeapBytes  int64   `json:"heapBytes"`
	Goroutines int     `json:"goroutines"`
	CPUSeconds float64 `json:"cpuSeconds"`
}

// TakeSample reads process pid, whose pprof endpoint is pprofAddr, labelled
// at. The heap read forces a GC first, so RSS is read after it: samples
// hold alike little garbage.
func TakeSample(ctx context.Context, at string, pid int, pprofAddr string) (Sample, error) {
	s := Sample{At: at}
	var err error
	if s.HeapBytes, err = heapInuse(ctx, pprofAddr); err != nil {
		return s, err
	}
	if s.Goroutines, err = goroutines(ctx, pprofAddr); err != nil {
		return s, err
	}
	u, err := benchreport.ReadUsage(pid)
	if err != nil {
		return s, fmt.Errorf("usage of process %d: %w", pid, err)
	}
	s.RSSBytes, s.CPUSeconds = u.RSSBytes, u.CPUSeconds
	return s, nil
}

// CPUWindow is CPU use over a window of wall time.
type CPUWindow struct {
	Seconds float64 `json:"seconds"`
	// Cores are CPU seconds per wall second, of each process measured.
	Cores map[string]float64 `json:"cores"`
	// KCPRequestsPerSecond are the broker's requests to kcp (its edge
	// Leases' renewals, mostly).
	KCPRequestsPerSecond float64 `json:"kcpRequestsPerSecond"`
}

// MeasureCPU reads the CPU time of every process in pids (name → pid)
// before and after window and returns the cores each used.
func MeasureCPU(ctx context.Context, pids map[string]int, window time.Duration) (CPUWindow, error) {
	before := map[string]float64{}
	for name, pid := range pids {
		u, err := benchreport.ReadUsage(pid)
		if err != nil {
			return CPUWindow{}, fmt.Errorf("usage of %s: %w", name, err)
		}
		before[name] = u.CPUSeconds
	}
	start := time.Now()
	select {
	case <-ctx.Done():
		return CPUWindow{}, ctx.Err()
	case <-time.After(window):
	}
	w := CPUWindow{Seconds: time.Since(start).Seconds(), Cores: map[string]float64{}}
	for name, pid := range pids {
		u, err := benchreport.ReadUsage(pid)
		if err != nil {
			return CPUWindow{}, fmt.Errorf("usage of %s: %w", name, err)
		}
		w.Cores[name] = (u.CPUSeconds - before[name]) / w.Seconds
	}
	return w, nil
}

// heapInuse is the "# HeapInuse = N" line of the debug heap profile, read
// with gc=1.
func heapInuse(ctx context.Context, addr string) (int64, error) {
	var n int64
	err := pprofLines(ctx, addr, "heap?gc=1&debug=1", func(line string) (bool, error) {
		v, ok := strings.CutPrefix(line, "# HeapInuse = ")
		if !ok {
			return false, nil
		}
		var err error
		n, err = strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		return true, err
	})
	return n, err
}

// goroutines is the total of the debug goroutine profile's first line
// ("goroutine profile: total N").
func goroutines(ctx context.Context, addr string) (int, error) {
	var n int
	err := pprofLines(ctx, addr, "goroutine?debug=1", func(line string) (bool, error) {
		v, ok := strings.CutPrefix(line, "goroutine profile: total ")
		if !ok {
			return false, nil
		}
		var err error
		n, err = strconv.Atoi(strings.TrimSpace(v))
		return true, err
	})
	return n, err
}

// pprofLines feeds the lines of /debug/pprof/<profile> to found until it
// says it found what it looked for.
func pprofLines(ctx context.Context, addr, profile string, found func(string) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/debug/pprof/"+profile, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("pprof %s: %w", profile, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("pprof %s: %s", profile, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		ok, err := found(sc.Text())
		if err != nil {
			return fmt.Errorf("pprof %s: %q: %w", profile, sc.Text(), err)
		}
		if ok {
			return nil
		}
	}
	return fmt.Errorf("pprof %s: expected line not found (%v)", profile, sc.Err())
}

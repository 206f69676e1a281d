package e2e

import (
	"bufio"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/test/benchreport"
)

// The workspace-heavy bench (`make bench-workspaces`): many consumer
// workspaces with few objects each, through ferry alone. What it answers is
// ferry's own cost per workspace (broker memory) and how long it takes until
// every workspace is synced; the floor and the direct copy answer how much
// ferry costs over a plain copy, which BenchmarkSync already does, so they
// do not run here.

// wsBenchSizeFromEnv reads FERRY_BENCH_WS_WORKSPACES, FERRY_BENCH_WS_OBJECTS
// and FERRY_BENCH_WS_SHARDS (make bench-workspaces sets them), defaulting
// to 300 × 3 on one kcp.
func wsBenchSizeFromEnv(tb testing.TB) (size benchSize, shards int) {
	tb.Helper()
	s := benchSize{workspaces: 300, objects: 3}
	shards = 1
	for name, v := range map[string]*int{"FERRY_BENCH_WS_WORKSPACES": &s.workspaces, "FERRY_BENCH_WS_OBJECTS": &s.objects, "FERRY_BENCH_WS_SHARDS": &shards} {
		if raw := os.Getenv(name); raw != "" {
			n, err := strconv.Atoi(raw)
			if err != nil || n < 1 {
				tb.Fatalf("%s=%q: want a positive number", name, raw)
			}
			*v = n
		}
	}
	if shards != 1 && shards != shardedShards {
		tb.Fatalf("FERRY_BENCH_WS_SHARDS=%d: the bench runs on one kcp (1) or on the sharded kcp (%d)", shards, shardedShards)
	}
	return s, shards
}

// runWorkspacesBench starts a broker and an edge, samples their memory
// idle, binds the export in size.workspaces workspaces, creates every
// object (all workspaces at once), sets every status, deletes every object,
// and writes the report (table and JSON) to out. With shards > 1 it runs on
// the shared sharded kcp, workspace i on shard i%shards, and reports each
// shard's figures too.
func runWorkspacesBench(tb testing.TB, size benchSize, shards int, out string) benchreport.WorkspacesReport {
	tb.Helper()
	report := benchreport.WorkspacesReport{Date: time.Now().UTC(), Machine: machine(), Workspaces: size.workspaces,
		PerWS: size.objects, Parallel: benchCreateParallel}
	// pprof on both programs, for their heap after a GC; a heap profile
	// is saved only when FERRY_BENCH_PROFILES names a directory.
	profileDir := os.Getenv("FERRY_BENCH_PROFILES")
	profiles := &benchProfiles{dir: profileDir, addrs: map[string]string{}}
	// newFerrySideOn binds the export in one workspace of its own (its
	// syncEnv's consumer; on the sharded kcp one per shard), which stays
	// empty: "idle" has it bound.
	plural := "wsparcels"
	if shards > 1 {
		plural = "wsshparcels" // PublishedResources are unique in the shared service cluster
	}
	ferry, fe := newFerrySideOn(tb, shards, plural, 0, profiles)
	report.Memory = append(report.Memory, ferry.memory(tb, profiles, "idle"))

	start := time.Now()
	ferry.workspaces = benchWorkspaces(tb, ferry.kcp, "bw", fe.export.Name, fe.remoteGVR, size.workspaces)
	report.SetupSeconds = time.Since(start).Seconds()
	tb.Logf("%d workspaces created and bound, %d at once, in %.1fs", size.workspaces, benchCreateParallel, report.SetupSeconds)
	report.Memory = append(report.Memory, ferry.memory(tb, profiles, "bound"))

	names := objectNames(size.objects)
	for _, spec := range []func() phaseSpec{ferry.createSpec, func() phaseSpec { return ferry.statusSpec(tb) }} {
		p := spec()
		p.byWorkspace = true
		phase, obs := ferry.runObserved(tb, names, p)
		report.Phases = append(report.Phases, phase)
		report.PerWorkspace = append(report.PerWorkspace, benchreport.NewWorkspaceLatencies(phase.Name, obs.perWorkspace()))
		report.Shards = ferry.addShardPhase(report.Shards, phase.Name, obs)
	}
	// Every object synced and its status back: what the broker holds for
	// W workspaces.
	report.Memory = append(report.Memory, ferry.memory(tb, profiles, "synced"))
	if profileDir != "" {
		if err := os.MkdirAll(profileDir, 0o755); err != nil {
			tb.Fatal(err)
		}
		profiles.fetch(tb, "heap-synced", "heap")
		profiles.wg.Wait()
	}
	del := ferry.deleteSpec()
	del.byWorkspace = true
	phase, obs := ferry.runObserved(tb, names, del)
	report.Phases = append(report.Phases, phase)
	report.PerWorkspace = append(report.PerWorkspace, benchreport.NewWorkspaceLatencies(phase.Name, obs.perWorkspace()))
	report.Shards = ferry.addShardPhase(report.Shards, phase.Name, obs)
	report.Processes = ferry.processUsage(tb)

	writeReport(tb, out, "bench-workspaces", &report)
	tb.Logf("workspace bench results in %s (bench-workspaces.txt, bench-workspaces.json)", out)
	return report
}

// addShardPhase adds phase's figures per shard to shards (one entry per
// shard, in the sharded kcp's order, made on the first phase): the time from
// the phase's first write until every workspace of the shard was done, and
// the shard's per-workspace times. On the suite's kcp it adds nothing.
func (s *benchSide) addShardPhase(shards []benchreport.ShardFigures, phase string, obs *observer) []benchreport.ShardFigures {
	if s.kcp.sharded == nil {
		return shards
	}
	if shards == nil {
		for _, sh := range s.kcp.sharded.Shards {
			shards = append(shards, benchreport.ShardFigures{Name: sh.Name})
		}
	}
	spans := obs.workspaceSpans()
	var start time.Time
	for _, sp := range spans {
		if start.IsZero() || sp.first.Before(start) {
			start = sp.first
		}
	}
	for i := range shards {
		sh := &shards[i]
		var latencies []time.Duration
		var last time.Time
		n := 0
		for _, ws := range s.workspaces {
			if ws.shard != sh.Name {
				continue
			}
			n++
			sp, ok := spans[ws.cluster]
			if !ok {
				continue
			}
			latencies = append(latencies, max(sp.last.Sub(sp.first), 0))
			if sp.last.After(last) {
				last = sp.last
			}
		}
		sh.Workspaces = n
		p := benchreport.ShardPhase{WorkspaceLatencies: benchreport.NewWorkspaceLatencies(phase, latencies)}
		if !last.IsZero() {
			p.WallSeconds = last.Sub(start).Seconds()
		}
		sh.Phases = append(sh.Phases, p)
	}
	return shards
}

// memory samples broker's and edge's resident memory and Go heap in use
// (after a GC the heap request forces) as at.
func (s *benchSide) memory(tb testing.TB, profiles *benchProfiles, at string) benchreport.MemorySample {
	tb.Helper()
	m := benchreport.MemorySample{At: at, BrokerHeap: heapInuse(tb, profiles.addrs["broker"]), EdgeHeap: heapInuse(tb, profiles.addrs["edge"])}
	// RSS right after that GC, so that the samples hold alike little
	// garbage (what the GC freed may still be resident: RSS is the upper
	// figure, the heap the lower one).
	procs := s.processes() // broker, edge
	for i, rss := range []*int64{&m.BrokerRSS, &m.EdgeRSS} {
		u, err := benchreport.ReadUsage(procs[i].Pid())
		if err != nil {
			tb.Fatalf("usage of %s: %v", procs[i].Name, err)
		}
		*rss = u.RSSBytes
	}
	tb.Logf("memory %s: broker RSS %.1f MiB, heap %.1f MiB; edge RSS %.1f MiB, heap %.1f MiB", at,
		float64(m.BrokerRSS)/(1<<20), float64(m.BrokerHeap)/(1<<20), float64(m.EdgeRSS)/(1<<20), float64(m.EdgeHeap)/(1<<20))
	return m
}

// heapInuse is the Go heap in use of the program serving pprof at addr,
// right after a GC: the "# HeapInuse = N" line of the debug heap profile.
func heapInuse(tb testing.TB, addr string) int64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/debug/pprof/heap?gc=1&debug=1", nil)
	if err != nil {
		tb.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("heap of %s: %v", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("heap of %s: %s", addr, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "# HeapInuse = "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				tb.Fatalf("heap of %s: %q: %v", addr, sc.Text(), err)
			}
			return n
		}
	}
	tb.Fatalf("heap of %s: no HeapInuse line (%v)", addr, sc.Err())
	return 0
}

// BenchmarkWorkspaces is `make bench-workspaces`: W workspaces × N objects
// (FERRY_BENCH_WS_*) through ferry; results in FERRY_BENCH_OUT.
func BenchmarkWorkspaces(b *testing.B) {
	out := os.Getenv("FERRY_BENCH_OUT")
	if out == "" {
		out = testDir(b)
	}
	size, shards := wsBenchSizeFromEnv(b)
	for range b.N {
		runWorkspacesBench(b, size, shards, out)
	}
}

// TestBenchWorkspacesSmoke runs the workspace bench at 4 × 2: the harness
// works, every object of every workspace is synced, its status comes back
// and it is deleted, every figure is measured, and the report is written.
// Figures at this size mean nothing.
func TestBenchWorkspacesSmoke(t *testing.T) {
	out := filepath.Join(testDir(t), "bench-workspaces")
	size := benchSize{workspaces: 4, objects: 2}
	r := runWorkspacesBench(t, size, 1, out)
	checkWorkspacesReport(t, r, size, out)
	if len(r.Shards) != 0 {
		t.Errorf("figures of %d shards on one kcp", len(r.Shards))
	}
}

// TestShardedKCPBenchWorkspacesSmoke runs the workspace bench at 2 × 2 on
// the shared sharded kcp (started for the TestShardedKCP* tests): besides
// what the one-kcp smoke checks, one workspace on each shard, and each
// shard's figures measured.
func TestShardedKCPBenchWorkspacesSmoke(t *testing.T) {
	out := filepath.Join(testDir(t), "bench-workspaces")
	size := benchSize{workspaces: shardedShards, objects: 2}
	r := runWorkspacesBench(t, size, shardedShards, out)
	checkWorkspacesReport(t, r, size, out)
	if len(r.Shards) != shardedShards {
		t.Fatalf("figures of %d shards; want %d", len(r.Shards), shardedShards)
	}
	for _, sh := range r.Shards {
		if sh.Workspaces != 1 || len(sh.Phases) != 3 {
			t.Errorf("shard %s: %d workspaces, %d phases; want 1 and 3", sh.Name, sh.Workspaces, len(sh.Phases))
		}
		for _, p := range sh.Phases {
			if len(p.Seconds) != 1 || p.P50 <= 0 || p.WallSeconds < p.Max {
				t.Errorf("shard %s, %s: %d workspaces done, p50 %.2fs, all done after %.2fs, max %.2fs; want 1, positive, all done after ≥ max",
					sh.Name, p.Phase, len(p.Seconds), p.P50, p.WallSeconds, p.Max)
			}
		}
	}
}

// checkWorkspacesReport checks that the smoke run r measured every figure
// of size and wrote its report to out.
func checkWorkspacesReport(t *testing.T, r benchreport.WorkspacesReport, size benchSize, out string) {
	t.Helper()
	total := size.workspaces * size.objects
	for _, name := range []string{"create", "status", "delete"} {
		p, ok := r.Phase(name)
		if !ok || p.Objects != total || len(p.Latencies) != total || p.WallSeconds <= 0 || p.KCPRequests <= 0 {
			t.Errorf("%s: found %v, %d objects, %d latencies, %.2fs, %.2f kcp requests per object; want %d objects, all measured",
				name, ok, p.Objects, len(p.Latencies), p.WallSeconds, p.KCPRequests, total)
		}
	}
	if len(r.PerWorkspace) != 3 {
		t.Fatalf("per-workspace latencies of %d phases; want 3", len(r.PerWorkspace))
	}
	for _, l := range r.PerWorkspace {
		if len(l.Seconds) != size.workspaces || l.P50 <= 0 || l.P99 < l.P50 || l.Max < l.P99 {
			t.Errorf("%s per workspace: %d workspaces, p50 %.2fs, p99 %.2fs, max %.2fs; want %d, ordered and positive",
				l.Phase, len(l.Seconds), l.P50, l.P99, l.Max, size.workspaces)
		}
	}
	if len(r.Memory) != 3 {
		t.Errorf("memory samples: %+v; want idle, bound and synced", r.Memory)
	}
	for _, m := range r.Memory {
		if m.BrokerRSS <= 0 || m.EdgeRSS <= 0 || m.BrokerHeap <= 0 || m.EdgeHeap <= 0 {
			t.Errorf("memory %s: %+v; want all measured", m.At, m)
		}
	}
	if _, _, ok := r.PerWorkspaceBytes(); !ok {
		t.Error("no broker memory per workspace")
	}
	if r.SetupSeconds <= 0 || len(r.Processes) != 2 {
		t.Errorf("setup %.2fs, processes %+v", r.SetupSeconds, r.Processes)
	}
	for _, f := range []string{"bench-workspaces.txt", "bench-workspaces.json"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Error(err)
		}
	}
}

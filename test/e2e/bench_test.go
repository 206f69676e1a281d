package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/ferry-dev/ferry/test/benchreport"
	"github.com/ferry-dev/ferry/test/framework"
)

// The bench: the same workload through the floor (the direct copy without
// a finalizer), the direct-copy baseline (with one) and ferry, on the
// suite's kcp and service cluster, phase by phase. Each side has its own
// APIExport, CRD and consumer workspaces; all are measured the same way,
// from the harness's writes to the changes its watches see, and kcp's CPU
// time over each phase is read from its process.

// benchSize is W workspaces × N objects each.
type benchSize struct{ workspaces, objects int }

// benchSizeFromEnv reads FERRY_BENCH_WORKSPACES and FERRY_BENCH_OBJECTS
// (make bench sets them), defaulting to 10 × 100.
func benchSizeFromEnv(tb testing.TB) benchSize {
	tb.Helper()
	s := benchSize{workspaces: 10, objects: 100}
	for name, v := range map[string]*int{"FERRY_BENCH_WORKSPACES": &s.workspaces, "FERRY_BENCH_OBJECTS": &s.objects} {
		if raw := os.Getenv(name); raw != "" {
			n, err := strconv.Atoi(raw)
			if err != nil || n < 1 {
				tb.Fatalf("%s=%q: want a positive number", name, raw)
			}
			*v = n
		}
	}
	return s
}

// benchWorkspace is one consumer workspace of a side.
type benchWorkspace struct {
	cluster string
	// shard is the sharded kcp's shard that holds the workspace ("" on
	// the suite's kcp).
	shard  string
	remote dynamic.ResourceInterface // namespace default, in the workspace
}

// benchSide is one system under test as the harness sees it.
type benchSide struct {
	system     string
	remoteGVR  schema.GroupVersionResource
	remoteKind string
	// kcp is where the side's workspaces live.
	kcp        benchKCP
	workspaces []benchWorkspace
	local      dynamic.NamespaceableResourceInterface
	// localSelector selects the side's local copies; localKey names a copy
	// like the harness names objects (cluster/name).
	localSelector string
	localKey      func(u *unstructured.Unstructured) string
	// processes returns the side's running programs.
	processes func() []*framework.Process
	// profiles, when set, takes a CPU profile over the first phases.
	profiles *benchProfiles
	// kcpRequests and localRequests count the requests for the side's
	// resources in kcp and in the service cluster.
	kcpRequests, localRequests *apiRequests
	// wire counts the bytes between edge and broker (nil for the direct
	// copies, which have no such hop).
	wire *wireProxy
	// usage holds the usage of incarnations that were killed.
	usage map[string]benchreport.Usage
}

func benchKey(cluster, name string) string { return cluster + "/" + name }

// noRateLimit returns cfg without client-side rate limiting: the harness
// must not be what limits either side.
func noRateLimit(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.QPS, cfg.Burst = -1, 0
	return cfg
}

// objectNames are the names of n objects in each workspace.
func objectNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("obj-%05d", i)
	}
	return out
}

// forEach runs do for every (workspace, name) from 16 goroutines:
// workspaces interleaved, or with byWorkspace one workspace's objects after
// another's.
func (s *benchSide) forEach(names []string, byWorkspace bool, do func(ws benchWorkspace, name string)) {
	type job struct {
		ws   benchWorkspace
		name string
	}
	jobs := make(chan job)
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for j := range jobs {
				do(j.ws, j.name)
			}
		})
	}
	if byWorkspace {
		for _, ws := range s.workspaces {
			for _, name := range names {
				jobs <- job{ws, name}
			}
		}
	} else {
		// Interleave workspaces, as independent tenants would write.
		for _, name := range names {
			for _, ws := range s.workspaces {
				jobs <- job{ws, name}
			}
		}
	}
	close(jobs)
	wg.Wait()
}

// observer records, per object key, when each of its watches saw the
// phase's condition; an object is done once all did.
type observer struct {
	mu      sync.Mutex
	started map[string]time.Time
	seen    map[string]int // bitmask of watches
	first   []map[string]time.Time
	done    map[string]time.Time
	all     int
}

func newObserver(watches int) *observer {
	o := &observer{started: map[string]time.Time{}, seen: map[string]int{}, done: map[string]time.Time{}, all: 1<<watches - 1}
	for range watches {
		o.first = append(o.first, map[string]time.Time{})
	}
	return o
}

func (o *observer) start(key string, at time.Time) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.started[key] = at
}

func (o *observer) saw(watch int, key string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.done[key]; ok {
		return
	}
	if o.seen[key]&(1<<watch) == 0 {
		o.first[watch][key] = time.Now()
	}
	o.seen[key] |= 1 << watch
	if o.seen[key] == o.all {
		o.done[key] = time.Now()
	}
}

func (o *observer) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.done)
}

// latencies are done - started of every object done.
func (o *observer) latencies() []time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	return since(o.started, o.done)
}

// latenciesOf are, for every object done, the time until watch saw it.
func (o *observer) latenciesOf(watch int) []time.Duration {
	o.mu.Lock()
	defer o.mu.Unlock()
	at := map[string]time.Time{}
	for k := range o.done {
		at[k] = o.first[watch][k]
	}
	return since(o.started, at)
}

// perWorkspace are, per workspace with every object done, the time from
// its first object's write until its last object was done.
func (o *observer) perWorkspace() []time.Duration {
	var out []time.Duration
	for _, sp := range o.workspaceSpans() {
		out = append(out, max(sp.last.Sub(sp.first), 0))
	}
	return out
}

// workspaceSpan is when a workspace's first object was written and when its
// last object was done.
type workspaceSpan struct{ first, last time.Time }

// workspaceSpans are, by cluster, the spans of the workspaces with every
// object done.
func (o *observer) workspaceSpans() map[string]workspaceSpan {
	o.mu.Lock()
	defer o.mu.Unlock()
	first, last, left := map[string]time.Time{}, map[string]time.Time{}, map[string]int{}
	for k, t0 := range o.started {
		cluster, _, _ := strings.Cut(k, "/") // benchKey: object names hold no "/"
		if f, ok := first[cluster]; !ok || t0.Before(f) {
			first[cluster] = t0
		}
		done, ok := o.done[k]
		if !ok {
			left[cluster]++
			continue
		}
		if done.After(last[cluster]) {
			last[cluster] = done
		}
	}
	out := map[string]workspaceSpan{}
	for cluster, t0 := range first {
		if left[cluster] == 0 {
			out[cluster] = workspaceSpan{first: t0, last: last[cluster]}
		}
	}
	return out
}

func since(started, at map[string]time.Time) []time.Duration {
	var out []time.Duration
	for k, t1 := range at {
		if t0, ok := started[k]; ok {
			out = append(out, max(t1.Sub(t0), 0))
		}
	}
	return out
}

// kcpCPUSeconds is the CPU time kcp's process has used so far.
func kcpCPUSeconds(tb testing.TB) float64 {
	tb.Helper()
	u, err := benchreport.ReadUsage(env.kcp.Pid())
	if err != nil {
		tb.Fatalf("usage of kcp: %v", err)
	}
	return u.CPUSeconds
}

// watchFrom lists ri (so that only changes from now on count), then
// watches it until ctx ends, calling on with every event; a watch the
// server closes is resumed from the last version seen, and an error event
// fails the bench.
func watchFrom(ctx context.Context, tb testing.TB, ri dynamic.ResourceInterface, selector string, on func(watch.EventType, *unstructured.Unstructured)) {
	tb.Helper()
	list, err := ri.List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		tb.Fatal(err)
	}
	rv := list.GetResourceVersion()
	go func() {
		for ctx.Err() == nil {
			w, err := ri.Watch(ctx, metav1.ListOptions{LabelSelector: selector, ResourceVersion: rv, AllowWatchBookmarks: true})
			if err != nil {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			for ev := range w.ResultChan() {
				u, ok := ev.Object.(*unstructured.Unstructured)
				if ev.Type == watch.Error || !ok {
					if ctx.Err() != nil {
						return // the phase is over
					}
					// Resuming from rv would miss events (or loop on 410
					// Gone): the phase cannot be measured.
					tb.Errorf("the bench's watch ended with %v; this phase's figures would miss changes", ev.Object)
					w.Stop()
					return
				}
				rv = u.GetResourceVersion()
				if ev.Type != watch.Bookmark {
					on(ev.Type, u)
				}
			}
			w.Stop()
		}
	}()
}

// phaseSpec is what one phase writes and what its watches wait for.
type phaseSpec struct {
	name string
	// write does one object's write (the clock starts just before it).
	write func(ctx context.Context, ws benchWorkspace, name string) error
	// local and remote tell, per event, whether the object is done on that
	// side; nil for a side the phase does not wait on.
	local, remote func(watch.EventType, *unstructured.Unstructured) bool
	// byWorkspace writes a workspace's objects together, one workspace
	// after another, so that a workspace's time from its first write to
	// its last object done is its own sync time, not the spread of writes
	// interleaved across every workspace.
	byWorkspace bool
}

// run runs one phase over every object and measures it.
func (s *benchSide) run(tb testing.TB, names []string, p phaseSpec) benchreport.Phase {
	tb.Helper()
	phase, _ := s.runObserved(tb, names, p)
	return phase
}

// runObserved is run, also returning what it observed per object.
func (s *benchSide) runObserved(tb testing.TB, names []string, p phaseSpec) (benchreport.Phase, *observer) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	watches := 0
	localWatch, remoteWatch := -1, -1
	if p.local != nil {
		localWatch, watches = watches, watches+1
	}
	if p.remote != nil {
		remoteWatch, watches = watches, watches+1
	}
	obs := newObserver(watches)
	if p.local != nil {
		watchFrom(ctx, tb, s.local, s.localSelector, func(t watch.EventType, u *unstructured.Unstructured) {
			if p.local(t, u) {
				obs.saw(localWatch, s.localKey(u))
			}
		})
	}
	if p.remote != nil {
		for _, ws := range s.workspaces {
			watchFrom(ctx, tb, ws.remote, "", func(t watch.EventType, u *unstructured.Unstructured) {
				if p.remote(t, u) {
					obs.saw(remoteWatch, benchKey(ws.cluster, u.GetName()))
				}
			})
		}
	}
	total := len(names) * len(s.workspaces)
	kcp0, local0, wire0 := s.kcpRequests.count(tb), s.localRequests.count(tb), s.wire.total()
	// kcp's CPU time is the suite's kcp process's; a sharded kcp's shards
	// are children of sharded-test-server, whose own CPU time does not
	// hold theirs, so there it is not measured.
	measureCPU := s.kcp.sharded == nil
	var kcpPid int
	var kcpCPU0 float64
	if measureCPU {
		kcpPid, kcpCPU0 = env.kcp.Pid(), kcpCPUSeconds(tb)
	}
	start := time.Now()
	s.forEach(names, p.byWorkspace, func(ws benchWorkspace, name string) {
		obs.start(benchKey(ws.cluster, name), time.Now())
		if err := p.write(ctx, ws, name); err != nil {
			tb.Errorf("%s %s: %s %s: %v", s.system, p.name, ws.cluster, name, err)
		}
	})
	err := framework.Eventually(ctx, 15*time.Minute, 20*time.Millisecond, func(context.Context) (bool, string) {
		n := obs.count()
		return n == total, fmt.Sprintf("%d of %d objects done", n, total)
	})
	if err != nil {
		tb.Fatalf("%s, phase %s: %v", s.system, p.name, err)
	}
	phase := benchreport.NewPhase(p.name, total, time.Since(start), obs.latencies())
	if p.local != nil && p.remote != nil {
		phase.SetLocalLatencies(obs.latenciesOf(localWatch))
	}
	// Late requests (a finalizer released after the last watch event, a
	// status echo) still count: wait for the counts to settle.
	time.Sleep(time.Second)
	kcp1, local1 := s.kcpRequests.count(tb), s.localRequests.count(tb)
	phase.KCPRequests = (kcp1.total() - kcp0.total()) / float64(total)
	phase.KCPRequestsByVerb = kcp1.perObject(kcp0, total)
	phase.LocalRequests = (local1.total() - local0.total()) / float64(total)
	phase.LocalRequestsByVerb = local1.perObject(local0, total)
	phase.WireBytes = float64(s.wire.total()-wire0) / float64(total)
	if measureCPU {
		if env.kcp.Pid() != kcpPid {
			tb.Fatalf("%s %s: kcp restarted during the phase; its CPU time cannot be measured", s.system, p.name)
		}
		phase.KCPCPUSeconds = kcpCPUSeconds(tb) - kcpCPU0
	}
	tb.Logf("%s %s: %d objects in %.2fs (p50 %.2fs, p99 %.2fs%s), kcp CPU %.1f ms per object, requests per object: kcp %.2f (%s), service cluster %.2f (%s); %.0f bytes per object between edge and broker",
		s.system, p.name, total, phase.WallSeconds, phase.P50, phase.P99, localGone(phase), phase.KCPCPUPerObject()*1000,
		phase.KCPRequests, byVerb(phase.KCPRequestsByVerb), phase.LocalRequests, byVerb(phase.LocalRequestsByVerb), phase.WireBytes)
	return phase, obs
}

// localGone is "; local gone p50 ..." for a phase that has it.
func localGone(p benchreport.Phase) string {
	if len(p.LocalLatencies) == 0 {
		return ""
	}
	return fmt.Sprintf("; local gone p50 %.2fs, p99 %.2fs", p.LocalP50, p.LocalP99)
}

// byVerb formats requests per object by verb, sorted by verb.
func byVerb(m map[string]float64) string {
	var parts []string
	for verb, n := range m {
		parts = append(parts, fmt.Sprintf("%s %.2f", verb, n))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// phases runs create, update, status and (after between) delete, the
// workload every side gets.
func (s *benchSide) phases(tb testing.TB, objects int, between func() []benchreport.Phase) []benchreport.Phase {
	tb.Helper()
	names := objectNames(objects)
	var out []benchreport.Phase
	// CPU over create and update (at 10 × 100; the edge is killed later).
	s.profiles.fetch(tb, "cpu", "profile?seconds=30")
	out = append(out, s.run(tb, names, s.createSpec()))
	out = append(out, s.run(tb, names, phaseSpec{
		name: "update",
		write: func(ctx context.Context, ws benchWorkspace, name string) error {
			_, err := ws.remote.Patch(ctx, name, types.MergePatchType, []byte(`{"spec":{"fieldV1":"v2"}}`), metav1.PatchOptions{})
			return err
		},
		local: func(t watch.EventType, u *unstructured.Unstructured) bool {
			v, _ := specField(u, "fieldV1")
			return t != watch.Deleted && v == "v2"
		},
	}))
	out = append(out, s.run(tb, names, s.statusSpec(tb)))
	if between != nil {
		out = append(out, between()...)
	}
	out = append(out, s.run(tb, names, s.deleteSpec()))
	return out
}

// createSpec creates every object in kcp; done once its local copy exists.
func (s *benchSide) createSpec() phaseSpec {
	return phaseSpec{
		name: "create",
		write: func(ctx context.Context, ws benchWorkspace, name string) error {
			_, err := ws.remote.Create(ctx, &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": s.remoteGVR.GroupVersion().String(), "kind": s.remoteKind,
				"metadata": map[string]any{"name": name, "namespace": "default"},
				"spec":     map[string]any{"fieldV1": "v1"},
			}}, metav1.CreateOptions{})
			return err
		},
		local: func(t watch.EventType, _ *unstructured.Unstructured) bool { return t != watch.Deleted },
	}
}

// statusSpec sets a status on every local copy there is now; done once kcp
// shows it.
func (s *benchSide) statusSpec(tb testing.TB) phaseSpec {
	tb.Helper()
	locals := s.localNames(tb)
	return phaseSpec{
		name: "status",
		write: func(ctx context.Context, ws benchWorkspace, name string) error {
			nn, ok := locals[benchKey(ws.cluster, name)]
			if !ok {
				return fmt.Errorf("no local copy")
			}
			_, err := s.local.Namespace(nn[0]).Patch(ctx, nn[1], types.MergePatchType, []byte(`{"status":{"phase":"ready"}}`),
				metav1.PatchOptions{}, "status")
			return err
		},
		remote: func(t watch.EventType, u *unstructured.Unstructured) bool {
			p, _, _ := unstructured.NestedString(u.Object, "status", "phase")
			return t != watch.Deleted && p == "ready"
		},
	}
}

// deleteSpec deletes every object in kcp; done once it is gone there and
// its local copy is gone.
func (s *benchSide) deleteSpec() phaseSpec {
	return phaseSpec{
		name: "delete",
		write: func(ctx context.Context, ws benchWorkspace, name string) error {
			err := ws.remote.Delete(ctx, name, metav1.DeleteOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		},
		local:  func(t watch.EventType, _ *unstructured.Unstructured) bool { return t == watch.Deleted },
		remote: func(t watch.EventType, _ *unstructured.Unstructured) bool { return t == watch.Deleted },
	}
}

// localNames maps object keys to their local copies' namespace and name.
func (s *benchSide) localNames(tb testing.TB) map[string][2]string {
	tb.Helper()
	list, err := s.local.List(context.Background(), metav1.ListOptions{LabelSelector: s.localSelector})
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string][2]string{}
	for _, u := range list.Items {
		out[s.localKey(&u)] = [2]string{u.GetNamespace(), u.GetName()}
	}
	return out
}

// versions maps every object key, local copies and kcp objects apart, to
// its resourceVersion: what a restart must not move.
func (s *benchSide) versions(tb testing.TB) map[string]string {
	tb.Helper()
	ctx := context.Background()
	out := map[string]string{}
	list, err := s.local.List(ctx, metav1.ListOptions{LabelSelector: s.localSelector})
	if err != nil {
		tb.Fatal(err)
	}
	for _, u := range list.Items {
		out["local:"+s.localKey(&u)] = u.GetResourceVersion()
	}
	for _, ws := range s.workspaces {
		list, err := ws.remote.List(ctx, metav1.ListOptions{})
		if err != nil {
			tb.Fatal(err)
		}
		for _, u := range list.Items {
			out["kcp:"+benchKey(ws.cluster, u.GetName())] = u.GetResourceVersion()
		}
	}
	return out
}

// sampleUsage reads the usage of p (before it is killed, or at the end).
func (s *benchSide) sampleUsage(tb testing.TB, p *framework.Process) {
	tb.Helper()
	u, err := benchreport.ReadUsage(p.Pid())
	if err != nil {
		tb.Fatalf("usage of %s: %v", p.Name, err)
	}
	s.usage[p.Name] = s.usage[p.Name].Add(u)
}

// processUsage is the side's programs' usage over the whole run.
func (s *benchSide) processUsage(tb testing.TB) []benchreport.Process {
	tb.Helper()
	for _, p := range s.processes() {
		s.sampleUsage(tb, p)
	}
	var out []benchreport.Process
	for name, u := range s.usage {
		out = append(out, benchreport.Process{Name: name, PeakRSSBytes: u.PeakRSSBytes, CPUSeconds: u.CPUSeconds, FileRSSBytes: u.FileRSSBytes})
	}
	slices.SortFunc(out, func(a, b benchreport.Process) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// runBench measures every side with size and writes the report (table,
// JSON, SVG) to out.
func runBench(tb testing.TB, size benchSize, out string) benchreport.Report {
	tb.Helper()
	report := benchreport.Report{Date: time.Now().UTC(), Machine: machine(), Workspaces: size.workspaces, PerWS: size.objects}

	for _, system := range []string{benchreport.Floor, benchreport.Direct} {
		direct := newDirectSide(tb, size.workspaces, system)
		run := benchreport.Run{System: system, Phases: direct.phases(tb, size.objects, nil)}
		run.Processes = direct.processUsage(tb)
		report.Runs = append(report.Runs, run)
	}

	var profiles *benchProfiles
	if dir := os.Getenv("FERRY_BENCH_PROFILES"); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			tb.Fatal(err)
		}
		profiles = &benchProfiles{dir: dir, addrs: map[string]string{}}
	}
	ferry, fe := newFerrySide(tb, benchPlural, size.workspaces, profiles)
	ferry.profiles = profiles
	run := benchreport.Run{System: benchreport.Ferry}
	run.Phases = ferry.phases(tb, size.objects, func() []benchreport.Phase {
		// Heap after create, update and status: every object cached.
		profiles.fetch(tb, "heap", "heap")
		return []benchreport.Phase{ferry.restartEdge(tb, fe), ferry.restartBroker(tb, fe)}
	})
	if profiles != nil {
		profiles.wg.Wait()
	}
	run.Processes = ferry.processUsage(tb)
	report.Runs = append(report.Runs, run)

	writeReport(tb, out, "bench", &report)
	f, err := os.Create(filepath.Join(out, "bench.svg"))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	if err := report.SVG(f); err != nil {
		tb.Fatal(err)
	}
	tb.Logf("bench results in %s (bench.txt, bench.json, bench.svg)", out)
	return report
}

// benchReport is a report the benches print and write as NAME.txt and
// NAME.json.
type benchReport interface {
	Table(io.Writer) error
	WriteJSON(path string) error
}

// writeReport prints r's table and writes it and r's JSON into out.
func writeReport(tb testing.TB, out, name string, r benchReport) {
	tb.Helper()
	if err := os.MkdirAll(out, 0o755); err != nil {
		tb.Fatal(err)
	}
	var table strings.Builder
	if err := r.Table(&table); err != nil {
		tb.Fatal(err)
	}
	fmt.Print(table.String())
	if err := os.WriteFile(filepath.Join(out, name+".txt"), []byte(table.String()), 0o644); err != nil {
		tb.Fatal(err)
	}
	if err := r.WriteJSON(filepath.Join(out, name+".json")); err != nil {
		tb.Fatal(err)
	}
}

// machine describes the machine for the report: CPU model and count.
func machine() string {
	model := "unknown CPU"
	if data, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(data), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
	}
	return fmt.Sprintf("%d cores, %s", runtime.NumCPU(), model)
}

// BenchmarkSync is `make bench`: W workspaces × N objects (FERRY_BENCH_*)
// through the floor, the direct copy and ferry; results in FERRY_BENCH_OUT.
func BenchmarkSync(b *testing.B) {
	out := os.Getenv("FERRY_BENCH_OUT")
	if out == "" {
		out = testDir(b)
	}
	for range b.N {
		runBench(b, benchSizeFromEnv(b), out)
	}
}

// TestBenchHarnessSmoke runs the bench at 2 × 5: the harness works, every
// side completes every phase, restarts write nothing, and the report is
// written. Figures at this size mean nothing, except the requests the
// floor saves by having no finalizer.
func TestBenchHarnessSmoke(t *testing.T) {
	out := filepath.Join(testDir(t), "bench")
	report := runBench(t, benchSize{workspaces: 2, objects: 5}, out)
	ferry, _ := report.Run(benchreport.Ferry)
	direct, _ := report.Run(benchreport.Direct)
	floor, _ := report.Run(benchreport.Floor)
	if len(floor.Phases) != 4 || len(direct.Phases) != 4 || len(ferry.Phases) != 6 {
		t.Errorf("phases: floor %d, direct %d, ferry %d; want 4, 4 and 6", len(floor.Phases), len(direct.Phases), len(ferry.Phases))
	}
	// Only the restart phases count writes (restartPhase): a restarted side
	// resyncs without writing an unchanged object.
	for _, name := range []string{"edge-restart", "broker-restart"} {
		if p, ok := ferry.Phase(name); !ok || p.Writes != 0 {
			t.Errorf("ferry %s: found %v, %d objects written; want 0", name, ok, p.Writes)
		}
	}
	if create, _ := ferry.Phase("create"); create.WireBytes <= 0 || create.KCPRequests <= 0 || create.LocalRequests <= 0 {
		t.Errorf("ferry create: %.0f wire bytes, %.2f kcp and %.2f local requests per object; want all counted",
			create.WireBytes, create.KCPRequests, create.LocalRequests)
	}
	// Every measured phase of every side has kcp's CPU and its requests by
	// verb, and a delete has the time until the local copies were gone.
	for _, run := range report.Runs {
		for _, p := range run.Phases {
			if len(p.Latencies) == 0 {
				continue
			}
			if p.KCPCPUSeconds <= 0 || len(p.KCPRequestsByVerb) == 0 || len(p.LocalRequestsByVerb) == 0 {
				t.Errorf("%s %s: kcp CPU %.2fs, kcp requests %v, local requests %v; want all measured",
					run.System, p.Name, p.KCPCPUSeconds, p.KCPRequestsByVerb, p.LocalRequestsByVerb)
			}
			if p.Name == "delete" && (len(p.LocalLatencies) != p.Objects || p.LocalP50 <= 0) {
				t.Errorf("%s delete: %d local-gone latencies for %d objects, p50 %.2fs", run.System, len(p.LocalLatencies), p.Objects, p.LocalP50)
			}
		}
	}
	// The floor writes no finalizer: creating and deleting cost kcp fewer
	// requests than the direct copy's, and no PATCH at all.
	for _, name := range []string{"create", "delete"} {
		fp, _ := floor.Phase(name)
		dp, _ := direct.Phase(name)
		if fp.KCPRequests >= dp.KCPRequests || fp.KCPRequestsByVerb["PATCH"] != 0 {
			t.Errorf("%s: floor %.2f kcp requests per object (%v), direct %.2f (%v); want fewer for the floor and no PATCH",
				name, fp.KCPRequests, fp.KCPRequestsByVerb, dp.KCPRequests, dp.KCPRequestsByVerb)
		}
	}
	if _, ok := report.AgainstFloor(); !ok {
		t.Error("no comparison with the floor")
	}
	if len(ferry.Processes) != 2 || ferry.PeakRSS() == 0 || direct.PeakRSS() == 0 || floor.PeakRSS() == 0 {
		t.Errorf("process usage: ferry %+v, direct %+v, floor %+v", ferry.Processes, direct.Processes, floor.Processes)
	}
	for _, f := range []string{"bench.txt", "bench.json", "bench.svg"} {
		if _, err := os.Stat(filepath.Join(out, f)); err != nil {
			t.Error(err)
		}
	}
}

// Command edgeload is `make bench-edges`: it starts a real kcp and the real
// ferry-broker, connects N simulated edges to the broker over mTLS on
// loopback (package edgeload: ferry's own edge stream client, an identity
// and an APIExport per edge) and measures what the broker pays per
// connected edge, how fast it takes handshakes, and how it absorbs a
// reconnect storm of all N edges at once. A few of the edges (--traffic-edges)
// publish a small CRD each, which one consumer workspace binds; during the
// steady window the generator writes objects of those CRDs in kcp, and those
// edges answer the broker's intents with results and status reports. It
// prints a table and writes it, with the figures as JSON, to --out.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"

	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/pkg/protocol"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
	"github.com/ferry-dev/ferry/test/edgeload"
	"github.com/ferry-dev/ferry/test/framework"
)

type options struct {
	edges          int
	workspaces     int
	dir, out       string
	kcpBin, broker string
	heartbeat      time.Duration
	steady         time.Duration
	backoffInitial time.Duration
	backoffMax     time.Duration
	waveTimeout    time.Duration
	kcpSettleMax   time.Duration
	exportParallel int
	brokerArgs     stringList
	trafficEdges   int
	trafficRate    float64
}

// stringList is a repeatable flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, " ") }
func (l *stringList) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var o options
	flag.IntVar(&o.edges, "edges", 100, "Simulated edges.")
	flag.IntVar(&o.workspaces, "workspaces", 1, "Workspaces the APIExports are spread over, round-robin (1: all in one, the broker's best case for a cold start; kcp takes minutes for a few hundred).")
	flag.StringVar(&o.dir, "dir", "_artifacts/bench-edges", "Work directory: kcp's data, the PKI, the broker's configuration and every log.")
	flag.StringVar(&o.out, "out", "_bench", "Directory for bench-edges.txt and bench-edges.json.")
	flag.StringVar(&o.kcpBin, "kcp-bin", os.Getenv("FERRY_KCP_BIN"), "The kcp binary (make exports FERRY_KCP_BIN).")
	flag.StringVar(&o.broker, "broker-bin", "bin/bench/ferry-broker", "The ferry-broker binary.")
	flag.DurationVar(&o.heartbeat, "heartbeat-interval", protocol.DefaultHeartbeatInterval, "Heartbeat interval of broker and edges.")
	flag.DurationVar(&o.steady, "steady", time.Minute, "Steady-state window over which CPU is measured, every edge connected.")
	flag.DurationVar(&o.backoffInitial, "reconnect-initial-delay", 250*time.Millisecond, "The edges' first reconnect delay cap (ferry-edge's default).")
	flag.DurationVar(&o.backoffMax, "reconnect-max-delay", 5*time.Second, "The edges' reconnect delay cap (ferry-edge's default).")
	flag.DurationVar(&o.kcpSettleMax, "kcp-settle-max", 4*time.Minute, "How long to wait, before the idle window and the waves, for kcp to be quiet after the APIExports were created.")
	flag.DurationVar(&o.waveTimeout, "wave-timeout", 10*time.Minute, "How long a connect wave may take before the run fails.")
	flag.IntVar(&o.exportParallel, "export-parallel", 16, "APIExports created at once.")
	flag.Var(&o.brokerArgs, "broker-arg", "A flag for ferry-broker, e.g. --broker-arg=--max-concurrent-handshakes=0 (repeatable).")
	flag.IntVar(&o.trafficEdges, "traffic-edges", 20, "Edges that publish a small CRD each and answer intents with results and status reports (0: no intent or report traffic).")
	flag.Float64Var(&o.trafficRate, "traffic-rate", 10, "Objects the generator creates or updates in kcp per second during the steady window, across all traffic edges.")
	flag.Parse()
	if o.edges < 1 || o.kcpBin == "" {
		fmt.Fprintln(os.Stderr, "edgeload: --edges must be positive and --kcp-bin set (run it through make bench-edges)")
		os.Exit(2)
	}
	if o.workspaces < 1 {
		fmt.Fprintln(os.Stderr, "edgeload: --workspaces must be positive")
		os.Exit(2)
	}
	// A workspace without an export would only cost kcp.
	o.workspaces = min(o.workspaces, o.edges)
	if o.trafficEdges < 0 || (o.trafficEdges > 0 && o.trafficRate <= 0) {
		fmt.Fprintln(os.Stderr, "edgeload: --traffic-edges must not be negative, and --traffic-rate must be positive with traffic")
		os.Exit(2)
	}
	o.trafficEdges = min(o.trafficEdges, o.edges)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "edgeload:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, o options) error {
	dir, err := filepath.Abs(o.dir)
	if err != nil {
		return err
	}
	// A fresh kcp and PKI every run: a second run must not measure the
	// first one's leftovers.
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	logs := filepath.Join(dir, "logs")
	bins := framework.Binaries{KCP: o.kcpBin, Broker: o.broker}
	step := func(format string, args ...any) {
		fmt.Printf("%s  "+format+"\n", append([]any{time.Now().UTC().Format("15:04:05")}, args...)...)
	}

	step("starting kcp (logs in %s)", logs)
	kcp, err := framework.StartKCP(ctx, bins.KCP, filepath.Join(dir, "kcp"), logs)
	if err != nil {
		return err
	}
	defer func() { _ = kcp.Stop(30 * time.Second) }()
	report := &edgeload.Report{Date: time.Now().UTC(), Machine: machine(), Edges: o.edges, Workspaces: o.workspaces,
		HeartbeatSeconds: o.heartbeat.Seconds(), BrokerArgs: o.brokerArgs}
	start := time.Now()
	ws, err := createWorkspaces(ctx, kcp.Config, o.workspaces, workspacesParallel)
	if err != nil {
		return err
	}
	report.WorkspacesSetupSeconds = time.Since(start).Seconds()
	step("%d workspaces created in %.1fs", o.workspaces, report.WorkspacesSetupSeconds)
	start = time.Now()
	if err := createExports(ctx, kcp.Config, ws, o.edges, o.exportParallel); err != nil {
		return err
	}
	report.ExportsSetupSeconds = time.Since(start).Seconds()
	step("%d APIExports in %d workspaces created in %.1fs", o.edges, o.workspaces, report.ExportsSetupSeconds)

	pki := filepath.Join(dir, "pki")
	if err := framework.MakePKI(ctx, bins, pki, "admin"); err != nil {
		return err
	}
	if err := issueEdgeCertificates(pki, o.edges); err != nil {
		return err
	}
	broker, pprof, err := startBroker(ctx, bins, dir, pki, kcp.StableKubeconfig, brokerConfig(ws, o.edges), o.heartbeat, o.brokerArgs)
	if err != nil {
		return err
	}
	defer func() { _ = broker.Stop(30 * time.Second) }()
	step("broker serving at %s (log %s)", broker.Address, broker.LogFile)

	fleet, err := newFleet(broker.Address, pki, o)
	if err != nil {
		return err
	}
	defer fleet.Stop()

	// Idle: every edge configured, none connected; after the broker's
	// start-up writes (one Lease per configured edge) have settled. What
	// kcp spends here is its own cost of n APIExports, not the edges'.
	if err := sleep(ctx, o.heartbeat); err != nil {
		return err
	}
	// kcp works for minutes after n new APIExports (and the broker's
	// first Leases); a cold start measured then would measure that work.
	// The waves start once kcp is quiet, as a broker starting against a
	// running kcp finds it.
	step("waiting until kcp is quiet (below %.2f cores over %s, at most %s)", kcpQuietCores, kcpQuietWindow, o.kcpSettleMax)
	settle := time.Now()
	quiet, err := waitQuiet(ctx, kcp.Pid(), o.kcpSettleMax)
	if err != nil {
		return err
	}
	report.KCPSettle = edgeload.Settle{Seconds: time.Since(settle).Seconds(), Cores: quiet, Quiet: quiet < kcpQuietCores}
	step("kcp at %.2f cores after %.0fs", quiet, report.KCPSettle.Seconds)
	step("idle: measuring CPU for %s", 2*o.heartbeat)
	report.Idle, err = edgeload.MeasureCPU(ctx, map[string]int{"broker": broker.Pid(), "kcp": kcp.Pid()}, 2*o.heartbeat)
	if err != nil {
		return err
	}
	if err := addSample(ctx, report, "idle", broker, pprof, fleet); err != nil {
		return err
	}

	step("cold start: %d edges at once", o.edges)
	wave, err := measureWave(ctx, "cold start", broker, fleet, o, func() edgeload.Mark {
		m := fleet.Mark()
		fleet.Start(ctx)
		return m
	})
	report.Waves = append(report.Waves, wave)
	if err != nil {
		return finish(report, o.out, err)
	}

	// Traffic: the traffic edges published on connecting; bind their
	// exports and start writing their objects before the settling.
	var traffic *trafficRun
	if o.trafficEdges > 0 {
		if traffic, err = startTraffic(ctx, kcp.Config, ws, fleet, o, step); err != nil {
			return finish(report, o.out, err)
		}
	}

	// Steady: a few heartbeats after the last handshake, then the window.
	if err := sleep(ctx, 3*o.heartbeat); err != nil {
		return err
	}
	step("steady state: measuring CPU for %s", o.steady)
	before, _ := framework.Scrape(ctx, broker.Process)
	if traffic != nil {
		traffic.mark()
	}
	report.Steady, err = edgeload.MeasureCPU(ctx, map[string]int{"broker": broker.Pid(), "kcp": kcp.Pid(), "generator": os.Getpid()}, o.steady)
	if err != nil {
		return err
	}
	if after, err := framework.Scrape(ctx, broker.Process); err == nil {
		report.Steady.KCPRequestsPerSecond = (kcpRequests(after) - kcpRequests(before)) / report.Steady.Seconds
	}
	if traffic != nil {
		report.Traffic = traffic.stop()
		step("traffic: %d writes, %.1f intents/s and %.1f reports/s at the edges, round trip p50 %.3fs p99 %.3fs",
			report.Traffic.Writes, report.Traffic.IntentsPerSecond, report.Traffic.ReportsPerSecond,
			report.Traffic.RoundTripP50Seconds, report.Traffic.RoundTripP99Seconds)
	}
	if err := addSample(ctx, report, "connected", broker, pprof, fleet); err != nil {
		return err
	}

	step("reconnect storm: every edge drops its connection and redials at once")
	wave, err = measureWave(ctx, "storm: edges redial", broker, fleet, o, func() edgeload.Mark { return fleet.Drop(ctx) })
	report.Waves = append(report.Waves, wave)
	if err != nil {
		return finish(report, o.out, err)
	}
	if err := addSample(ctx, report, "after edge storm", broker, pprof, fleet); err != nil {
		return err
	}

	step("reconnect storm: the broker is killed (SIGKILL) and started again")
	var restartErr error
	wave, err = measureWave(ctx, "storm: broker restart", broker, fleet, o, func() edgeload.Mark {
		m := fleet.Mark()
		restartErr = broker.Restart(ctx, true)
		return m
	})
	report.Waves = append(report.Waves, wave)
	if err = errors.Join(restartErr, err); err != nil {
		return finish(report, o.out, err)
	}
	if err := addSample(ctx, report, "after broker restart", broker, pprof, fleet); err != nil {
		return err
	}
	return finish(report, o.out, nil)
}

// finish prints and writes the report, also after a failed wave.
func finish(r *edgeload.Report, out string, runErr error) error {
	if err := r.WriteTable(os.Stdout); err != nil {
		return errors.Join(runErr, err)
	}
	if err := r.Write(out); err != nil {
		return errors.Join(runErr, err)
	}
	fmt.Printf("\nresults in %s (bench-edges.txt, bench-edges.json)\n", out)
	return runErr
}

// newFleet builds the simulated edges, each with its own certificate.
func newFleet(address, pki string, o options) (*edgeload.Fleet, error) {
	edges := make([]*edgeload.Edge, o.edges)
	for i := range edges {
		tlsCfg, err := tlsconfig.Client(tlsconfig.Files{
			CertFile: devpki.CertFile(pki, edgeName(i)),
			KeyFile:  devpki.KeyFile(pki, edgeName(i)),
			CAFile:   filepath.Join(pki, devpki.CACertFile),
		}, "", tlsconfig.Profile{})
		if err != nil {
			return nil, err
		}
		publish, err := publishFor(i, o.trafficEdges)
		if err != nil {
			return nil, err
		}
		edges[i] = edgeload.NewEdge(edgeload.EdgeOptions{
			Name: edgeName(i), BrokerAddress: address, TLS: tlsCfg, HeartbeatInterval: o.heartbeat,
			BackoffInitial: o.backoffInitial, BackoffMax: o.backoffMax, MaxMessageBytes: protocol.DefaultMaxMessageBytes,
			// The waves count every attempt; a thousand edges' logs
			// would only cost the generator CPU the broker needs.
			Log:     logr.Discard(),
			Publish: publish,
		})
	}
	return edgeload.NewFleet(edges), nil
}

// measureWave starts a wave with begin and waits until every edge is
// accepted; it adds the broker's handshake refusals and CPU during the
// wave. The refusal counters of a restarted broker start again at zero.
func measureWave(ctx context.Context, name string, b *framework.Broker, fleet *edgeload.Fleet, o options, begin func() edgeload.Mark) (edgeload.Wave, error) {
	before, _ := framework.Scrape(ctx, b.Process)
	pid := b.Pid()
	cpuBefore, _ := readCPU(pid)
	m := begin()
	wave, err := fleet.Wait(ctx, name, m, o.backoffMax, o.waveTimeout)
	after, scrapeErr := framework.Scrape(ctx, b.Process)
	if scrapeErr == nil {
		if b.Pid() != pid {
			before = nil
		}
		wave.Refusals = refusalsDelta(before, after)
		wave.KCPRequests = kcpRequests(after) - kcpRequests(before)
	}
	if b.Pid() != pid {
		cpuBefore = 0
	}
	if cpu, cerr := readCPU(b.Pid()); cerr == nil {
		wave.BrokerCPUSeconds = cpu - cpuBefore
	}
	fmt.Printf("%s  %s: %d/%d accepted, all in %.2fs, p99 %.2fs, %d attempts, refusals %v\n", time.Now().UTC().Format("15:04:05"),
		name, wave.Accepted, wave.Edges, wave.Seconds, wave.P99Seconds, wave.Attempts, wave.Refusals)
	return wave, err
}

func addSample(ctx context.Context, r *edgeload.Report, at string, b *framework.Broker, pprof string, fleet *edgeload.Fleet) error {
	s, err := edgeload.TakeSample(ctx, at, b.Pid(), pprof)
	if err != nil {
		return fmt.Errorf("sample %s: %w", at, err)
	}
	s.Connected = fleet.Connected()
	r.Samples = append(r.Samples, s)
	return nil
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

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

// kcp is quiet when it uses less than kcpQuietCores over kcpQuietWindow.
const (
	kcpQuietCores  = 0.3
	kcpQuietWindow = 5 * time.Second
)

// waitQuiet measures kcp's CPU in windows until one is below
// kcpQuietCores or limit has passed; it returns the last window's use.
func waitQuiet(ctx context.Context, pid int, limit time.Duration) (float64, error) {
	deadline := time.Now().Add(limit)
	for {
		w, err := edgeload.MeasureCPU(ctx, map[string]int{"kcp": pid}, kcpQuietWindow)
		if err != nil {
			return 0, err
		}
		if cores := w.Cores["kcp"]; cores < kcpQuietCores || time.Now().After(deadline) {
			return cores, nil
		}
	}
}

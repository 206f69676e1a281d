package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/kcp-dev/logicalcluster/v3"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/publish"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/test/benchreport"
	"github.com/ferry-dev/ferry/test/framework"
)

// The systems the bench compares, set up on the suite's servers.

const (
	benchKind   = "Parcel"
	benchPlural = "parcels"
	// directLabel marks (and names the workspace of) the direct copies'
	// local copies; test/cmd/directcopy sets it.
	directLabel = "directcopy.ferry.dev/cluster"
)

// benchGroup is a CRD group unique to the test and side.
func benchGroup(tb testing.TB, side string) string {
	label := sanitize(tb.Name())
	if len(label) > 40 {
		label = label[:40]
	}
	return side + "-" + strings.Trim(label, "-") + ".bench.ferry.dev"
}

// benchCreateParallel is how many workspaces benchWorkspaces creates and
// binds at once: kcp readies a workspace in about a second, mostly waiting,
// so a few at once fill the wait without making kcp the bottleneck of a
// 2-core machine.
const benchCreateParallel = 8

// benchKCP is the kcp a bench side's workspaces live in: the suite's, or
// the shared sharded kcp, where workspace i is placed on shard i%shards.
type benchKCP struct {
	// config is kcp's admin config for the root workspace (the sharded
	// kcp's through its front-proxy).
	config *rest.Config
	// provider is the workspace that holds the APIExport.
	provider logicalcluster.Path
	// sharded is nil for the suite's kcp.
	sharded *framework.ShardedKCP
}

func suiteBenchKCP() benchKCP { return benchKCP{config: env.kcp.Config, provider: env.provider} }

// createWorkspace creates workspace name in root: on the sharded kcp on
// shard i%shards (and proves kcp put it there), returning that shard's name.
func (k benchKCP) createWorkspace(ctx context.Context, i int, name string) (logicalcluster.Path, string, error) {
	if k.sharded == nil {
		path, err := framework.CreateWorkspace(ctx, k.config, "root", name)
		return path, "", err
	}
	shard := k.sharded.Shards[i%len(k.sharded.Shards)]
	path, err := framework.CreateWorkspaceOn(ctx, k.config, "root", name, map[string]string{"region": shard.Region})
	if err != nil {
		return path, "", err
	}
	on, err := k.sharded.WorkspaceShard(ctx, path)
	if err != nil {
		return path, "", err
	}
	if on != shard.Name {
		return path, "", fmt.Errorf("workspace %s was scheduled on shard %s, want %s", path, on, shard.Name)
	}
	return path, shard.Name, nil
}

// benchWorkspaces binds the export exportName in n new consumer workspaces
// of kcp, benchCreateParallel at once, and returns a client (not rate
// limited) for the served resource in each, in order.
func benchWorkspaces(tb testing.TB, k benchKCP, prefix, exportName string, served schema.GroupVersionResource, n int) []benchWorkspace {
	tb.Helper()
	ctx := context.Background()
	kcp, err := framework.KCPClient(k.config)
	if err != nil {
		tb.Fatal(err)
	}
	out := make([]benchWorkspace, n)
	bind := func(i int) error {
		name := fmt.Sprintf("%s%d-%s", prefix, i, sanitize(tb.Name()))
		if len(name) > 63 {
			name = strings.TrimRight(name[:63], "-")
		}
		path, shard, err := k.createWorkspace(ctx, i, name)
		if err != nil {
			return err
		}
		if err := framework.BindAPIExport(ctx, k.config, path, k.provider, exportName); err != nil {
			return err
		}
		lc, err := kcp.Cluster(path).CoreV1alpha1().LogicalClusters().Get(ctx, "cluster", metav1.GetOptions{})
		if err != nil {
			return fmt.Errorf("logical cluster of %s: %w", path, err)
		}
		dyn, err := dynamic.NewForConfig(workspaceConfig(noRateLimit(k.config), path))
		if err != nil {
			return err
		}
		ws := benchWorkspace{cluster: logicalcluster.From(lc).String(), shard: shard, remote: dyn.Resource(served).Namespace("default")}
		// A binding takes a moment to serve the resource.
		err = framework.Eventually(ctx, time.Minute, 200*time.Millisecond, func(ctx context.Context) (bool, string) {
			if _, err := ws.remote.List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
				return false, err.Error()
			}
			return true, ""
		})
		if err != nil {
			return fmt.Errorf("workspace %s does not serve %s: %w", path, served, err)
		}
		out[i] = ws
		return nil
	}
	next := make(chan int)
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for range min(benchCreateParallel, n) {
		wg.Go(func() {
			for i := range next {
				if err := bind(i); err != nil {
					errs <- err
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	failed := false
	for err := range errs {
		tb.Error(err)
		failed = true
	}
	if failed {
		tb.FailNow()
	}
	return out
}

// localResource is a client (not rate limited) for a resource of the
// service cluster.
func localResource(tb testing.TB, gvr schema.GroupVersionResource) dynamic.NamespaceableResourceInterface {
	tb.Helper()
	dyn, err := dynamic.NewForConfig(noRateLimit(env.service.Config))
	if err != nil {
		tb.Fatal(err)
	}
	return dyn.Resource(gvr)
}

// newDirectSide publishes a CRD into an APIExport of its own with ferry's
// publisher (so every side serves the same schema), binds it in n
// workspaces and starts the direct copy: with its finalizer for
// benchreport.Direct, without one for benchreport.Floor.
func newDirectSide(tb testing.TB, n int, system string) *benchSide {
	tb.Helper()
	ctx := context.Background()
	if env.bins.DirectCopy == "" {
		tb.Fatal("the direct copy binary is not built (make bench builds it)")
	}
	if _, err := os.Stat(env.bins.DirectCopy); err != nil {
		tb.Fatalf("the direct copy binary: %v (make bench builds it)", err)
	}
	prefix, name, args := "bd", "directcopy", []string(nil)
	if system == benchreport.Floor {
		prefix, name, args = "bn", "directcopy-floor", []string{"--finalizer="}
	}
	group := benchGroup(tb, system)
	crd := testCRD(group, benchKind, benchPlural, apiextensionsv1.NamespaceScoped, "v1")
	apply(tb, crd)
	localGVR := schema.GroupVersionResource{Group: group, Version: "v1", Resource: benchPlural}
	local := localResource(tb, localGVR)
	err := framework.Eventually(ctx, time.Minute, 200*time.Millisecond, func(ctx context.Context) (bool, string) {
		if _, err := local.List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	if err != nil {
		tb.Fatalf("CRD %s is not served: %v", crd.Name, err)
	}

	// The APIExport is named like the group the consumers see.
	if err := framework.CreateAPIExport(ctx, env.kcp.Config, env.provider, group); err != nil {
		tb.Fatal(err)
	}
	kcp, err := framework.KCPClient(env.kcp.Config)
	if err != nil {
		tb.Fatal(err)
	}
	spec, err := json.Marshal(ferryv1alpha1.PublishedResourceSpec{Resource: ferryv1alpha1.SourceResource{APIGroup: group, Kind: benchKind, Version: "v1"}})
	if err != nil {
		tb.Fatal(err)
	}
	crdJSON, err := json.Marshal(crd)
	if err != nil {
		tb.Fatal(err)
	}
	res, err := publish.NewPublisher(kcp, logr.Discard()).Apply(ctx, config.APIExportRef{Workspace: env.provider.String(), Name: group},
		publish.Owners{}, &ferryv1.Publish{PublishedResource: benchPlural, Spec: spec, CustomResourceDefinition: crdJSON})
	if err != nil || res.GetState() != ferryv1.PublishState_PUBLISH_STATE_PUBLISHED {
		tb.Fatalf("publishing the direct copy's CRD: %v %v", res, err)
	}
	sr := res.GetServedResource()
	served := schema.GroupVersionResource{Group: sr.GetGroup(), Version: sr.GetVersion(), Resource: sr.GetResource()}
	s := &benchSide{
		system: system, remoteGVR: served, remoteKind: res.GetProjectedKind(),
		kcp:        suiteBenchKCP(),
		workspaces: benchWorkspaces(tb, suiteBenchKCP(), prefix, group, served, n),
		local:      local, localSelector: directLabel,
		localKey:    func(u *unstructured.Unstructured) string { return benchKey(u.GetLabels()[directLabel], u.GetName()) },
		usage:       map[string]benchreport.Usage{},
		kcpRequests: newAPIRequests(tb, kcpMetricsConfig(tb), served.Group), localRequests: newAPIRequests(tb, env.service.Config, group),
	}

	p, err := framework.StartProcess(name, env.bins.DirectCopy, append([]string{
		"--kcp-kubeconfig", env.kcp.Kubeconfig,
		"--apiexport", env.provider.String() + "/" + group,
		"--resource", served.Group + "/" + served.Version + "/" + served.Resource,
		"--kubeconfig", env.service.Kubeconfig,
		"--local-resource", group + "/v1/" + benchPlural,
		"--local-kind", benchKind,
	}, args...), nil, testDir(tb))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { stopChecked(tb, p) })
	waitLog(tb, p, time.Minute, directCopyReady)
	s.processes = func() []*framework.Process { return []*framework.Process{p} }
	return s
}

// directCopyReady is what the direct copy logs once its caches synced.
const directCopyReady = "caches synced"

// newFerrySide publishes a CRD of plural (which names its PublishedResource,
// unique in the shared service cluster) through a broker and an edge and
// binds it in n workspaces. With profiles set, both serve pprof on free
// loopback ports.
func newFerrySide(tb testing.TB, plural string, n int, profiles *benchProfiles) (*benchSide, *syncEnv) {
	tb.Helper()
	return newFerrySideOn(tb, 1, plural, n, profiles)
}

// newFerrySideOn is newFerrySide on the suite's kcp (shards 1) or on the
// shared sharded kcp (shards its number of shards): there the broker is
// configured against the front-proxy and reaches each shard's virtual
// workspace endpoint directly, the export is bound in one workspace per
// shard first, and the n workspaces are spread over the shards.
func newFerrySideOn(tb testing.TB, shards int, plural string, n int, profiles *benchProfiles) (*benchSide, *syncEnv) {
	tb.Helper()
	group := benchGroup(tb, "ferry")
	var brokerArgs, edgeArgs []string
	if profiles != nil {
		brokerArgs = []string{"--pprof-bind-address", profiles.address(tb, "broker")}
		edgeArgs = []string{"--pprof-bind-address", profiles.address(tb, "edge")}
	}
	// The edge dials the broker through a proxy that counts the hop's bytes.
	var wire *wireProxy
	via := func(broker string) string {
		wire = startWireProxy(tb, broker)
		return wire.address()
	}
	var e *syncEnv
	k := suiteBenchKCP()
	var kcpMetrics func(group string) *apiRequests
	if shards == 1 {
		e = newSyncEnvsArgs(tb, brokerArgs, edgeArgs, via, "bf", publication{crd: testCRD(group, benchKind, plural, apiextensionsv1.NamespaceScoped, "v1")})[0]
		kcpMetrics = func(group string) *apiRequests { return newAPIRequests(tb, kcpMetricsConfig(tb), group) }
	} else {
		se := newShardedEnvArgs(tb, brokerArgs, edgeArgs, via, group, benchKind, plural)
		if len(se.kcp.Shards) != shards {
			tb.Fatalf("%d shards asked for; the sharded kcp has %d", shards, len(se.kcp.Shards))
		}
		e = se.ws[0]
		k = benchKCP{config: se.kcp.Config, provider: e.path, sharded: se.kcp}
		kcpMetrics = func(group string) *apiRequests { return shardedKCPRequests(tb, se.kcp, group) }
	}
	s := &benchSide{
		wire:   wire,
		system: benchreport.Ferry, remoteGVR: e.remoteGVR, remoteKind: e.remoteKind,
		kcp:        k,
		workspaces: benchWorkspaces(tb, k, "bf", e.export.Name, e.remoteGVR, n),
		local:      localResource(tb, e.localGVR), localSelector: naming.LabelRemoteCluster,
		localKey: func(u *unstructured.Unstructured) string {
			return benchKey(u.GetLabels()[naming.LabelRemoteCluster], u.GetAnnotations()[naming.AnnotationName])
		},
		processes:   func() []*framework.Process { return []*framework.Process{e.broker.Process, e.edge} },
		usage:       map[string]benchreport.Usage{},
		kcpRequests: kcpMetrics(e.remoteGVR.Group), localRequests: newAPIRequests(tb, env.service.Config, e.localGVR.Group),
	}
	return s, e
}

// restartEdge kills the edge (kill -9) and starts it again: the time until
// its inventory is compared and nothing is left to send, and how many
// objects were written on either side (want none).
func (s *benchSide) restartEdge(tb testing.TB, e *syncEnv) benchreport.Phase {
	tb.Helper()
	before := s.versions(tb)
	inventories := logCount(tb, e.broker.Process, "edge inventory complete")
	s.sampleUsage(tb, e.edge)
	e.edge.Kill()
	start := time.Now()
	e.edge = e.startEdge(tb)
	s.waitResynced(tb, e, inventories)
	return s.restartPhase(tb, "edge-restart", time.Since(start), before)
}

// restartBroker kills the broker (kill -9) and starts it again: it lists
// kcp, the edge reconnects and sends its inventory.
func (s *benchSide) restartBroker(tb testing.TB, e *syncEnv) benchreport.Phase {
	tb.Helper()
	before := s.versions(tb)
	inventories := logCount(tb, e.broker.Process, "edge inventory complete")
	s.sampleUsage(tb, e.broker.Process)
	start := time.Now()
	if err := e.broker.Restart(context.Background(), true); err != nil {
		tb.Fatal(err)
	}
	s.waitResynced(tb, e, inventories)
	return s.restartPhase(tb, "broker-restart", time.Since(start), before)
}

func (s *benchSide) restartPhase(tb testing.TB, name string, wall time.Duration, before map[string]string) benchreport.Phase {
	tb.Helper()
	writes := len(changed(before, s.versions(tb)))
	p := benchreport.Phase{Name: name, Objects: len(before) / 2, WallSeconds: wall.Seconds(), Writes: writes}
	tb.Logf("%s %s: resynced in %.2fs, %d objects written", s.system, name, p.WallSeconds, writes)
	return p
}

// waitResynced waits until the broker logged one more complete inventory
// than inventories and its outbox is empty.
func (s *benchSide) waitResynced(tb testing.TB, e *syncEnv, inventories int) {
	tb.Helper()
	err := framework.Eventually(context.Background(), 5*time.Minute, 20*time.Millisecond, func(context.Context) (bool, string) {
		if n := logCount(tb, e.broker.Process, "edge inventory complete"); n <= inventories {
			return false, "waiting for the edge's inventory"
		}
		st := e.engineStatus(tb)
		return st.GetOutboxPending() == 0 && st.GetOutboxInFlight() == 0,
			fmt.Sprintf("%d intents pending, %d in flight", st.GetOutboxPending(), st.GetOutboxInFlight())
	})
	if err != nil {
		tb.Fatal(err)
	}
}

// logCount counts the lines of p's log file that contain substr, also those
// an earlier process of the same name wrote (a restart compares counts from
// before and after it).
func logCount(tb testing.TB, p *framework.Process, substr string) int {
	tb.Helper()
	data, err := os.ReadFile(p.LogFile)
	if err != nil {
		tb.Fatal(err)
	}
	return strings.Count(string(data), substr)
}

// benchProfiles collects pprof profiles of ferry's programs during the
// bench (FERRY_BENCH_PROFILES names the directory).
type benchProfiles struct {
	dir   string
	addrs map[string]string // program → pprof address
	wg    sync.WaitGroup
}

func (p *benchProfiles) address(tb testing.TB, program string) string {
	tb.Helper()
	port, err := framework.FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	p.addrs[program] = fmt.Sprintf("127.0.0.1:%d", port)
	return p.addrs[program]
}

// fetch saves profile (a pprof path with its query) of every program as
// <program>-<name>.pb.gz; in the background, so that CPU profiles run
// while the bench goes on.
func (p *benchProfiles) fetch(tb testing.TB, name, profile string) {
	if p == nil {
		return
	}
	for program, addr := range p.addrs {
		p.wg.Go(func() {
			resp, err := http.Get("http://" + addr + "/debug/pprof/" + profile)
			if err != nil {
				tb.Logf("profile %s of %s: %v", name, program, err)
				return
			}
			defer resp.Body.Close()
			data, err := io.ReadAll(resp.Body)
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("%s: %.200s", resp.Status, data)
			}
			if err == nil {
				err = os.WriteFile(filepath.Join(p.dir, program+"-"+name+".pb.gz"), data, 0o644)
			}
			if err != nil {
				tb.Logf("profile %s of %s: %v", name, program, err)
			}
		})
	}
}

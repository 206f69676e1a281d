package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/test/framework"
)

// shardedEnv is one broker and one edge serving an APIExport of the shared
// sharded kcp, the export bound in one consumer workspace per shard:
// ws[i] lives on kcp.Shards[i]. The broker reaches the shards' virtual
// workspace endpoints directly, at the URLs kcp lists (loopback here).
type shardedEnv struct {
	kcp *framework.ShardedKCP
	ws  scaleEnvs
	// startup is how long the environment took to set up, the sharded
	// kcp's start excluded.
	startup time.Duration
}

func newShardedEnv(t testing.TB, group, kind, plural string, brokerArgs ...string) *shardedEnv {
	t.Helper()
	return newShardedEnvArgs(t, brokerArgs, nil, nil, group, kind, plural)
}

// newShardedEnvArgs is newShardedEnv with extra flags for the edge too;
// with via set, the edge dials via(the broker's address) instead.
func newShardedEnvArgs(t testing.TB, brokerArgs, edgeArgs []string, via func(brokerAddress string) string, group, kind, plural string) *shardedEnv {
	t.Helper()
	k, provider := env.sharded.get(t)
	start := time.Now()
	ctx := context.Background()
	p := &pubEnv{label: sanitize(t.Name()), path: provider, kcpConfig: k.Config, edgeArgs: edgeArgs}
	if len(p.label) > 63 {
		p.label = p.label[:63]
	}
	p.export = config.APIExportRef{Workspace: provider.String(), Name: sanitize(t.Name()) + ".e2e.ferry.dev"}
	if err := framework.CreateAPIExport(ctx, k.Config, provider, p.export.Name); err != nil {
		t.Fatal(err)
	}
	p.pki = newPKI(t, "pki", "edge", "admin")
	dir := testDir(t)
	b, err := framework.StartBroker(ctx, env.bins, framework.BrokerOptions{
		Dir: dir, LogDir: dir, PKIDir: p.pki, KCPKubeconfig: k.Kubeconfig, ExtraArgs: brokerArgs,
		Config: config.Config{
			Edges:  []config.Edge{{Identity: devpki.IdentityFor("edge"), APIExport: p.export}},
			Admins: []string{devpki.IdentityFor("admin")},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopChecked(t, b.Process) })
	p.broker = b
	if via != nil {
		p.edgeDial = via(b.Address)
	}
	if p.kcp, err = framework.KCPClient(k.Config); err != nil {
		t.Fatal(err)
	}
	p.edge = p.startEdge(t)
	if _, err := framework.WaitEdgeState(ctx, adminConn(t, b, p.pki), devpki.IdentityFor("edge"),
		ferryv1.EdgeState_EDGE_STATE_CONNECTED, time.Minute); err != nil {
		t.Fatal(err)
	}
	crd := testCRD(group, kind, plural, apiextensionsv1.NamespaceScoped, "v1")
	apply(t, crd)
	p.publish(t, plural, ferryv1alpha1.PublishedResourceSpec{Resource: ferryv1alpha1.SourceResource{
		APIGroup: group, Kind: kind, Version: "v1",
	}})
	template := publishedSyncEnv(t, p, crd)

	se := &shardedEnv{kcp: k}
	for _, shard := range k.Shards {
		name := strings.TrimRight((shard.Name + "-" + p.label)[:min(63, len(shard.Name)+1+len(p.label))], "-")
		consumer, err := framework.CreateWorkspaceOn(ctx, k.Config, "root", name, map[string]string{"region": shard.Region})
		if err != nil {
			t.Fatal(err)
		}
		// The test means nothing unless kcp put each workspace where asked.
		on, err := k.WorkspaceShard(ctx, consumer)
		if err != nil {
			t.Fatal(err)
		}
		if on != shard.Name {
			t.Fatalf("workspace %s was scheduled on shard %s, want %s", consumer, on, shard.Name)
		}
		if err := framework.BindAPIExport(ctx, k.Config, consumer, provider, p.export.Name); err != nil {
			t.Fatal(err)
		}
		e := *template // shares the broker and the edge
		e.useConsumer(t, consumer)
		se.ws = append(se.ws, &e)
	}
	se.startup = time.Since(start)
	return se
}

// endpoints waits until the APIExportEndpointSlice lists one virtual
// workspace endpoint per shard (kcp adds a shard's once a workspace on it
// binds the export) and returns them by shard name.
func (se *shardedEnv) endpoints(t testing.TB) map[string]string {
	t.Helper()
	p := se.ws[0].pubEnv
	var byShard map[string]string
	err := framework.Eventually(context.Background(), time.Minute, 250*time.Millisecond, func(ctx context.Context) (bool, string) {
		slice, err := p.kcp.Cluster(p.path).ApisV1alpha1().APIExportEndpointSlices().Get(ctx, p.export.Name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		var urls []string
		byShard = map[string]string{}
		for _, ep := range slice.Status.APIExportEndpoints {
			urls = append(urls, ep.URL)
			for _, s := range se.kcp.Shards {
				if strings.HasPrefix(ep.URL, s.URL+"/") {
					byShard[s.Name] = ep.URL
				}
			}
		}
		return len(byShard) == len(se.kcp.Shards) && len(urls) == len(byShard),
			fmt.Sprintf("the APIExportEndpointSlice lists %q; want one endpoint on each shard's URL", urls)
	})
	if err != nil {
		t.Fatal(err)
	}
	return byShard
}

// waitEach waits until check holds for every workspace; the failure
// names each shard's workspace with what check said about it.
func (se *shardedEnv) waitEach(t testing.TB, timeout time.Duration, check func(ctx context.Context, e *syncEnv) (bool, string)) {
	t.Helper()
	err := framework.Eventually(context.Background(), timeout, 500*time.Millisecond, func(ctx context.Context) (bool, string) {
		var states []string
		done := true
		for i, e := range se.ws {
			ok, state := check(ctx, e)
			done = done && ok
			states = append(states, fmt.Sprintf("workspace %s on shard %s (logical cluster %s): %s", e.consumer, se.kcp.Shards[i].Name, e.consumerLC, state))
		}
		return done, strings.Join(states, "; ")
	})
	if err != nil {
		t.Fatal(err)
	}
}

// waitConverged waits until the local copies of every workspace are
// exactly want (name → spec.fieldV1).
func (se *shardedEnv) waitConverged(t testing.TB, timeout time.Duration, want map[string]string) {
	t.Helper()
	se.waitEach(t, timeout, func(_ context.Context, e *syncEnv) (bool, string) {
		return converged(e.localState(t), want)
	})
}

// remoteCount counts the kcp objects of e (namespace default) for which
// ok holds, and all of them.
func remoteCount(ctx context.Context, e *syncEnv, ok func(u *unstructured.Unstructured) bool) (matching, all int, err error) {
	list, err := e.remote.Namespace("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		return 0, 0, err
	}
	for i := range list.Items {
		if ok(&list.Items[i]) {
			matching++
		}
	}
	return matching, len(list.Items), nil
}

// waitRemoteEach waits until, in every workspace, want kcp objects satisfy
// ok (what describes ok for the failure message).
func (se *shardedEnv) waitRemoteEach(t testing.TB, timeout time.Duration, want int, what string, ok func(u *unstructured.Unstructured) bool) {
	t.Helper()
	se.waitEach(t, timeout, func(ctx context.Context, e *syncEnv) (bool, string) {
		n, all, err := remoteCount(ctx, e, ok)
		if err != nil {
			return false, err.Error()
		}
		return n == want, fmt.Sprintf("%d of %d kcp objects %s, want %d", n, all, what, want)
	})
}

func hasBrokerFinalizer(u *unstructured.Unstructured) bool {
	return slices.Contains(u.GetFinalizers(), brokerFinalizer)
}

func statusPhase(u *unstructured.Unstructured) string {
	phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
	return phase
}

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/test/framework"
)

// TestEdgeRidesOutAPIServerOutage stops the service cluster's kube-apiserver
// for longer than the edge's renew deadline: the edge loses its Lease but
// stays up, and once the API server is back it leads again and applies a
// change made in kcp during the outage — in the same process.
func TestEdgeRidesOutAPIServerOutage(t *testing.T) {
	const (
		outage   = 60 * time.Second
		catchUp  = 10 * time.Second
		edgeName = "edge-outage"
	)
	ctx := context.Background()
	dir := testDir(t)

	// Its own service cluster: the test stops its API server, which the
	// other tests' edges share otherwise.
	svc, err := framework.StartServiceCluster(ctx, env.bins, "outage", filepath.Join(dir, "service"), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := svc.Stop(); err != nil {
			t.Errorf("stopping the service cluster: %v", err)
		}
	})

	pki, export, broker := brokerFor(t)
	// The edge's defaults (lease 15s, renew deadline 10s, retry 2s): the
	// outage is several renew deadlines long.
	o := framework.EdgeOptionsFor(pki, "edge")
	o.Name, o.LogDir, o.BrokerAddress, o.Kubeconfig = edgeName, dir, broker.Address, svc.Kubeconfig
	o.ExtraArgs = []string{"--heartbeat-interval", "1s", "--leader-elect"}
	edge, err := framework.StartEdge(env.bins, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopChecked(t, edge) })
	// Connected implies the edge installed the PublishedResource CRD.
	if _, err := framework.WaitEdgeState(ctx, adminConn(t, broker, pki), devpki.IdentityFor("edge"),
		ferryv1.EdgeState_EDGE_STATE_CONNECTED, time.Minute); err != nil {
		t.Fatal(err)
	}

	// Publish one CRD, bind it in a consumer workspace.
	crd := testCRD("outage.example.com", "Barge", "barges", apiextensionsv1.NamespaceScoped, "v1")
	applyTo(t, svc, crd)
	applyTo(t, svc, &ferryv1alpha1.PublishedResource{
		TypeMeta:   metav1.TypeMeta{APIVersion: "ferry.dev/v1alpha1", Kind: "PublishedResource"},
		ObjectMeta: metav1.ObjectMeta{Name: "barges"},
		Spec: ferryv1alpha1.PublishedResourceSpec{Resource: ferryv1alpha1.SourceResource{
			APIGroup: crd.Spec.Group, Kind: crd.Spec.Names.Kind, Version: "v1",
		}},
	})
	pr, err := framework.WaitPublishedCondition(ctx, svc.Config, "barges", metav1.ConditionTrue, ferryv1alpha1.ReasonPublished, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	kcpClient, err := framework.KCPClient(env.kcp.Config)
	if err != nil {
		t.Fatal(err)
	}
	e := &syncEnv{pubEnv: &pubEnv{export: export, broker: broker, edge: edge, label: sanitize(t.Name()), kcp: kcpClient, path: env.provider, pki: pki}}
	served, version, _ := strings.Cut(pr.Status.ServedResource, "/") // "<resource>.<group>/<version>"
	resource, group, _ := strings.Cut(served, ".")
	e.remoteGVR = schema.GroupVersionResource{Group: group, Version: version, Resource: resource}
	e.remoteKind = pr.Status.ProjectedKind
	e.localGVR = schema.GroupVersionResource{Group: crd.Spec.Group, Version: "v1", Resource: crd.Spec.Names.Plural}
	svcDyn, err := dynamic.NewForConfig(svc.Config)
	if err != nil {
		t.Fatal(err)
	}
	e.local = svcDyn.Resource(e.localGVR)
	e.useConsumer(t, bindConsumer(t, e.pubEnv, "c"))

	e.createRemote(t, "default", "cargo", map[string]any{"fieldV1": "before"})
	e.waitLocal(t, "default", "cargo", fieldV1Is("before"))
	pid := processOf(t, edgeName)

	// The outage. kcp and the broker stay up. The change is made as soon as
	// the API server stops serving, while the edge still leads: its engine
	// fails to apply it, then the lease runs out, and the next incarnation
	// must still deliver it.
	down := time.Now()
	stopped := make(chan error, 1)
	go func() { stopped <- svc.StopAPIServer() }()
	err = framework.Eventually(ctx, 30*time.Second, 50*time.Millisecond, func(ctx context.Context) (bool, string) {
		_, err := e.local.List(ctx, metav1.ListOptions{Limit: 1})
		return err != nil, "kube-apiserver still serving"
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kube-apiserver stopped serving %s after SIGTERM; outage of %s", time.Since(down).Round(time.Millisecond), outage)
	remote, err := e.remote.Namespace("default").Get(ctx, "cargo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(remote.Object, "during-outage", "spec", "fieldV1")
	if _, err := e.remote.Namespace("default").Update(ctx, remote, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	// The lease runs out after the renew deadline; the edge says so and stays.
	waitLog(t, edge, outage-time.Since(down), "lost the leader election lease", "starts a new incarnation")
	t.Logf("the edge had lost its lease by %s into the outage", time.Since(down).Round(time.Second))
	time.Sleep(outage - time.Since(down))
	assertRunning(t, edge)

	if err := svc.StartAPIServer(ctx); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	t.Logf("kube-apiserver ready again after an outage of %s", back.Sub(down).Round(time.Second))
	assertRunning(t, edge)
	e.waitLocal(t, "default", "cargo", fieldV1Is("during-outage"))
	took := time.Since(back)
	t.Logf("the local copy showed the change made during the outage %s after the API server was ready", took.Round(time.Millisecond))
	if took > catchUp {
		t.Errorf("the edge took %s to catch up after the API server returned, want at most %s", took.Round(time.Millisecond), catchUp)
	}

	// Same process throughout: same PID and start time, and one "starting"
	// line in its log (the log file is appended to across restarts).
	assertRunning(t, edge)
	if got := processOf(t, edgeName); got != pid {
		t.Errorf("the edge is process %s now, was %s before the outage", got, pid)
	}
	waitLogCount(t, edge, 10*time.Second, 2, "leading: connecting to the broker")
	data, err := os.ReadFile(edge.LogFile)
	if err != nil {
		t.Fatal(err)
	}
	starts := 0
	for _, line := range strings.Split(string(data), "\n") {
		if containsAll(line, []string{"starting", "version", "broker"}) {
			starts++
		}
	}
	if starts != 1 {
		t.Errorf("the edge's log has %d start lines, want 1 (log %s)", starts, edge.LogFile)
	}
}

func fieldV1Is(want string) func(*unstructured.Unstructured) (bool, string) {
	return func(u *unstructured.Unstructured) (bool, string) {
		v, _ := specField(u, "fieldV1")
		return v == want, "spec.fieldV1 = " + v
	}
}

// applyTo server-side-applies a typed object to svc (apply targets the
// shared service cluster).
func applyTo(t testing.TB, svc *framework.ServiceCluster, obj runtime.Object) {
	t.Helper()
	u, err := framework.ToUnstructured(obj)
	if err != nil {
		t.Fatal(err)
	}
	if err := framework.Apply(context.Background(), svc.Config, u); err != nil {
		t.Fatal(err)
	}
}

func assertRunning(t testing.TB, p *framework.Process) {
	t.Helper()
	select {
	case <-p.Exited():
		t.Fatalf("%s exited: %v (log %s)", p.Name, p.ExitErr(), p.LogFile)
	default:
	}
}

// processOf finds the child process of this test binary that runs the edge
// called agent and returns its PID and start time (together they name one
// process: a PID alone can be reused). The framework keeps the PID to
// itself; the kernel's process table is the independent witness anyway.
func processOf(t testing.TB, agent string) string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	want := []byte("\x00--agent-name\x00" + agent + "\x00")
	var found []string
	for _, d := range entries {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", d.Name(), "stat"))
		if err != nil {
			continue // exited meanwhile
		}
		// Fields after the command name, which may contain spaces: state,
		// ppid, ... starttime is field 22 of the whole line.
		i := bytes.LastIndexByte(stat, ')')
		if i < 0 {
			continue
		}
		fields := strings.Fields(string(stat[i+1:]))
		if len(fields) < 20 || fields[1] != strconv.Itoa(os.Getpid()) {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, want) {
			continue
		}
		found = append(found, fmt.Sprintf("pid %s started at tick %s", d.Name(), fields[19]))
	}
	if len(found) != 1 {
		t.Fatalf("%d processes run edge %s: %v", len(found), agent, found)
	}
	return found[0]
}

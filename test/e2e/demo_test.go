package e2e

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/test/framework"
)

// TestDemoSurvivesKill is issue 12's acceptance on make demo's program: with
// the demo running, kill -9 of the edge (then of the broker) is survived: the
// supervisor starts the process again, and an object created in kcp while it
// was down reaches the service cluster. The demo brings its own kcp and
// service cluster (on free ports, beside the suite's).
func TestDemoSurvivesKill(t *testing.T) {
	if env.bins.Demo == "" {
		t.Fatal("the demo binary is not built (make build-race builds it)")
	}
	if _, err := os.Stat(env.bins.Demo); err != nil {
		t.Fatalf("the demo binary: %v (make build-race builds it)", err)
	}
	root, err := filepath.Abs(filepath.Join("..", "..")) // the demo reads deploy/examples from the repository root
	if err != nil {
		t.Fatal(err)
	}
	logDir := testDir(t)
	dir, err := filepath.Abs(filepath.Join(logDir, "demo")) // wiped by the demo at start
	if err != nil {
		t.Fatal(err)
	}
	demo, err := framework.StartProcessIn(root, "demo", env.bins.Demo, []string{"--dir", dir}, nil, logDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = demo.Stop(2 * time.Minute) // at once when the test stopped it already
		if !t.Failed() {
			// Keep the logs; drop the servers' data.
			_ = os.RemoveAll(filepath.Join(dir, "kcp"))
			_ = os.RemoveAll(filepath.Join(dir, "service"))
		}
	})
	waitDemoLine(t, demo, 5*time.Minute, "ferry demo is running")

	vars := readDemoEnv(t, filepath.Join(dir, "env"))
	kcpCfg, err := clientcmd.BuildConfigFromFlags("", vars["KCP_KUBECONFIG"])
	if err != nil {
		t.Fatal(err)
	}
	kcpCfg.Host = vars["KCP_SERVER"] + "/clusters/" + vars["OBJ_WORKSPACE"]
	kcpDyn, err := dynamic.NewForConfig(kcpCfg)
	if err != nil {
		t.Fatal(err)
	}
	svcCfg, err := clientcmd.BuildConfigFromFlags("", vars["SERVICE_KUBECONFIG"])
	if err != nil {
		t.Fatal(err)
	}
	svcDyn, err := dynamic.NewForConfig(svcCfg)
	if err != nil {
		t.Fatal(err)
	}
	example, err := os.ReadFile(filepath.Join(root, "deploy", "examples", "database-object.yaml"))
	if err != nil {
		t.Fatal(err)
	}

	type ferryProc struct {
		program string
		pid     int
	}
	var seen []ferryProc // every ferry process seen: none may outlive the demo
	for _, c := range []struct{ program, pidFile, object string }{
		{"ferry-edge", vars["EDGE_PIDFILE"], "payments"},
		{"ferry-broker", vars["BROKER_PIDFILE"], "invoices"},
	} {
		old := readPid(t, c.pidFile)
		if !ferryRunning(old, c.program) {
			t.Fatalf("%s (pid %d from %s) is not running", c.program, old, c.pidFile)
		}
		if err := syscall.Kill(old, syscall.SIGKILL); err != nil {
			t.Fatalf("kill -9 %s (pid %d): %v", c.program, old, err)
		}
		t.Logf("killed %s (pid %d); creating ManagedDatabase default/%s in %s", c.program, old, c.object, vars["OBJ_WORKSPACE"])
		createDemoObject(t, kcpDyn, example, c.object)

		var restarted int
		err := framework.Eventually(context.Background(), 30*time.Second, 100*time.Millisecond, func(context.Context) (bool, string) {
			data, err := os.ReadFile(c.pidFile)
			if err != nil {
				return false, err.Error()
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
			if err != nil {
				return false, fmt.Sprintf("%s: %v", c.pidFile, err)
			}
			if pid == old {
				return false, fmt.Sprintf("%s still names the killed pid %d", c.pidFile, old)
			}
			if !ferryRunning(pid, c.program) {
				return false, fmt.Sprintf("%s names pid %d, which is not a running %s", c.pidFile, pid, c.program)
			}
			restarted = pid
			return true, ""
		})
		if err != nil {
			t.Fatalf("%s was not restarted: %v (log %s)", c.program, err, demo.LogFile)
		}
		seen = append(seen, ferryProc{c.program, old}, ferryProc{c.program, restarted})
		waitDemoLine(t, demo, 10*time.Second, fmt.Sprintf("==> %s (pid %d) was killed by signal: killed after", c.program, old))
		waitDemoLine(t, demo, 10*time.Second, fmt.Sprintf("==> %s restarted (pid %d)", c.program, restarted))

		gvr := schema.GroupVersionResource{Group: "demo.example.com", Version: "v1", Resource: "databases"}
		var why string // the last reason, not the deadline's
		err = framework.Eventually(context.Background(), time.Minute, 200*time.Millisecond, func(ctx context.Context) (bool, string) {
			list, err := svcDyn.Resource(gvr).List(ctx, metav1.ListOptions{})
			if err != nil {
				if ctx.Err() == nil || why == "" {
					why = "listing Databases in the service cluster: " + err.Error()
				}
				return false, why
			}
			for _, db := range list.Items {
				a := db.GetAnnotations()
				if db.GetLabels()[naming.LabelRemoteCluster] == vars["OBJ_CLUSTER"] &&
					a[naming.AnnotationNamespace] == "default" && a[naming.AnnotationName] == c.object {
					t.Logf("%s synced as Database %s/%s", c.object, db.GetNamespace(), db.GetName())
					return true, ""
				}
			}
			why = fmt.Sprintf("none of the %d Databases in the service cluster is the copy of %s|default/%s", len(list.Items), vars["OBJ_CLUSTER"], c.object)
			return false, why
		})
		if err != nil {
			t.Fatalf("default/%s, created while %s was down, was not synced: %v (logs in %s)", c.object, c.program, err, filepath.Join(dir, "logs"))
		}
	}

	// Ctrl-C: the demo stops everything and exits 0.
	if err := demo.Stop(2 * time.Minute); err != nil {
		t.Fatalf("the demo did not stop on SIGTERM: %v (log %s)", err, demo.LogFile)
	}
	if err := demo.ExitErr(); err != nil {
		t.Errorf("the demo did not exit 0 on SIGTERM: %v (log %s)", err, demo.LogFile)
	}
	for _, p := range seen {
		if ferryRunning(p.pid, p.program) {
			t.Errorf("%s (pid %d) outlived the demo", p.program, p.pid)
		}
	}
	for _, f := range []string{vars["EDGE_PIDFILE"], vars["BROKER_PIDFILE"]} {
		if _, err := os.Stat(f); !os.IsNotExist(err) {
			t.Errorf("pid file %s not removed when the demo stopped (%v)", f, err)
		}
	}
	logs, _ := filepath.Glob(filepath.Join(dir, "logs", "*.log"))
	for _, f := range append(logs, demo.LogFile) {
		if data, err := os.ReadFile(f); err == nil && strings.Contains(string(data), "WARNING: DATA RACE") {
			t.Errorf("%s reports a data race", f)
		}
	}
}

// waitDemoLine waits until the demo's log has a line containing substr;
// it fails at once when the demo exits.
func waitDemoLine(t *testing.T, demo *framework.Process, timeout time.Duration, substr string) {
	t.Helper()
	err := framework.Eventually(context.Background(), timeout, 200*time.Millisecond, func(context.Context) (bool, string) {
		data, err := os.ReadFile(demo.LogFile)
		if err != nil {
			return false, err.Error()
		}
		if strings.Contains(string(data), substr) {
			return true, ""
		}
		select {
		case <-demo.Exited():
			t.Fatalf("the demo exited (%v) before printing %q (log %s)", demo.ExitErr(), substr, demo.LogFile)
		default:
		}
		return false, fmt.Sprintf("no line of %s contains %q", demo.LogFile, substr)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// readDemoEnv reads the demo's env file: lines `export NAME="value"`.
func readDemoEnv(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	vars := map[string]string{}
	s := bufio.NewScanner(f)
	for s.Scan() {
		name, value, ok := strings.Cut(strings.TrimPrefix(s.Text(), "export "), "=")
		if !ok || strings.HasPrefix(name, "#") {
			continue
		}
		if v, err := strconv.Unquote(value); err == nil {
			value = v
		}
		vars[name] = value
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"KCP_KUBECONFIG", "KCP_SERVER", "SERVICE_KUBECONFIG", "OBJ_WORKSPACE", "OBJ_CLUSTER", "EDGE_PIDFILE", "BROKER_PIDFILE"} {
		if vars[name] == "" {
			t.Fatalf("%s does not set %s", path, name)
		}
	}
	return vars
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return pid
}

// ferryRunning tells whether pid is a live process whose command line
// contains program (false for a zombie, whose command line is empty, and
// for an unrelated process that got the pid again).
func ferryRunning(pid int, program string) bool {
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	return err == nil && strings.Contains(string(cmdline), program)
}

// createDemoObject creates the README's example ManagedDatabase with
// "orders" replaced by name in the demo's consumer workspace.
func createDemoObject(t *testing.T, dyn dynamic.Interface, example []byte, name string) {
	t.Helper()
	objs, err := framework.DecodeYAML(strings.NewReader(strings.ReplaceAll(string(example), "orders", name)))
	if err != nil || len(objs) != 1 {
		t.Fatalf("the example object: %v (%d objects)", err, len(objs))
	}
	gvr := schema.GroupVersionResource{Group: "demo.ferry.dev", Version: "v1", Resource: "manageddatabases"}
	if _, err := dyn.Resource(gvr).Namespace(objs[0].GetNamespace()).Create(context.Background(), objs[0], metav1.CreateOptions{}); err != nil {
		t.Fatalf("cannot create ManagedDatabase %s: %v", name, err)
	}
}

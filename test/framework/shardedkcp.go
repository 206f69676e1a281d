package framework

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/kcp-dev/logicalcluster/v3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// kcp's sharded-test-server listens on fixed loopback ports: the front-proxy
// on 6443, shard n on 6444+n with its embedded etcd on 2379+2n and 2380+2n,
// the cache server on 8012 with its etcd on 8010 and 8011. Only one sharded
// kcp can run on a machine at a time.
const (
	shardedFrontProxyPort = 6443
	shardedFirstShardPort = 6444
)

// shardedFixedPorts lists every port sharded-test-server binds for shards
// shards, so that a busy one fails the start with a clear message instead of
// a shard crashing deep in its log.
func shardedFixedPorts(shards int) []int {
	ports := []int{shardedFrontProxyPort, 8010, 8011, 8012}
	for n := range shards {
		ports = append(ports, shardedFirstShardPort+n, 2379+2*n, 2380+2*n)
	}
	return ports
}

// ShardedKCP is a kcp of several shards run by kcp's sharded-test-server: a
// cache server, the root shard, shards "shard-1"…, and the front-proxy in
// front of them, each its own process in sharded-test-server's process
// group.
type ShardedKCP struct {
	*Process
	// Dir is sharded-test-server's work directory (its .kcp* directories).
	Dir string
	// LogDir holds each component's log (kcp-0.log, kcp-1.log,
	// kcp-cache.log, kcp-front-proxy.log) and sharded-test-server's own.
	LogDir string
	// Kubeconfig is the front-proxy's admin kubeconfig (client certificate
	// of kcp-admin, valid for the life of Dir); its current context is the
	// root workspace.
	Kubeconfig string
	// Config is a rest config for the root workspace through the
	// front-proxy.
	Config *rest.Config
	// Shards are the shards in start order; the first is the root shard.
	Shards []KCPShard
}

// KCPShard is one shard of a ShardedKCP.
type KCPShard struct {
	// Name is the Shard object's name: "root", "shard-1", …
	Name string
	// URL is the shard's own base URL (it serves its virtual workspaces
	// there too), reachable only on this machine.
	URL string
	// Region is the value of the shard's "region" label, which a
	// Workspace's location selector uses to schedule onto it.
	Region string
}

// shardRegions are the "region" labels sharded-test-server puts on its
// shards, in shard order.
var shardRegions = [...]string{"us-east-2", "us-east-1", "us-west-1", "us-west-2"}

// ShardedBinaries are the kcp programs a sharded kcp runs, all in one
// directory (make tools builds them into FERRY_KCP_BIN_DIR).
func ShardedBinaries(dir string) (map[string]string, error) {
	if dir == "" {
		return nil, errors.New("FERRY_KCP_BIN_DIR is not set: run the sharded kcp tests through make (make test-e2e-current), which builds kcp's sharded-test-server, front-proxy and cache server and exports it")
	}
	bins := map[string]string{}
	for _, name := range []string{"sharded-test-server", "kcp", "kcp-front-proxy", "cache-server"} {
		path := filepath.Join(dir, name)
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("FERRY_KCP_BIN_DIR: %w (make tools builds it)", err)
		}
		bins[name] = path
	}
	return bins, nil
}

// StartShardedKCP starts a kcp of shards shards (the root shard and
// shards-1 more) with sharded-test-server from binDir, its state in dir
// and its logs in logDir, and waits until the front-proxy is ready.
func StartShardedKCP(ctx context.Context, binDir, dir, logDir string, shards int) (*ShardedKCP, error) {
	if shards < 1 || shards > len(shardRegions) {
		return nil, fmt.Errorf("a sharded kcp of %d shards is not supported (1 to %d)", shards, len(shardRegions))
	}
	bins, err := ShardedBinaries(binDir)
	if err != nil {
		return nil, err
	}
	for _, port := range shardedFixedPorts(shards) {
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			return nil, fmt.Errorf("sharded kcp needs loopback port %d, which is in use (another sharded kcp, or one left over by a killed test run?): %w", port, err)
		}
		l.Close()
	}
	dir, err = filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// With NO_GORUN, kcp's test server runs the binaries these variables
	// name instead of "go run ./cmd/...".
	env := []string{
		"NO_GORUN=1",
		"KCP_ASSET_KCP=" + bins["kcp"],
		"KCP_ASSET_KCP_FRONT_PROXY=" + bins["kcp-front-proxy"],
		"KCP_ASSET_CACHE_SERVER=" + bins["cache-server"],
	}
	proc, err := StartProcessIn(dir, "sharded-kcp", bins["sharded-test-server"], []string{
		"--number-of-shards=" + strconv.Itoa(shards),
		"--work-dir-path=" + dir,
		"--log-dir-path=" + logDir,
		// The components' logs go to their files in logDir only.
		"--quiet",
	}, env, logDir)
	if err != nil {
		return nil, err
	}
	k := &ShardedKCP{Process: proc, Dir: dir, LogDir: logDir, Kubeconfig: filepath.Join(dir, ".kcp", "admin.kubeconfig")}
	for n := range shards {
		name := "root"
		if n > 0 {
			name = "shard-" + strconv.Itoa(n)
		}
		k.Shards = append(k.Shards, KCPShard{
			Name: name, URL: "https://127.0.0.1:" + strconv.Itoa(shardedFirstShardPort+n), Region: shardRegions[n],
		})
	}
	ready := filepath.Join(dir, ".kcp", "ready-to-test")
	err = Eventually(ctx, 5*time.Minute, 500*time.Millisecond, func(ctx context.Context) (bool, string) {
		select {
		case <-proc.Exited():
			return false, fmt.Sprintf("sharded-test-server exited: %v (logs in %s)", proc.ExitErr(), logDir)
		default:
		}
		// The test server labels the shards (for scheduling) after the
		// front-proxy is up, and then writes ready-to-test.
		if _, err := os.Stat(ready); err != nil {
			return false, "no " + ready + " yet"
		}
		if k.Config == nil {
			cfg, err := bulkConfig(k.Kubeconfig)
			if err != nil {
				return false, err.Error()
			}
			k.Config = cfg
		}
		return readyz(ctx, k.Config)
	})
	if err != nil {
		_ = k.Stop(30 * time.Second)
		return nil, fmt.Errorf("sharded kcp did not become ready (logs in %s): %w", logDir, err)
	}
	return k, nil
}

// Shard returns the shard called name.
func (k *ShardedKCP) Shard(name string) (KCPShard, error) {
	for _, s := range k.Shards {
		if s.Name == name {
			return s, nil
		}
	}
	return KCPShard{}, fmt.Errorf("sharded kcp has no shard %q", name)
}

// ShardConfig is a rest config for shard name's own URL (not the
// front-proxy's) as the shard's admin: the front-proxy's kcp-admin may not
// read every workspace on a shard directly. Each shard writes its admin
// kubeconfig into its root directory.
func (k *ShardedKCP) ShardConfig(name string) (*rest.Config, error) {
	for n, s := range k.Shards {
		if s.Name != name {
			continue
		}
		path := filepath.Join(k.Dir, ".kcp-"+strconv.Itoa(n), "admin.kubeconfig")
		cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: path},
			&clientcmd.ConfigOverrides{CurrentContext: "shard-base"},
		).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("shard %s's admin kubeconfig: %w", name, err)
		}
		return cfg, nil
	}
	return nil, fmt.Errorf("sharded kcp has no shard %q", name)
}

// FreezeShard makes shard name unreachable while the other shards, the
// cache server and the front-proxy keep running: it stops the shard's kcp
// process (SIGSTOP) with its embedded etcd.
//
// Why SIGSTOP and not stopping the process: sharded-test-server ends the
// whole setup as soon as one shard process exits, and its components log
// through pipes into it, so it can be neither told to tolerate an exit nor
// paused itself. A frozen shard is a hung or partitioned shard: the kernel
// still accepts TCP connections to its port, but no request, TLS handshake
// or HTTP/2 ping is answered, so clients notice through their timeouts
// rather than through a refused connection. ThawShard resumes it with all
// its state, as a shard coming back would.
func (k *ShardedKCP) FreezeShard(name string) error {
	return k.signalShard(name, syscall.SIGSTOP)
}

// ThawShard resumes a shard FreezeShard stopped (SIGCONT).
func (k *ShardedKCP) ThawShard(name string) error {
	return k.signalShard(name, syscall.SIGCONT)
}

func (k *ShardedKCP) signalShard(name string, sig syscall.Signal) error {
	if _, err := k.Shard(name); err != nil {
		return err
	}
	pid, err := childWithArg(k.Pid(), "--shard-name="+name)
	if err != nil {
		return fmt.Errorf("cannot find shard %s's process: %w", name, err)
	}
	if err := syscall.Kill(pid, sig); err != nil {
		return fmt.Errorf("cannot send %s to shard %s (pid %d): %w", sig, name, pid, err)
	}
	return nil
}

// Stop resumes any frozen shard (a stopped process would not act on
// SIGTERM), then stops sharded-test-server and its components: SIGTERM to
// the process group, SIGKILL after grace.
func (k *ShardedKCP) Stop(grace time.Duration) error {
	select {
	case <-k.Exited():
		return k.ExitErr()
	default:
	}
	_ = k.Signal(syscall.SIGCONT)
	return k.Process.Stop(grace)
}

// WorkspaceShard returns the name of the shard that holds the workspace at
// path: the one shard that serves its LogicalCluster when asked directly.
func (k *ShardedKCP) WorkspaceShard(ctx context.Context, path logicalcluster.Path) (string, error) {
	client, err := KCPClient(k.Config)
	if err != nil {
		return "", err
	}
	lc, err := client.Cluster(path).CoreV1alpha1().LogicalClusters().Get(ctx, "cluster", metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("cannot read workspace %s: %w", path, err)
	}
	cluster := logicalcluster.From(lc).Path()
	var on []string
	for _, s := range k.Shards {
		cfg, err := k.ShardConfig(s.Name)
		if err != nil {
			return "", err
		}
		shardClient, err := KCPClient(cfg)
		if err != nil {
			return "", err
		}
		_, err = shardClient.Cluster(cluster).CoreV1alpha1().LogicalClusters().Get(ctx, "cluster", metav1.GetOptions{})
		switch {
		case err == nil:
			on = append(on, s.Name)
		case !apierrors.IsNotFound(err):
			return "", fmt.Errorf("cannot ask shard %s for logical cluster %s: %w", s.Name, cluster, err)
		}
	}
	if len(on) != 1 {
		return "", fmt.Errorf("workspace %s (logical cluster %s) is on shards %v, want exactly one", path, cluster, on)
	}
	return on[0], nil
}

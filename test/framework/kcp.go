package framework

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ferry-dev/ferry/broker/kcp"
)

// KCP is a running kcp server.
type KCP struct {
	*Process
	// Kubeconfig is kcp's admin kubeconfig; its current context points at
	// the root workspace. Its token changes when kcp restarts (Crash
	// reloads Config).
	Kubeconfig string
	// StableKubeconfig points at the root workspace as kcp's shard admin,
	// whose token survives a restart: for processes that read their
	// kubeconfig once (the brokers).
	StableKubeconfig string
	// Config is a rest config for the root workspace.
	Config *rest.Config
}

// StartKCP starts kcp with its data in dir and waits until it is ready.
func StartKCP(ctx context.Context, bin, dir, logDir string) (*KCP, error) {
	var ports [3]int
	for i := range ports {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	proc, err := StartProcess("kcp", bin, []string{
		"start",
		"--root-directory", dir,
		"--bind-address", "127.0.0.1",
		"--secure-port", strconv.Itoa(ports[0]),
		"--embedded-etcd-client-port", strconv.Itoa(ports[1]),
		"--embedded-etcd-peer-port", strconv.Itoa(ports[2]),
	}, nil, logDir)
	if err != nil {
		return nil, err
	}
	k := &KCP{Process: proc, Kubeconfig: filepath.Join(dir, "admin.kubeconfig"), StableKubeconfig: filepath.Join(dir, "shard-admin.kubeconfig")}
	err = Eventually(ctx, 3*time.Minute, 500*time.Millisecond, func(ctx context.Context) (bool, string) {
		select {
		case <-proc.Exited():
			return false, fmt.Sprintf("kcp exited: %v (log: %s)", proc.ExitErr(), proc.LogFile)
		default:
		}
		if k.Config == nil {
			if err := writeStableKubeconfig(k.Kubeconfig, k.StableKubeconfig); err != nil {
				return false, "admin kubeconfig not written yet: " + err.Error()
			}
			cfg, err := bulkConfig(k.Kubeconfig)
			if err != nil {
				return false, err.Error()
			}
			k.Config = cfg
		}
		return readyz(ctx, k.Config)
	})
	if err != nil {
		_ = proc.Stop(10 * time.Second)
		return nil, fmt.Errorf("kcp did not become ready (log %s): %w", proc.LogFile, err)
	}
	return k, nil
}

// writeStableKubeconfig writes to path a kubeconfig for kcp's root
// workspace that survives a kcp restart: kcp issues a new token for its
// "kcp-admin" user on every start, while the "shard-admin" token (kept
// hashed in the root directory) stays valid.
func writeStableKubeconfig(adminKubeconfig, path string) error {
	kc, err := clientcmd.LoadFromFile(adminKubeconfig)
	if err != nil {
		return err
	}
	root, ok := kc.Contexts["root"]
	if !ok {
		return fmt.Errorf("%s has no context root", adminKubeconfig)
	}
	if _, ok := kc.AuthInfos["shard-admin"]; !ok {
		return fmt.Errorf("%s has no user shard-admin", adminKubeconfig)
	}
	root.AuthInfo = "shard-admin"
	kc.CurrentContext = "root"
	return clientcmd.WriteToFile(*kc, path)
}

// readyz reports whether the API server behind cfg answers /readyz with ok.
func readyz(ctx context.Context, cfg *rest.Config) (bool, string) {
	c := rest.CopyConfig(cfg)
	c.Timeout = 5 * time.Second
	host, err := kcp.BaseHost(c.Host) // /readyz lives outside /clusters/...
	if err != nil {
		return false, err.Error()
	}
	c.Host = host
	client, err := rest.UnversionedRESTClientFor(withCodec(c))
	if err != nil {
		return false, err.Error()
	}
	body, err := client.Get().AbsPath("/readyz").DoRaw(ctx)
	if err != nil {
		return false, fmt.Sprintf("/readyz: %v %s", err, body)
	}
	return true, ""
}

// Crash kills kcp (SIGKILL: its graceful shutdown waits for long-running
// requests such as watches, well over 30 s), waits out outage and starts it
// again with the same flags (same ports and root directory, so kubeconfigs
// and the admin token stay valid), and waits until it is ready.
func (k *KCP) Crash(ctx context.Context, outage time.Duration) error {
	down := time.Now()
	k.Kill()
	time.Sleep(outage - time.Since(down))
	p, err := StartProcess(k.Name, k.cmd.Path, k.cmd.Args[1:], nil, filepath.Dir(k.LogFile))
	if err != nil {
		return err
	}
	k.Process = p
	return Eventually(ctx, 3*time.Minute, 250*time.Millisecond, func(ctx context.Context) (bool, string) {
		select {
		case <-p.Exited():
			return false, fmt.Sprintf("kcp exited: %v (log: %s)", p.ExitErr(), p.LogFile)
		default:
		}
		// kcp-admin has a new token once kcp rewrote its kubeconfig:
		// clients built from Config before the crash must be built again.
		cfg, err := clientcmd.BuildConfigFromFlags("", k.Kubeconfig)
		if err != nil {
			return false, err.Error()
		}
		if ok, why := readyz(ctx, cfg); !ok {
			return false, why
		}
		cfg.QPS, cfg.Burst = k.Config.QPS, k.Config.Burst
		*k.Config = *cfg
		return true, ""
	})
}

// bulkConfig loads kubeconfig with client rate limits raised: tests create
// objects in bulk.
func bulkConfig(kubeconfig string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 100, 200
	return cfg, nil
}

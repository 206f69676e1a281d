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
	// the root workspace.
	Kubeconfig string
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
	k := &KCP{Process: proc, Kubeconfig: filepath.Join(dir, "admin.kubeconfig")}
	err = Eventually(ctx, 3*time.Minute, 500*time.Millisecond, func(ctx context.Context) (bool, string) {
		select {
		case <-proc.Exited():
			return false, fmt.Sprintf("kcp exited: %v (log: %s)", proc.ExitErr(), proc.LogFile)
		default:
		}
		if k.Config == nil {
			cfg, err := clientcmd.BuildConfigFromFlags("", k.Kubeconfig)
			if err != nil {
				return false, "admin kubeconfig not written yet: " + err.Error()
			}
			cfg.QPS, cfg.Burst = 100, 200 // tests create objects in bulk
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

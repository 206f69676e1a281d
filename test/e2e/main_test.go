// Package e2e tests ferry's real binaries against a real kcp and a real
// service cluster (kube-apiserver + etcd). TestMain starts one kcp and one
// service cluster per run; each test starts its own broker and edges.
package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kcp-dev/logicalcluster/v3"

	"github.com/ferry-dev/ferry/test/framework"
)

// suite is what TestMain starts once; tests only read it.
type suite struct {
	bins     framework.Binaries
	dir      string
	kcp      *framework.KCP
	service  *framework.ServiceCluster
	provider logicalcluster.Path
	// sharded is the sharded kcp, started by the first test that needs it.
	sharded *shardedSuite
}

var env *suite

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	bins, err := framework.BinariesFromEnv()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	dir, err := artifactsDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	fmt.Println("e2e: process logs and state in", dir)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	kcp, err := framework.StartKCP(ctx, bins.KCP, filepath.Join(dir, "kcp"), filepath.Join(dir, "logs"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer func() { _ = kcp.Stop(30 * time.Second) }()

	svc, err := framework.StartServiceCluster(ctx, bins, "service", filepath.Join(dir, "service"), filepath.Join(dir, "logs"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer func() { _ = svc.Stop() }()

	provider, err := framework.CreateWorkspace(ctx, kcp.Config, "root", "e2e-provider")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	env = &suite{bins: bins, dir: dir, kcp: kcp, service: svc, provider: provider, sharded: newShardedSuite(dir)}
	defer env.sharded.stop()
	code := m.Run()
	if code == 0 {
		env.sharded.stop()
		env.sharded.removeData()
		// Keep the logs; drop the servers' data (hundreds of MB) after a
		// passing run. Stopping twice is harmless: the deferred stops return
		// at once.
		_ = svc.Stop()
		_ = kcp.Stop(30 * time.Second)
		_ = os.RemoveAll(filepath.Join(dir, "kcp"))
		_ = os.RemoveAll(filepath.Join(dir, "service"))
	}
	return code
}

// artifactsDir is a fresh directory for this run: under $FERRY_ARTIFACTS when
// set (make test-e2e sets it), else under the system temp directory.
func artifactsDir() (string, error) {
	base := os.Getenv("FERRY_ARTIFACTS")
	if base == "" {
		base = os.TempDir()
	}
	if err := os.MkdirAll(base, 0o755); err != nil {
		return "", err
	}
	return os.MkdirTemp(base, "e2e-"+time.Now().Format("20060102-150405")+"-")
}

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/kcp-dev/logicalcluster/v3"

	"github.com/ferry-dev/ferry/test/framework"
)

// shardedShards is how many shards the shared sharded kcp has: the root
// shard and "shard-1".
const shardedShards = 2

// shardedSuite is a kcp of two shards shared by the tests that need one. The
// first of them starts it (a run without them does not pay for it);
// TestMain stops it. The service cluster is the suite's.
type shardedSuite struct {
	dir string

	once     sync.Once
	kcp      *framework.ShardedKCP
	provider logicalcluster.Path
	// startup is how long starting it took, for the test log.
	startup time.Duration
	err     error
}

func newShardedSuite(runDir string) *shardedSuite {
	return &shardedSuite{dir: filepath.Join(runDir, "sharded-kcp")}
}

// get returns the sharded kcp and its provider workspace, starting them on
// first use; a failed start fails every test that needs them.
func (s *shardedSuite) get(t testing.TB) (*framework.ShardedKCP, logicalcluster.Path) {
	t.Helper()
	s.once.Do(func() {
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
		defer cancel()
		k, err := framework.StartShardedKCP(ctx, os.Getenv("FERRY_KCP_BIN_DIR"), s.dir, filepath.Join(s.dir, "logs"), shardedShards)
		if err != nil {
			s.err = err
			return
		}
		s.kcp = k
		// The provider workspace on the root shard, as the APIExport of a
		// platform team usually is; consumers live on every shard.
		s.provider, s.err = framework.CreateWorkspaceOn(ctx, k.Config, "root", "e2e-provider", map[string]string{"region": k.Shards[0].Region})
		s.startup = time.Since(start)
	})
	if s.err != nil {
		t.Fatalf("sharded kcp: %v", s.err)
	}
	t.Logf("sharded kcp (started once per run in %s): front-proxy %s, logs in %s", s.startup.Round(time.Second), s.kcp.Config.Host, s.kcp.LogDir)
	return s.kcp, s.provider
}

// stop stops the sharded kcp if a test started it.
func (s *shardedSuite) stop() {
	if s.kcp != nil {
		if err := s.kcp.Stop(30 * time.Second); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: stopping the sharded kcp:", err)
		}
	}
}

// removeData drops the sharded kcp's state (its etcd data) and keeps its
// logs, as TestMain does for the single kcp after a passing run.
func (s *shardedSuite) removeData() {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if e.Name() != "logs" {
			_ = os.RemoveAll(filepath.Join(s.dir, e.Name()))
		}
	}
}

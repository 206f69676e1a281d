package e2e

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// BenchmarkBurst creates 300 objects in kcp at once and deletes them again,
// and reports how long each took to reach the service cluster (p50, p99)
// and how long until all were gone from both sides. It runs only with
// -bench (real servers, a minute or so per iteration):
//
//	go test -run '^$' -bench Burst -benchtime 1x ./test/e2e/  (with the e2e environment variables)
func BenchmarkBurst(b *testing.B) {
	const n = 300
	// One environment: its names derive from the benchmark's name, so
	// run it with -benchtime 1x (one call); iterations within a call
	// reuse it (each leaves nothing behind).
	e := newSyncEnv(b, "burst.example.com", "Crate", "crates", nil)
	b.ResetTimer()
	for range b.N {
		ctx := context.Background()
		created := make([]time.Time, n)
		seen := make([]time.Duration, n)
		var wg sync.WaitGroup
		start := time.Now()
		sem := make(chan struct{}, 8)
		for j := range n {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				if _, err := e.remote.Namespace("default").Create(ctx, e.remoteObject(fmt.Sprintf("crate-%03d", j)), metav1.CreateOptions{}); err != nil {
					b.Error(err)
				}
				created[j] = time.Now()
			})
		}
		left := n
		for left > 0 && time.Since(start) < 5*time.Minute {
			for name := range e.localState(b) {
				var j int
				if _, err := fmt.Sscanf(name, "crate-%03d", &j); err == nil && seen[j] == 0 && !created[j].IsZero() {
					seen[j] = time.Since(created[j])
					left--
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		wg.Wait()
		createWall := time.Since(start)
		if left > 0 {
			b.Fatalf("%d of %d objects never reached the service cluster", left, n)
		}

		start = time.Now()
		for j := range n {
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				if err := e.remote.Namespace("default").Delete(ctx, fmt.Sprintf("crate-%03d", j), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
					b.Error(err)
				}
			})
		}
		wg.Wait()
		var localGone time.Duration
		for time.Since(start) < 5*time.Minute {
			if localGone == 0 && len(e.localState(b)) == 0 {
				localGone = time.Since(start)
			}
			if localGone != 0 && len(e.remoteVersions(b)) == 0 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		deleteWall := time.Since(start)
		slices.Sort(seen)
		b.ReportMetric(createWall.Seconds(), "create-wall-s")
		b.ReportMetric(seen[n/2].Seconds(), "create-p50-s")
		b.ReportMetric(seen[n*99/100].Seconds(), "create-p99-s")
		b.ReportMetric(localGone.Seconds(), "delete-local-s")
		b.ReportMetric(deleteWall.Seconds(), "delete-wall-s")
	}
}

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/ferry-dev/ferry/pkg/naming"
)

// burstTimes records, per object, when the test saw each step (under mu:
// the watches and the creating goroutines write concurrently).
type burstTimes struct {
	mu        sync.Mutex
	created   map[string]time.Time // kcp create returned
	finalized map[string]time.Time // the broker's finalizer seen in kcp
	local     map[string]time.Time // the local copy seen
}

func (bt *burstTimes) mark(m map[string]time.Time, name string) {
	bt.mu.Lock()
	defer bt.mu.Unlock()
	if _, ok := m[name]; !ok {
		m[name] = time.Now()
	}
}

// latencies returns, sorted, to[name] - from[name] for every name in both.
func (bt *burstTimes) latencies(from, to map[string]time.Time) []time.Duration {
	bt.mu.Lock()
	defer bt.mu.Unlock()
	var out []time.Duration
	for name, t0 := range from {
		if t1, ok := to[name]; ok {
			out = append(out, max(t1.Sub(t0), 0))
		}
	}
	slices.Sort(out)
	return out
}

// watchNames calls seen with every object ri's watch shows until ctx ends.
func watchNames(ctx context.Context, b *testing.B, ri dynamic.ResourceInterface, seen func(u *unstructured.Unstructured)) {
	w, err := ri.Watch(ctx, metav1.ListOptions{})
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		defer w.Stop()
		for ev := range w.ResultChan() {
			if u, ok := ev.Object.(*unstructured.Unstructured); ok {
				seen(u)
			}
		}
	}()
}

func percentile(d []time.Duration, p int) float64 {
	if len(d) == 0 {
		return 0
	}
	return d[min(len(d)-1, len(d)*p/100)].Seconds()
}

// BenchmarkBurst creates 300 objects in kcp at once and deletes them again,
// and reports per object how long the broker took to put its finalizer on
// (create → finalizer, p50) and how long until the local copy existed
// (create → local, p50 and p99), and how long until all were gone from both
// sides. Real servers, about a minute per iteration; run it with the e2e
// environment variables and -benchtime 1x (the environment's names derive
// from the benchmark's name):
//
//	go test -run '^$' -bench Burst -benchtime 1x ./test/e2e/
func BenchmarkBurst(b *testing.B) {
	const n = 300
	e := newSyncEnv(b, "burst.example.com", "Crate", "crates", nil)
	b.ResetTimer()
	for range b.N {
		ctx, cancel := context.WithCancel(context.Background())
		bt := &burstTimes{created: map[string]time.Time{}, finalized: map[string]time.Time{}, local: map[string]time.Time{}}
		watchNames(ctx, b, e.remote.Namespace("default"), func(u *unstructured.Unstructured) {
			if slices.Contains(u.GetFinalizers(), "ferry.dev/edge") {
				bt.mark(bt.finalized, u.GetName())
			}
		})
		watchNames(ctx, b, e.local.Namespace(e.consumerLC), func(u *unstructured.Unstructured) {
			bt.mark(bt.local, u.GetAnnotations()[naming.AnnotationName])
		})

		var wg sync.WaitGroup
		start := time.Now()
		sem := make(chan struct{}, 8)
		for j := range n {
			name := fmt.Sprintf("crate-%03d", j)
			wg.Go(func() {
				sem <- struct{}{}
				defer func() { <-sem }()
				before := time.Now()
				if _, err := e.remote.Namespace("default").Create(ctx, e.remoteObject(name), metav1.CreateOptions{}); err != nil {
					b.Error(err)
				}
				bt.mu.Lock()
				bt.created[name] = before
				bt.mu.Unlock()
			})
		}
		wg.Wait()
		for time.Since(start) < 5*time.Minute && len(bt.latencies(bt.created, bt.local)) < n {
			time.Sleep(50 * time.Millisecond)
		}
		createWall := time.Since(start)
		toLocal := bt.latencies(bt.created, bt.local)
		toFinalizer := bt.latencies(bt.created, bt.finalized)
		if len(toLocal) < n {
			b.Fatalf("%d of %d objects never reached the service cluster", n-len(toLocal), n)
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
			if localGone == 0 && countPrefix(e.localState(b), "crate-") == 0 {
				localGone = time.Since(start)
			}
			if localGone != 0 && countPrefix(e.remoteVersions(b), "crate-") == 0 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		deleteWall := time.Since(start)
		cancel()
		b.ReportMetric(createWall.Seconds(), "create-wall-s")
		b.ReportMetric(percentile(toFinalizer, 50), "finalizer-p50-s")
		b.ReportMetric(percentile(toLocal, 50), "local-p50-s")
		b.ReportMetric(percentile(toLocal, 99), "local-p99-s")
		b.ReportMetric(localGone.Seconds(), "delete-local-s")
		b.ReportMetric(deleteWall.Seconds(), "delete-wall-s")
	}
}

func countPrefix[V any](m map[string]V, prefix string) int {
	n := 0
	for k := range m {
		if strings.HasPrefix(k, prefix) {
			n++
		}
	}
	return n
}

// Package watching holds small helpers for list/watch consumers shared by
// the broker and the edge.
package watching

import (
	"context"
	"sync"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// ListWatch lists and watches ri with labelSelector ("" for all).
func ListWatch(ri dynamic.ResourceInterface, labelSelector string) *cache.ListWatch {
	return &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = labelSelector
			return ri.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = labelSelector
			return ri.Watch(ctx, o)
		},
	}
}

// RunWorkers shuts queue down when ctx ends and runs workers goroutines
// calling process until it returns false; it returns when all have exited.
func RunWorkers[T comparable](ctx context.Context, queue workqueue.TypedInterface[T], workers int, process func() bool) {
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for process() {
			}
		})
	}
	wg.Wait()
}

// WithoutWatchList makes a reflector list, then watch, instead of streaming
// the initial state as watch events (client-go's WatchListClient, on by
// default since v0.35). kcp's APIExport virtual workspace (v0.28) answered
// the streamed initial state of a /clusters/* watch without some
// workspaces' existing objects: the broker's cache reported itself synced
// while missing them, and such an object synced only when it next changed.
func WithoutWatchList(lw *cache.ListWatch) cache.ListerWatcher { return noWatchList{lw} }

type noWatchList struct{ *cache.ListWatch }

// IsWatchListSemanticsUnSupported tells client-go's reflector not to use
// the watch-list protocol.
func (noWatchList) IsWatchListSemanticsUnSupported() bool { return true }

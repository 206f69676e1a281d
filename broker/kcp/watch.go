package kcp

import (
	"context"

	apisv1alpha1 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha1"
	"github.com/kcp-dev/logicalcluster/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/ferry-dev/ferry/broker/config"
)

// WatchVirtualWorkspace calls onChange with the virtual workspace URL of
// ref's APIExportEndpointSlice ("" while there is none) each time it changes,
// until ctx ends. An informer on that one object does the watching, so the
// broker learns about the URL as soon as kcp publishes it, without polling.
// onChange is called from one goroutine at a time.
func (r *Resolver) WatchVirtualWorkspace(ctx context.Context, ref config.APIExportRef, onChange func(url string)) {
	slices := r.client.Cluster(logicalcluster.NewPath(ref.Workspace)).ApisV1alpha1().APIExportEndpointSlices()
	selector := fields.OneTermEqualSelector("metadata.name", ref.Name).String()
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.FieldSelector = selector
			return slices.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.FieldSelector = selector
			return slices.Watch(ctx, o)
		},
	}
	informer := cache.NewSharedIndexInformer(lw, &apisv1alpha1.APIExportEndpointSlice{}, 0, cache.Indexers{})
	last := "\x00" // never a URL: the first observation is always reported
	report := func(obj any) {
		url := ""
		if s, ok := obj.(*apisv1alpha1.APIExportEndpointSlice); ok && len(s.Status.APIExportEndpoints) > 0 {
			url = s.Status.APIExportEndpoints[0].URL
		}
		if url != last {
			last = url
			onChange(url)
		}
	}
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    report,
		UpdateFunc: func(_, obj any) { report(obj) },
		DeleteFunc: func(any) { report(nil) },
	})
	informer.RunWithContext(ctx)
}

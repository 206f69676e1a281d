package ownership

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/ferry-dev/ferry/pkg/watching"
)

// labelRecord marks the ownership records, which the record caches list
// and watch.
const labelRecord = "ferry.dev/apiexport-ownership"

// recordCache watches the ownership records of one workspace, so that
// taking an export is one write (a create of a record it does not hold,
// an update of one it holds with its resourceVersion) instead of a read
// and a write: a cold replica takes a thousand exports with a thousand
// requests. The cache may lag: a write on a stale record fails its
// resourceVersion precondition (or exists already) and is read again.
type recordCache struct {
	informer cache.SharedIndexInformer
}

func newRecordCache(records coordinationv1client.LeaseInterface) *recordCache {
	return &recordCache{informer: leaseInformer(records, labelRecord)}
}

// leaseInformer lists, then watches (package watching: a handful of small
// Leases, and kcp versions differ in how they stream an initial state) the
// Leases labelled label=true, without managedFields.
func leaseInformer(leases coordinationv1client.LeaseInterface, label string) cache.SharedIndexInformer {
	selector := label + "=true"
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return leases.List(ctx, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return leases.Watch(ctx, o)
		},
	}
	informer := cache.NewSharedIndexInformer(watching.WithoutWatchList(lw), &coordinationv1.Lease{}, 0, cache.Indexers{})
	_ = informer.SetTransform(func(obj any) (any, error) {
		if l, ok := obj.(*coordinationv1.Lease); ok {
			l.ManagedFields = nil
		}
		return obj, nil
	})
	return informer
}

func (c *recordCache) run(ctx context.Context) { c.informer.RunWithContext(ctx) }

func (c *recordCache) waitSynced(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), c.informer.HasSynced) {
		return fmt.Errorf("the ownership records were not listed: %w", ctx.Err())
	}
	return nil
}

// get is a copy of the cached record name, or nil.
func (c *recordCache) get(namespace, name string) *coordinationv1.Lease {
	obj, exists, err := c.informer.GetStore().GetByKey(namespace + "/" + name)
	if err != nil || !exists {
		return nil
	}
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return nil
	}
	return l.DeepCopy()
}

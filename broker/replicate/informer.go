package replicate

import (
	"context"
	"fmt"

	"github.com/kcp-dev/logicalcluster/v3"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"
)

// clusterKey keys objects by logical cluster, namespace and name: objects
// listed through a virtual workspace's /clusters/* share namespaces and
// names across workspaces, so client-go's namespace/name keys would collide.
func clusterKey(obj any) (string, error) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return d.Key, nil
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return "", err
	}
	return logicalcluster.From(m).String() + "|" + m.GetNamespace() + "/" + m.GetName(), nil
}

// runInformer lists and watches through lw into store (keyed by
// clusterKey) and calls onChange with the key of every object that was
// added, updated or deleted, until ctx ends. onChange runs on one goroutine
// and must not block for long (it only enqueues). onSynced, when set, is
// called once the initial list is in the store. managedFields are dropped
// (never read; they are a large part of every object).
func runInformer(ctx context.Context, lw cache.ListerWatcher, store cache.Indexer, onChange func(key string), onSynced func()) {
	fifo := cache.NewDeltaFIFOWithOptions(cache.DeltaFIFOOptions{KeyFunction: clusterKey, KnownObjects: store, EmitDeltaTypeReplaced: true})
	ctrl := cache.New(&cache.Config{
		Queue:         fifo,
		ListerWatcher: lw,
		ObjectType:    &unstructured.Unstructured{},
		Process: func(obj any, _ bool) error {
			deltas, ok := obj.(cache.Deltas)
			if !ok {
				return fmt.Errorf("unexpected %T from the delta FIFO", obj)
			}
			for _, d := range deltas {
				key, err := clusterKey(d.Object)
				if err != nil {
					return err
				}
				if u, ok := d.Object.(*unstructured.Unstructured); ok && d.Type != cache.Deleted {
					u.SetManagedFields(nil)
				}
				if d.Type == cache.Deleted {
					if err := store.Delete(d.Object); err != nil {
						return err
					}
				} else if err := store.Update(d.Object); err != nil {
					return err
				}
				onChange(key)
			}
			return nil
		},
	})
	if onSynced != nil {
		go func() {
			if cache.WaitForCacheSync(ctx.Done(), ctrl.HasSynced) {
				onSynced()
			}
		}()
	}
	ctrl.RunWithContext(ctx)
}

// newStore returns a store keyed like runInformer expects.
func newStore() cache.Indexer {
	return cache.NewIndexer(clusterKey, cache.Indexers{})
}

// clusterKeyOf is clusterKey of an object known to have metadata.
func clusterKeyOf(obj *unstructured.Unstructured) string {
	return logicalcluster.From(obj).String() + "|" + obj.GetNamespace() + "/" + obj.GetName()
}

package replication

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/tools/cache"

	"github.com/ferry-dev/ferry/pkg/watching"
)

// clusterKey keys objects in the informer stores by their place
// (objectName.storeKey).
func clusterKey(obj any) (string, error) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		return d.Key, nil
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return "", err
	}
	return nameOf(m).storeKey(), nil
}

// reflectorBackoff bounds the wait between list/watch attempts after kcp
// failed: client-go's default grows to 30 s with up to 100% jitter, so after
// a kcp outage the broker saw kcp changes up to a minute late. A virtual
// workspace watch is one request per published resource: retrying every few
// seconds costs kcp little.
func reflectorBackoff() *wait.Backoff {
	return &wait.Backoff{Duration: 500 * time.Millisecond, Factor: 2, Jitter: 0.2, Steps: 1 << 30, Cap: 4 * time.Second}
}

// runInformer lists and watches through lw into store (keyed by
// clusterKey) and calls onChange with the key of every object that was
// added, updated or deleted, until ctx ends. onChange runs on one goroutine
// and must not block for long (it only enqueues). onSynced, when set, is
// called once the initial list is in the store. managedFields are dropped
// (never read; they are a large part of every object).
//
// It is client-go's informer loop (a reflector into a DeltaFIFO, popped
// into store) rather than cache.New, whose Config cannot set the
// reflector's backoff (reflectorBackoff).
func runInformer(ctx context.Context, lw *cache.ListWatch, store cache.Indexer, onChange func(key string), onSynced func()) {
	fifo := cache.NewDeltaFIFOWithOptions(cache.DeltaFIFOOptions{KeyFunction: clusterKey, KnownObjects: store, EmitDeltaTypeReplaced: true})
	// List, then watch: see watching.WithoutWatchList for what the
	// virtual workspace's streamed initial state lost.
	r := cache.NewReflectorWithOptions(watching.WithoutWatchList(lw), &unstructured.Unstructured{}, fifo, cache.ReflectorOptions{Backoff: reflectorBackoff()})
	process := func(obj any, _ bool) error {
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
	}
	if onSynced != nil {
		go func() {
			if cache.WaitForCacheSync(ctx.Done(), fifo.HasSynced) {
				onSynced()
			}
		}()
	}
	go func() {
		<-ctx.Done()
		fifo.Close()
	}()
	var wg sync.WaitGroup
	wg.Go(func() { r.RunWithContext(ctx) })
	for {
		if _, err := fifo.Pop(process); err != nil {
			if errors.Is(err, cache.ErrFIFOClosed) {
				break
			}
			utilruntime.HandleErrorWithContext(ctx, err, "cannot apply a change to the broker's cache")
		}
	}
	wg.Wait()
}

// primaryIndexers index the caches of published resources.
func primaryIndexers() cache.Indexers { return cache.Indexers{uidIndex: indexByUID} }

// uidIndex indexes cached kcp objects by UID.
const uidIndex = "uid"

func indexByUID(obj any) ([]string, error) {
	o, err := meta.Accessor(obj)
	if err != nil {
		return nil, nil
	}
	return []string{string(o.GetUID())}, nil
}

// clusterKeyOf is clusterKey of an object known to have metadata.
func clusterKeyOf(obj *unstructured.Unstructured) string {
	return nameOf(obj).storeKey()
}

package replication

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/ferry-dev/ferry/pkg/logging"
	"github.com/ferry-dev/ferry/pkg/watching"
)

// shardedWatch watches one resource (the objects matching a label
// selector) across every workspace, at every virtual workspace endpoint:
// one informer and cache per endpoint, read as one cache. One per
// endpoint, because an informer's relist replaces its whole cache: a cache
// shared by the shards would lose every other shard's objects at each
// relist. Keys are the same as with one endpoint (logical cluster,
// namespace, name): a workspace lives on one shard.
//
// Its read methods are safe for concurrent use; follow and stop are called
// under the manager's lock.
type shardedWatch struct {
	gvr      schema.GroupVersionResource
	selector string
	indexers cache.Indexers
	// onChange gets the key of every object added, updated or deleted at
	// any endpoint; it must only enqueue.
	onChange func(key string)
	// onListed, when set, is called (without locks) each time the watch at
	// an endpoint has listed, and when removing an endpoint left every
	// other one listed: what waited for a workspace's shard to list (or for
	// all, see listed) can go on.
	onListed func()
	deps     watchDeps

	mu     sync.RWMutex
	shards map[string]*shardCache // by endpoint URL
}

// watchDeps is what a shardedWatch's informers run on.
type watchDeps struct {
	ctx       context.Context
	endpoints *endpointSet
	// lists counts the lists made in kcp (Manager.Lists).
	lists *atomic.Uint64
	log   logr.Logger
}

// shardCache is one endpoint's informer and cache.
type shardCache struct {
	store  cache.Indexer
	listed atomic.Bool // its initial list is in store
	cancel context.CancelFunc
	// id is the watch's id in the endpoint's reachability.
	id uint64
}

func newShardedWatch(deps watchDeps, gvr schema.GroupVersionResource, selector string, indexers cache.Indexers, onChange func(key string), onListed func()) *shardedWatch {
	return &shardedWatch{gvr: gvr, selector: selector, indexers: indexers, onChange: onChange, onListed: onListed, deps: deps, shards: map[string]*shardCache{}}
}

// follow makes w watch at exactly urls. A removed endpoint's watch stops
// and its objects leave the cache without a change reported: that the
// watch stopped says nothing about them (they are not deleted).
func (w *shardedWatch) follow(urls []string) {
	type stopped struct {
		url string
		id  uint64
	}
	var gone []stopped
	w.mu.Lock()
	wasListed := w.listedLocked()
	for url, sh := range w.shards {
		if !slices.Contains(urls, url) {
			sh.cancel()
			delete(w.shards, url)
			gone = append(gone, stopped{url, sh.id})
		}
	}
	for _, url := range urls {
		if _, ok := w.shards[url]; !ok {
			w.startLocked(url)
		}
	}
	// Removing the one endpoint that had not listed lists the rest.
	becameListed := !wasListed && w.listedLocked()
	w.mu.Unlock()
	for _, s := range gone {
		w.deps.endpoints.forget(s.url, s.id)
	}
	if becameListed && w.onListed != nil {
		go w.onListed() // the caller holds the manager's lock
	}
}

// startLocked starts the watch at url.
func (w *shardedWatch) startLocked(url string) {
	dyn, err := w.deps.endpoints.clientAt(url, "*")
	if err != nil {
		// Never retried (a URL no client can be built for stays so): the
		// endpoint shows as unreachable until kcp lists another.
		w.deps.log.Error(err, "cannot watch at a virtual workspace endpoint", logging.KeyEndpoint, url, "resource", w.gvr.String())
		w.deps.endpoints.unusable(url, err)
		return
	}
	lw, id := w.deps.endpoints.observeCalls(url, countLists(w.deps.lists, watching.ListWatch(dyn.Resource(w.gvr), w.selector)))
	ctx, cancel := context.WithCancel(w.deps.ctx)
	sh := &shardCache{store: cache.NewIndexer(clusterKey, w.indexers), cancel: cancel, id: id}
	w.shards[url] = sh
	onChange := func(key string) {
		// The watch that sees a workspace's object tells where writes for
		// that workspace go.
		if _, ok, _ := sh.store.GetByKey(key); ok {
			w.deps.endpoints.observed(parseStoreKey(key).cluster, url)
		}
		w.onChange(key)
	}
	onSynced := func() {
		sh.listed.Store(true)
		if w.onListed != nil {
			w.onListed()
		}
	}
	go runInformer(ctx, lw, sh.store, onChange, onSynced)
}

// stop stops every endpoint's watch.
func (w *shardedWatch) stop() { w.follow(nil) }

// listed tells whether there is an endpoint and every endpoint's watch has
// listed: only then does an object missing from the cache whose
// workspace's shard is not known prove gone.
func (w *shardedWatch) listed() bool {
	w.mu.RLock()
	defer w.mu.RUnlock()
	return w.listedLocked()
}

func (w *shardedWatch) listedLocked() bool {
	if len(w.shards) == 0 {
		return false
	}
	for _, sh := range w.shards {
		if !sh.listed.Load() {
			return false
		}
	}
	return true
}

// listedAt tells whether the watch at url runs and has listed.
func (w *shardedWatch) listedAt(url string) bool {
	w.mu.RLock()
	defer w.mu.RUnlock()
	sh, ok := w.shards[url]
	return ok && sh.listed.Load()
}

// GetByKey returns the cached object with key, at whichever endpoint.
func (w *shardedWatch) GetByKey(key string) (any, bool, error) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	for _, sh := range w.shards {
		if obj, ok, err := sh.store.GetByKey(key); err != nil || ok {
			return obj, ok, err
		}
	}
	return nil, false, nil
}

// ListKeys returns the keys of every cached object.
func (w *shardedWatch) ListKeys() []string {
	w.mu.RLock()
	defer w.mu.RUnlock()
	var out []string
	for _, sh := range w.shards {
		out = append(out, sh.store.ListKeys()...)
	}
	return out
}

// List returns every cached object.
func (w *shardedWatch) List() []any {
	w.mu.RLock()
	defer w.mu.RUnlock()
	var out []any
	for _, sh := range w.shards {
		out = append(out, sh.store.List()...)
	}
	return out
}

// ByIndex returns the cached objects whose index value is value.
func (w *shardedWatch) ByIndex(index, value string) ([]any, error) {
	w.mu.RLock()
	defer w.mu.RUnlock()
	var out []any
	for _, sh := range w.shards {
		objs, err := sh.store.ByIndex(index, value)
		if err != nil {
			return nil, err
		}
		out = append(out, objs...)
	}
	return out, nil
}

// Len is the number of cached objects.
func (w *shardedWatch) Len() int {
	w.mu.RLock()
	defer w.mu.RUnlock()
	n := 0
	for _, sh := range w.shards {
		n += len(sh.store.ListKeys())
	}
	return n
}

package replication

import (
	"context"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	"github.com/ferry-dev/ferry/pkg/watching"
)

// relatedWatch caches one related resource of the service cluster. By
// default it holds one informer per namespace the edge may read or write
// related objects in (placement.go): the namespaces ferry created, the
// namespaces PublishedResources name statically and the namespaces of
// copies placed in existing namespaces. No Secret of any other namespace is
// ever held in memory. With Options.RelatedClusterWide (the service owner's
// opt-in) it is one informer for the whole cluster: fewer watches when the
// edge serves very many workspaces, at the price of caching every object of
// the kind. Either way it may list and watch only the objects with the
// labels of the entries' watch.labelSelector (relatedwatch_selector.go).
type relatedWatch struct {
	gvr schema.GroupVersionResource
	// selector is the label selector the informers list and watch with
	// ("" for every object).
	selector string
	// spaces are the informers by namespace; "" is the whole cluster.
	spaces map[string]*relatedSpace
}

// relatedSpace is the informer of one namespace (or of all).
type relatedSpace struct {
	store  cache.Indexer
	cancel context.CancelFunc
	synced bool
}

// space returns the informer that holds namespace ns (nil when none does).
func (rw *relatedWatch) space(ns string) *relatedSpace {
	if s, ok := rw.spaces[""]; ok {
		return s
	}
	return rw.spaces[ns]
}

// spaceKey is the key of the informer holding ns.
func (rw *relatedWatch) spaceKey(ns string) string {
	if _, ok := rw.spaces[""]; ok {
		return ""
	}
	return ns
}

// readyIn tells whether objects in ns can be looked up.
func (rw *relatedWatch) readyIn(ns string) bool {
	s := rw.space(ns)
	return s != nil && s.synced
}

// allSynced tells whether every informer has listed.
func (rw *relatedWatch) allSynced() bool {
	for _, s := range rw.spaces {
		if !s.synced {
			return false
		}
	}
	return true
}

// get returns the cached object ns/name.
func (rw *relatedWatch) get(ns, name string) (*unstructured.Unstructured, bool) {
	s := rw.space(ns)
	if s == nil {
		return nil, false
	}
	raw, ok, _ := s.store.GetByKey(cacheKeyOf(ns, name))
	if !ok {
		return nil, false
	}
	u, ok := raw.(*unstructured.Unstructured)
	return u, ok
}

// owned returns the copies ferry wrote for a primary UID and identifier
// (relatedOwnerKey), in every namespace.
func (rw *relatedWatch) owned(key string) []any {
	var out []any
	for _, s := range rw.spaces {
		objs, _ := s.store.ByIndex(relatedOwnerIndex, key)
		out = append(out, objs...)
	}
	return out
}

func (rw *relatedWatch) stop() {
	for _, s := range rw.spaces {
		s.cancel()
	}
}

// relatedNamespacesLocked is where related objects may be read or written
// (see placement.go), so where they are cached.
func (e *Engine) relatedNamespacesLocked() map[string]bool {
	out := map[string]bool{}
	if e.opts.RelatedClusterWide {
		out[""] = true
		return out
	}
	if e.nsStore != nil {
		for _, ns := range e.nsStore.ListKeys() {
			out[ns] = true
		}
	}
	for ns := range e.created {
		out[ns] = true
	}
	for name, p := range e.published {
		if ns, ok := p.Naming.StaticNamespace(); ok {
			out[ns] = true
		}
		for _, r := range p.Related {
			if ns, ok := r.StaticNamespace(); ok {
				out[ns] = true
			}
		}
		if w, ok := e.watches[name]; ok && p.AllowExistingNamespaces && w.store != nil {
			for _, k := range w.store.ListKeys() {
				if ns, _, found := strings.Cut(k, "/"); found {
					out[ns] = true
				}
			}
		}
	}
	return out
}

// ensureRelatedWatchesLocked runs exactly the related informers the
// registered PublishedResources need, in the namespaces they may use.
func (e *Engine) ensureRelatedWatchesLocked() {
	if e.ctx == nil {
		return
	}
	needed := relatedInformerSelectors(e.published)
	for gvr, rw := range e.relWatches {
		if sel, ok := needed[gvr]; !ok || sel != rw.selector {
			// Not needed, or to list with another selector: the
			// informers start again, and references wait for them to
			// list (waitForSpaceLocked) as at the start.
			rw.stop()
			delete(e.relWatches, gvr)
		}
	}
	if len(needed) == 0 {
		return
	}
	namespaces := e.relatedNamespacesLocked()
	for gvr, sel := range needed {
		rw, ok := e.relWatches[gvr]
		if !ok {
			rw = &relatedWatch{gvr: gvr, selector: sel, spaces: map[string]*relatedSpace{}}
			e.relWatches[gvr] = rw
		}
		for ns, s := range rw.spaces {
			if !namespaces[ns] {
				s.cancel()
				delete(rw.spaces, ns)
				delete(e.relWaiting, waitKey{gvr: gvr, space: ns})
			}
		}
		for ns := range namespaces {
			if _, ok := rw.spaces[ns]; !ok {
				e.startRelatedSpaceLocked(rw, ns)
			}
		}
	}
}

// startRelatedSpaceLocked starts rw's informer on namespace ns ("" for the
// whole cluster).
func (e *Engine) startRelatedSpaceLocked(rw *relatedWatch, ns string) {
	ctx, cancel := context.WithCancel(e.ctx)
	s := &relatedSpace{cancel: cancel}
	rw.spaces[ns] = s
	ri := e.opts.Dynamic.Resource(rw.gvr)
	lw := watching.ListWatch(ri, rw.selector)
	if ns != "" {
		lw = watching.ListWatch(ri.Namespace(ns), rw.selector)
	}
	informer := cache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, 0, cache.Indexers{relatedOwnerIndex: indexByRelatedOwner})
	_ = informer.SetTransform(e.relatedTransform)
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { e.relatedUpdated(rw, obj) },
		UpdateFunc: func(_, obj any) { e.relatedUpdated(rw, obj) },
		DeleteFunc: func(obj any) { e.relatedGone(rw, obj) },
	})
	s.store = informer.GetIndexer()
	go informer.RunWithContext(ctx)
	go func() {
		if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
			return
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		s.synced = true
		if e.relWatches[rw.gvr] != rw || rw.spaces[ns] != s {
			return
		}
		// The references that waited for this namespace can be reported.
		k := waitKey{gvr: rw.gvr, space: ns}
		waiting := e.relWaiting[k]
		delete(e.relWaiting, k)
		for rk := range waiting {
			e.reportRefLocked(rk)
		}
	}()
}

// waitKey is a related informer: its resource and its namespace ("" for
// the whole cluster).
type waitKey struct {
	gvr   schema.GroupVersionResource
	space string
}

// waitForSpaceLocked remembers a reference to report once rw's informer
// holding ns has listed (started here when it is missing).
func (e *Engine) waitForSpaceLocked(rw *relatedWatch, ns string, rk relKey) {
	if rw.space(ns) == nil {
		e.ensureRelatedWatchesLocked()
	}
	k := waitKey{gvr: rw.gvr, space: rw.spaceKey(ns)}
	if e.relWaiting[k] == nil {
		e.relWaiting[k] = map[relKey]struct{}{}
	}
	e.relWaiting[k][rk] = struct{}{}
}

// reportRefLocked reports one reference again (when its primary and entry
// still exist).
func (e *Engine) reportRefLocked(rk relKey) {
	w, ok := e.watches[rk.primary.pr]
	if !ok || w.store == nil {
		return
	}
	ref := w.pub.related(rk.id)
	pk := rk.primary.objectKey()
	primary := e.findLocal(w, remoteOf(pk))
	if ref == nil || primary == nil || !sameObject(primary, pk) {
		return
	}
	e.reportRelatedRefLocked(w, primary, ref)
}

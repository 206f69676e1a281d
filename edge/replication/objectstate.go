package replication

import (
	"slices"
	"sort"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/edge/objectlog"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// The engine's read side for the edge's admin API (EdgeAdminService): the
// state of its resources and copies, read under its locks, and the
// broker's request for a fresh inventory. What the engine did with each
// object is not kept here: edge/objectlog.Log learns it as the engine's
// Observer and builds the object views from this read side.

// RequestInventory answers the broker's InventoryRequest: the inventory of
// every synced resource named in prs (all when empty) is sent again; one
// whose local watch has not listed yet is sent once it has.
func (e *Engine) RequestInventory(prs []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	names := make([]string, 0, len(e.watches))
	for name := range e.watches {
		if len(prs) == 0 || slices.Contains(prs, name) {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	e.opts.Log.Info("broker asked for the inventory", "publishedResources", names)
	for _, name := range names {
		e.sendInventoryLocked(e.watches[name])
	}
}

// ReportsPending counts the reports waiting to be sent or answered.
func (e *Engine) ReportsPending() int {
	st := e.reports.Stats()
	return st.Pending + st.InFlight
}

// Resources describes the published resources, ordered by name.
func (e *Engine) Resources() []*ferryv1.EdgeResource {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]*ferryv1.EdgeResource, 0, len(e.published))
	for name, p := range e.published {
		r := &ferryv1.EdgeResource{PublishedResource: name, Remote: gvrOf(p.Remote), Local: gvrOf(p.Local)}
		if w, ok := e.watches[name]; ok {
			r.Listed = w.synced
			if w.lastErr != nil && !w.synced {
				r.WatchError = w.lastErr.Error()
			}
			if w.store != nil {
				r.Objects = uint32(len(w.store.ListKeys()))
			}
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].GetPublishedResource() < out[j].GetPublishedResource() })
	return out
}

func gvrOf(g schema.GroupVersionResource) *ferryv1.GroupVersionResource {
	return &ferryv1.GroupVersionResource{Group: g.Group, Version: g.Version, Resource: g.Resource}
}

// Agent is the edge's name, which its copies' labels carry.
func (e *Engine) Agent() string { return e.opts.Agent }

// MatchPublished returns the PublishedResources whose name, kcp resource
// or local resource is resource (in group, when set); all when resource is
// empty. Ordered by name.
func (e *Engine) MatchPublished(group, resource string) []objectlog.Resource {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []objectlog.Resource
	for name, p := range e.published {
		match := resource == "" ||
			(name == resource && group == "") ||
			(p.Remote.Resource == resource && (group == "" || p.Remote.Group == group)) ||
			(p.Local.Resource == resource && (group == "" || p.Local.Group == group))
		if match {
			out = append(out, objectlog.Resource{Name: p.Name, Remote: p.Remote, Local: p.Local})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// listedWatch returns pr's local watch when it has a store.
func (e *Engine) listedWatch(pr string) *localWatch {
	e.mu.Lock()
	defer e.mu.Unlock()
	if w, ok := e.watches[pr]; ok && w.store != nil {
		return w
	}
	return nil
}

// CopyOf returns pr's local copy of the kcp object namespace/name in
// workspace: its logical cluster, or the workspace path a copy with
// enableWorkspacePaths records. Nil when there is none.
func (e *Engine) CopyOf(pr, workspace, namespace, name string) *unstructured.Unstructured {
	w := e.listedWatch(pr)
	if w == nil {
		return nil
	}
	if local := e.findLocal(w, naming.Remote{ClusterName: workspace, Namespace: namespace, Name: name}); local != nil {
		return local
	}
	// A workspace path: only the annotations of copies (with
	// enableWorkspacePaths) know it.
	for _, o := range w.store.List() {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		if r, ok := naming.RemoteFrom(u.GetLabels(), u.GetAnnotations()); ok && r.WorkspacePath == workspace && r.Namespace == namespace && r.Name == name {
			return u
		}
	}
	return nil
}

// LocalObject returns pr's local copy stored as key (namespace/name, or
// name); nil when there is none.
func (e *Engine) LocalObject(pr, key string) *unstructured.Unstructured {
	w := e.listedWatch(pr)
	if w == nil {
		return nil
	}
	raw, ok, err := w.store.GetByKey(key)
	if err != nil || !ok {
		return nil
	}
	u, _ := raw.(*unstructured.Unstructured)
	return u
}

package replication

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/protocol"
)

// The edge's read-only admin view (EdgeAdminService): what it did with
// each object and the state of its resources, and the broker's request
// for a fresh inventory.

// adminState is the engine's bookkeeping for the admin view; its zero value
// is ready to use.
type adminState struct {
	applied, failed atomic.Uint64

	mu sync.Mutex
	// handled holds, per kcp object (without UID: the latest object of the
	// name wins), the last intent handled and its answer. An entry goes when
	// a delete succeeded.
	handled map[objectID]handledIntent
}

// handledIntent is what the admin view keeps of an intent the engine
// answered: its key, version, content hash and answer — not the object's
// content, which the view never shows.
type handledIntent struct {
	key           *ferryv1.ObjectKey
	version       *ferryv1.ObjectVersion
	hash          string
	workspacePath string
	upsert        bool
	err           *ferryv1.ApplyError
	at            time.Time
}

// handledOf is what the admin view keeps of in, answered with res.
func handledOf(in *ferryv1.SyncIntent, res *ferryv1.IntentResult, at time.Time) handledIntent {
	return handledIntent{key: in.GetKey(), version: in.GetVersion(), hash: in.GetUpsert().GetContentHash(),
		workspacePath: in.GetUpsert().GetWorkspacePath(), upsert: in.GetUpsert() != nil, err: res.GetError(), at: at}
}

// objectID identifies a kcp object without its UID (the admin view shows
// the latest object of a name).
type objectID struct {
	cluster, group, resource, namespace, name string
}

func keyID(k *ferryv1.ObjectKey) objectID {
	return objectID{k.GetCluster(), k.GetResource().GetGroup(), k.GetResource().GetResource(), k.GetNamespace(), k.GetName()}
}

// recordHandled records the answer res to the intent in (primary objects
// only) for the admin view.
func (e *Engine) recordHandled(in *ferryv1.SyncIntent, res *ferryv1.IntentResult) {
	if res.GetError() != nil {
		e.admin.failed.Add(1)
	} else {
		e.admin.applied.Add(1)
	}
	if in.GetRelatedTo() != nil {
		return
	}
	id := keyID(in.GetKey())
	e.admin.mu.Lock()
	defer e.admin.mu.Unlock()
	if in.GetDelete() != nil && res.GetError() == nil {
		delete(e.admin.handled, id)
		return
	}
	if e.admin.handled == nil {
		e.admin.handled = map[objectID]handledIntent{}
	}
	e.admin.handled[id] = handledOf(in, res, time.Now())
}

func (e *Engine) lastHandled(id objectID) (handledIntent, bool) {
	e.admin.mu.Lock()
	defer e.admin.mu.Unlock()
	h, ok := e.admin.handled[id]
	return h, ok
}

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

// Counts are the engine's figures for the admin view.
type Counts struct {
	// IntentsApplied and IntentsFailed count answered intents.
	IntentsApplied, IntentsFailed uint64
	// ReportsPending counts reports waiting to be sent or answered.
	ReportsPending int
}

// Counts returns the engine's figures.
func (e *Engine) Counts() Counts {
	st := e.reports.Stats()
	return Counts{IntentsApplied: e.admin.applied.Load(), IntentsFailed: e.admin.failed.Load(), ReportsPending: st.Pending + st.InFlight}
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

// ErrObjectNotFound is returned by ObjectState when the edge knows nothing
// of the object.
var ErrObjectNotFound = errors.New("not found")

// ErrInvalidQuery is returned by ObjectState for a query that selects
// nothing.
var ErrInvalidQuery = errors.New("invalid query")

// ObjectState explains one object, selected by its kcp key (workspace,
// resource, namespace, name) or by its local copy (local_name, optionally
// local_namespace and resource).
func (e *Engine) ObjectState(q *ferryv1.EdgeAdminServiceGetObjectStateRequest) (*ferryv1.EdgeAdminServiceGetObjectStateResponse, error) {
	group, resource := protocol.SplitResource(q.GetGroup(), q.GetResource())
	switch {
	case q.GetLocalName() != "":
		return e.byLocal(group, resource, q.GetLocalNamespace(), q.GetLocalName())
	case q.GetWorkspace() == "" || resource == "" || q.GetName() == "":
		return nil, fmt.Errorf("%w: select the object by workspace, resource, namespace and name (its kcp key), or by local_name and local_namespace (its local copy)", ErrInvalidQuery)
	}
	pubs := e.matchPublished(group, resource)
	if len(pubs) == 0 {
		return nil, fmt.Errorf("%w: no PublishedResource of this edge publishes %q", ErrObjectNotFound, q.GetResource())
	}
	for _, pub := range pubs {
		if out, ok := e.byRemote(pub, q.GetWorkspace(), q.GetNamespace(), q.GetName()); ok {
			return out, nil
		}
	}
	return nil, fmt.Errorf("%w: the edge holds no copy of %s %s in workspace %s and handled no intent for it since it started",
		ErrObjectNotFound, q.GetResource(), nsName(q.GetNamespace(), q.GetName()), q.GetWorkspace())
}

// published is a PublishedResource with its watch.
type published struct {
	pub *Published
	w   *localWatch
}

// matchPublished returns the PublishedResources whose name, kcp resource
// or local resource is resource (in group, when set); all when resource is
// empty.
func (e *Engine) matchPublished(group, resource string) []published {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []published
	for name, p := range e.published {
		match := resource == "" ||
			(name == resource && group == "") ||
			(p.Remote.Resource == resource && (group == "" || p.Remote.Group == group)) ||
			(p.Local.Resource == resource && (group == "" || p.Local.Group == group))
		if match {
			out = append(out, published{pub: p, w: e.watches[name]})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].pub.Name < out[j].pub.Name })
	return out
}

// byRemote finds pub's object by its kcp key; workspace is the logical
// cluster or the workspace path the copy (or the last intent) carries.
func (e *Engine) byRemote(p published, workspace, namespace, name string) (*ferryv1.EdgeAdminServiceGetObjectStateResponse, bool) {
	var local *unstructured.Unstructured
	if p.w != nil && p.w.store != nil {
		local = e.findLocal(p.w, naming.Remote{ClusterName: workspace, Namespace: namespace, Name: name})
		if local == nil {
			// A workspace path: only the annotations of copies (with
			// enableWorkspacePaths) know it.
			for _, o := range p.w.store.List() {
				u, ok := o.(*unstructured.Unstructured)
				if !ok {
					continue
				}
				if r, ok := naming.RemoteFrom(u.GetLabels(), u.GetAnnotations()); ok && r.WorkspacePath == workspace && r.Namespace == namespace && r.Name == name {
					local = u
					break
				}
			}
		}
	}
	if local != nil {
		return e.describe(p.pub, local, nil), true
	}
	if h, ok := e.lastHandled(objectID{workspace, p.pub.Remote.Group, p.pub.Remote.Resource, namespace, name}); ok {
		return e.describe(p.pub, nil, &h), true
	}
	e.admin.mu.Lock()
	var found *handledIntent
	for _, h := range e.admin.handled {
		k := h.key
		if h.workspacePath == workspace && k.GetResource().GetGroup() == p.pub.Remote.Group &&
			k.GetResource().GetResource() == p.pub.Remote.Resource && k.GetNamespace() == namespace && k.GetName() == name {
			found = &h
			break
		}
	}
	e.admin.mu.Unlock()
	if found == nil {
		return nil, false
	}
	return e.describe(p.pub, nil, found), true
}

// byLocal finds an object by its local copy.
func (e *Engine) byLocal(group, resource, namespace, name string) (*ferryv1.EdgeAdminServiceGetObjectStateResponse, error) {
	pubs := e.matchPublished(group, resource)
	if len(pubs) == 0 {
		return nil, fmt.Errorf("%w: no PublishedResource of this edge publishes %q", ErrObjectNotFound, resource)
	}
	key := name
	if namespace != "" {
		key = namespace + "/" + name
	}
	for _, p := range pubs {
		if p.w == nil || p.w.store == nil {
			continue
		}
		raw, ok, err := p.w.store.GetByKey(key)
		if err != nil || !ok {
			continue
		}
		if u, ok := raw.(*unstructured.Unstructured); ok {
			return e.describe(p.pub, u, nil), nil
		}
	}
	return nil, fmt.Errorf("%w: no local copy %s of this agent (the edge only knows copies labelled %s=%s)", ErrObjectNotFound, key, naming.LabelAgent, e.opts.Agent)
}

// describe builds the answer from the local copy (nil when there is none)
// and the last intent handled (looked up when nil).
func (e *Engine) describe(pub *Published, local *unstructured.Unstructured, h *handledIntent) *ferryv1.EdgeAdminServiceGetObjectStateResponse {
	out := &ferryv1.EdgeAdminServiceGetObjectStateResponse{PublishedResource: pub.Name}
	if local != nil {
		remote, _ := naming.RemoteFrom(local.GetLabels(), local.GetAnnotations())
		out.Key = remoteKey(pub, remote)
		out.WorkspacePath = remote.WorkspacePath
		out.LocalCopy = &ferryv1.LocalCopy{Namespace: local.GetNamespace(), Name: local.GetName()}
		out.LocalUid = string(local.GetUID())
		out.LocalResourceVersion = local.GetResourceVersion()
		ann := local.GetAnnotations()
		out.Applied = &ferryv1.AppliedState{
			ContentHash: ann[naming.AnnotationContentHash], ResourceVersion: ann[naming.AnnotationResourceVersion], Source: "local copy",
		}
		if h == nil {
			if got, ok := e.lastHandled(keyID(out.Key)); ok {
				h = &got
			}
		}
	}
	if h != nil {
		if out.Key == nil {
			out.Key = h.key
			out.WorkspacePath = h.workspacePath
		}
		out.LastIntent = &ferryv1.HandledIntent{
			Operation: "upsert", Version: h.version, ContentHash: h.hash, HandledAt: timestamppb.New(h.at),
		}
		if !h.upsert {
			out.LastIntent.Operation = "delete"
		}
		if ae := h.err; ae != nil {
			out.LastError = &ferryv1.ObjectError{Source: "intent", Error: ae, At: timestamppb.New(h.at)}
		}
		if a := out.GetApplied(); a != nil && h.upsert && h.err == nil {
			a.Current = a.GetContentHash() == h.hash
		}
	}
	out.Summary = edgeSummary(out)
	return out
}

func edgeSummary(s *ferryv1.EdgeAdminServiceGetObjectStateResponse) string {
	var parts []string
	if lc := s.GetLocalCopy(); lc != nil {
		parts = append(parts, "local copy "+nsName(lc.GetNamespace(), lc.GetName())+" applied from kcp resourceVersion "+s.GetApplied().GetResourceVersion())
	} else {
		parts = append(parts, "no local copy")
	}
	if e := s.GetLastError(); e != nil {
		retry := "final until the object or its PublishedResource changes"
		if e.GetError().GetRetryable() {
			retry = "the broker retries with backoff"
		}
		parts = append(parts, fmt.Sprintf("the last intent failed: %s: %s (%s)",
			protocol.ReasonName(e.GetError().GetReason()), e.GetError().GetMessage(), retry))
	}
	return strings.Join(parts, "; ")
}

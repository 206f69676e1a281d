package replication

import (
	"encoding/json"
	"slices"
	"sort"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/objects"
	"github.com/ferry-dev/ferry/pkg/protocol"
)

// Read-only views of the manager's state for the admin API
// (AdminService.GetObjectState and ListEdges). They read the caches and
// bookkeeping under the manager's lock and change nothing.

// ResyncObserver learns the outcomes of the manager's comparisons of the
// edge's inventory with its caches (metrics; part of the engine's
// Observer).
type ResyncObserver interface {
	// Resynced: one published resource's inventory was compared, over
	// compared objects, after a resync that began at since (zero: unknown).
	Resynced(since time.Time, compared int)
	// ResyncObject: the first comparison of one object after an inventory
	// comparison; unchanged when the edge has its desired state.
	ResyncObject(unchanged bool)
}

// resyncObserver is the manager's ResyncObserver; one that observes
// nothing when Options.Metrics is nil.
func (m *Manager) resyncObserver() ResyncObserver {
	if m.opts.Metrics == nil {
		return noResyncObserver{}
	}
	return m.opts.Metrics
}

type noResyncObserver struct{}

func (noResyncObserver) Resynced(time.Time, int) {}
func (noResyncObserver) ResyncObject(bool)       {}

// ResourceRef is one published resource of the manager.
type ResourceRef struct {
	// PublishedResource is the edge's PublishedResource name.
	PublishedResource string
	// GVR is the resource as served in kcp.
	GVR schema.GroupVersionResource
}

// MatchResources returns the published resources served as resource
// (plural) in group; an empty group matches every group. Ordered by
// PublishedResource name.
func (m *Manager) MatchResources(group, resource string) []ResourceRef {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []ResourceRef
	for pr, res := range m.desired {
		if res.GVR.Resource == resource && (group == "" || res.GVR.Group == group) {
			out = append(out, ResourceRef{PublishedResource: pr, GVR: res.GVR})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PublishedResource < out[j].PublishedResource })
	return out
}

// ResourceStats counts one published resource's objects.
type ResourceStats struct {
	ResourceRef
	// Objects in the cache.
	Objects int
	// Applied objects: those whose applied content hash the edge reported.
	Applied int
	// Listed tells whether the initial list is in the cache.
	Listed bool
	// AwaitingInventory tells whether the resource's intents wait for the
	// edge's inventory.
	AwaitingInventory bool
}

// ResourceStats returns the figures of every published resource, ordered by
// PublishedResource name.
func (m *Manager) ResourceStats() []ResourceStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]ResourceStats, 0, len(m.desired))
	for pr, res := range m.desired {
		s := ResourceStats{ResourceRef: ResourceRef{PublishedResource: pr, GVR: res.GVR}, Applied: m.ledger.appliedCount(pr), AwaitingInventory: !m.open[pr]}
		if w, ok := m.running[pr]; ok {
			s.Objects = w.store.Len()
			s.Listed = w.store.listed()
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].PublishedResource < out[j].PublishedResource })
	return out
}

// ObjectView is what the manager knows of one primary object.
type ObjectView struct {
	ResourceRef
	// Key is the object's protocol key: from the cache, or, for an object
	// gone from kcp, from the copy the edge may hold.
	Key *ferryv1.ObjectKey
	// Cached tells whether the object is in the cache (it exists in kcp);
	// the fields below up to InScope are set only then.
	Cached            bool
	ResourceVersion   string
	Generation        int64
	DeletionTimestamp *metav1.Time
	// Finalizer tells whether the object carries the edge's finalizer.
	Finalizer bool
	// InScope tells whether the object matches the PublishedResource's
	// filters.
	InScope bool
	// DesiredHash is the content hash of the state the edge should apply;
	// empty when the object is not to be applied (deleting, out of scope)
	// or its workspace path is not known yet. It is sent without waiting
	// for the finalizer.
	DesiredHash string
	// AppliedHash is the content hash the edge is known to have applied.
	AppliedHash string
	// Held tells whether the edge refused the object with a final error.
	Held bool
	// AwaitingInventory tells whether the resource waits for the edge's
	// inventory.
	AwaitingInventory bool
}

// Lookup returns the view of pr's object cluster/namespace/name; false when
// the manager knows nothing of it (not in kcp as far as the cache shows, and
// no copy at the edge).
func (m *Manager) Lookup(pr, cluster, namespace, name string) (ObjectView, bool) {
	it := item{pr: pr, key: cluster + "|" + namespace + "/" + name}
	m.mu.Lock()
	res, published := m.desired[pr]
	w, running := m.running[pr]
	// The records of every object (UID) at this name: the cached object's
	// below, or a copy the edge may hold of one that is gone.
	records := map[string]record{}
	var copyKey *ferryv1.ObjectKey
	for id, r := range m.ledger.records(it) {
		records[id.uid] = *r
		if r.copy && (copyKey == nil || id.uid < copyKey.GetUid()) {
			copyKey = r.key
		}
	}
	v := ObjectView{
		ResourceRef:       ResourceRef{PublishedResource: pr, GVR: res.GVR},
		AwaitingInventory: published && !m.open[pr],
	}
	m.mu.Unlock()
	if !published {
		return ObjectView{}, false
	}
	var obj *unstructured.Unstructured
	if running {
		if raw, ok, err := w.store.GetByKey(it.key); err == nil && ok {
			obj, _ = raw.(*unstructured.Unstructured)
		}
	}
	if obj == nil {
		if copyKey == nil {
			return ObjectView{}, false
		}
		v.Key = copyKey
		r := records[copyKey.GetUid()]
		v.AppliedHash, v.Held = r.applied, r.rejected
		return v, true
	}
	r := records[string(obj.GetUID())]
	v.AppliedHash, v.Held = r.applied, r.rejected
	v.Cached = true
	v.Key = objectKey(obj, res.GVR)
	v.ResourceVersion, v.Generation, v.DeletionTimestamp = obj.GetResourceVersion(), obj.GetGeneration(), obj.GetDeletionTimestamp()
	v.Finalizer = slices.Contains(obj.GetFinalizers(), m.finalizer)
	v.InScope = m.scopeOf(res, obj) == inScope
	if v.InScope && v.DeletionTimestamp == nil {
		v.DesiredHash = m.desiredHash(res, obj)
	}
	return v, true
}

// desiredHash is the content hash process would send for obj, or "" when
// it needs the workspace path and the path is not cached yet.
func (m *Manager) desiredHash(res Resource, obj *unstructured.Unstructured) string {
	data, err := json.Marshal(objects.DesiredState(obj).Object)
	if err != nil {
		return ""
	}
	upsert := &ferryv1.UpsertIntent{Object: data}
	if res.WorkspacePaths {
		m.mu.Lock()
		p, ok := m.paths[objectKey(obj, res.GVR).GetCluster()]
		m.mu.Unlock()
		if !ok {
			return ""
		}
		upsert.WorkspacePath = p
	}
	return ContentHash(upsert)
}

// WorkspaceCluster returns the logical cluster of a workspace path the
// manager resolved before (for resources with workspace paths).
func (m *Manager) WorkspaceCluster(path string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for cluster, p := range m.paths {
		if p == path {
			return cluster, true
		}
	}
	return "", false
}

// IntentEntry is an intent in the outbox.
type IntentEntry struct {
	// Intent is the queued intent (its version's sequence is Seq).
	Intent *ferryv1.SyncIntent
	// Seq is the sequence the intent is (or will be) sent with.
	Seq uint64
	// Queued is when the intent was queued.
	Queued time.Time
}

// Lookup returns the pending and the in-flight intent of a primary object
// (either may be nil).
func (o *Intents) Lookup(key *ferryv1.ObjectKey) (pending, inFlight *IntentEntry) {
	k := protocol.IntentKey(key, nil)
	if e, ok := o.box.Pending(k); ok {
		pending = &IntentEntry{Intent: e.Value, Seq: e.Seq, Queued: e.Queued()}
	}
	if e, ok := o.box.InFlight(k); ok {
		inFlight = &IntentEntry{Intent: e.Value, Seq: e.Seq, Queued: e.Queued()}
	}
	return pending, inFlight
}

// Epoch is the broker epoch the outbox stamps on intent versions.
func (o *Intents) Epoch() uint64 { return o.epoch }

// Syncs tells whether key is an object the manager syncs: its resource is
// published and its cache holds the object with key's UID.
func (m *Manager) Syncs(key *ferryv1.ObjectKey) bool {
	pr, ok := m.PublishedResourceFor(key)
	if !ok {
		return false
	}
	obj, err := m.cached(pr, key)
	return err == nil && obj != nil
}

package replication

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/pkg/logging"
	"github.com/ferry-dev/ferry/pkg/mutation"

	"github.com/kcp-dev/logicalcluster/v3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/objects"
	"github.com/ferry-dev/ferry/pkg/related"
)

// Related objects on the broker.
//
// Every related resource (e.g. v1 secrets) is watched once across all bound
// workspaces through the APIExport's permission claim: unfiltered when some
// entry originates in kcp (the consumer's objects carry no label), else only
// ferry's own copies (label ferry.dev/related-to).
//
// Origin kcp: once the edge has applied a primary, each entry's reference is
// evaluated on the kcp primary and the object found there is sent down as a
// SyncIntent with related_to (or a delete when there is none); changes of
// the object requeue every primary pointing at it.
//
// Origin service: the edge reports the object; the broker evaluates the
// reference on the kcp primary and writes the copy there, labelled with the
// primary's UID and the entry and owned by the primary. Copies are deleted
// when the edge reports the object gone, when the reference moves, and —
// before the finalizer is released — when the primary is deleted.

// relatedOwnerIndex indexes related copies in kcp by their primary's UID.
const relatedOwnerIndex = "ferry.dev/related-to"

// FieldManager is the broker's field manager for writes into kcp.
const FieldManager = "ferry-broker"

// ErrRefused marks a report the broker will not apply (not retried).
var ErrRefused = errors.New("refused")

type relatedWatcher struct {
	gvr        schema.GroupVersionResource
	unfiltered bool
	store      *shardedWatch
	// started is when the watch began; a release waits at most
	// Options.RelatedListWait past it for the watch to list.
	started time.Time
}

func indexRelatedOwner(obj any) ([]string, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, nil
	}
	if uid := u.GetLabels()[naming.LabelRelatedTo]; uid != "" {
		return []string{uid}, nil
	}
	return nil, nil
}

// related returns res's entry by identifier.
func (res Resource) related(id string) *related.Reference {
	for _, r := range res.Related {
		if r.Identifier == id {
			return r
		}
	}
	return nil
}

// reconcileRelatedLocked runs exactly the related watches the desired
// resources need.
func (m *Manager) reconcileRelatedLocked() {
	needed := map[schema.GroupVersionResource]bool{} // → unfiltered
	for _, res := range m.desired {
		for _, r := range res.Related {
			needed[r.Resource] = needed[r.Resource] || r.Origin == ferryv1alpha1.OriginKCP
		}
	}
	for gvr, rw := range m.relWatchers {
		if unfiltered, ok := needed[gvr]; !ok || unfiltered != rw.unfiltered {
			rw.store.stop()
			delete(m.relWatchers, gvr)
		}
	}
	for gvr, unfiltered := range needed {
		if _, ok := m.relWatchers[gvr]; ok {
			continue
		}
		rw := &relatedWatcher{gvr: gvr, unfiltered: unfiltered, started: time.Now()}
		selector := naming.LabelRelatedTo
		if unfiltered {
			selector = ""
		}
		// m.relatedSynced waits for m.mu: rw is running before it is called.
		rw.store = m.watchLocked(gvr, selector, cache.Indexers{relatedOwnerIndex: indexRelatedOwner},
			func(key string) { m.relatedObjectChanged(gvr, key) }, m.relatedSynced)
		m.relWatchers[gvr] = rw
		m.opts.Log.Info("watching related resource", "resource", gvr.String(), "selector", selector)
	}
}

// relatedPlace is a related object's place in kcp: its resource and
// where it is.
type relatedPlace struct {
	gvr schema.GroupVersionResource
	objectName
}

// refKey is p's key in relRefs (a refindex keys its targets by string).
func (p relatedPlace) refKey() string { return p.gvr.String() + "#" + p.storeKey() }

// relatedObjectChanged requeues the primaries whose kcp-origin reference
// points at a changed object.
func (m *Manager) relatedObjectChanged(gvr schema.GroupVersionResource, key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := relatedPlace{gvr: gvr, objectName: parseStoreKey(key)}
	m.relRefs.To(p.refKey(), m.queue.Add)
	if it, ok := m.relCopies[p]; ok {
		m.queue.Add(it) // a copy changed in kcp: written again from the report
	}
}

// relatedListed tells whether the watch of a related kind has listed.
func (m *Manager) relatedListed(gvr schema.GroupVersionResource) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	rw := m.relWatchers[gvr]
	return rw != nil && rw.store.listed()
}

// relatedSynced requeues every reference each time a related watch has
// listed at an endpoint: those into that shard's workspaces can be
// resolved now.
func (m *Manager) relatedSynced() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.relRefs.All(m.queue.Add)
}

// queueRelatedLocked queues the kcp-origin references of an applied
// primary.
func (m *Manager) queueRelatedLocked(pr, key string) {
	if !m.ledger.appliedAt(item{pr: pr, key: key}) {
		return
	}
	for _, r := range m.desired[pr].Related {
		if r.Origin == ferryv1alpha1.OriginKCP {
			m.queue.Add(item{pr: pr, key: key, related: r.Identifier})
		}
	}
}

// queueServiceRelated re-evaluates the service-origin copies of a primary
// that changed in kcp: its reference may now point elsewhere in kcp.
func (m *Manager) queueServiceRelated(pr, key string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.desired[pr].Related {
		it := item{pr: pr, key: key, related: r.Identifier}
		if r.Origin == ferryv1alpha1.OriginService && m.relReports[it] != nil {
			m.queue.Add(it)
		}
	}
}

// processRelated sends the current state of one kcp-origin related object.
func (m *Manager) processRelated(ctx context.Context, it item) error {
	m.mu.Lock()
	w, running := m.running[it.pr]
	res := m.desired[it.pr]
	applied := m.ledger.appliedAt(item{pr: it.pr, key: it.key})
	// Held, like the primaries, until the edge's inventory tells what it
	// holds (openLocked requeues the primaries, and they their references).
	open := m.open[it.pr]
	m.mu.Unlock()
	ref := res.related(it.related)
	if running && ref != nil && ref.Origin == ferryv1alpha1.OriginService {
		m.mu.Lock()
		r := m.relReports[it]
		m.mu.Unlock()
		if r == nil {
			return nil
		}
		return m.WriteRelated(ctx, it.pr, r)
	}
	if !running || ref == nil || ref.Origin != ferryv1alpha1.OriginKCP || !applied || !open {
		return nil
	}
	raw, exists, err := w.store.GetByKey(it.key)
	if err != nil || !exists {
		m.mu.Lock()
		m.relRefs.Point(it, "")
		m.relSent.forget(it)
		delete(m.relNotes, it)
		m.mu.Unlock()
		return err
	}
	primary := raw.(*unstructured.Unstructured)
	if primary.GetDeletionTimestamp() != nil {
		return nil // the edge deletes the copies along with the primary
	}
	primaryKey := objectKey(primary, w.res.GVR)
	cluster := logicalcluster.From(primary).String()
	env, err := m.relatedEnv(ctx, ref, cluster)
	if err != nil {
		return err
	}
	ns, name, err := ref.Locate(primary.Object, env)
	if err != nil {
		m.mu.Lock()
		m.relRefs.Point(it, "")
		m.mu.Unlock()
		m.note(ctx, it, primaryKey, "Warning", "RelatedUnresolved", err.Error())
		return nil
	}
	src := relatedPlace{gvr: ref.Resource, objectName: objectName{cluster: cluster, namespace: ns, name: name}}
	srcKey := src.storeKey()
	m.mu.Lock()
	m.relRefs.Point(it, src.refKey())
	rw := m.relWatchers[ref.Resource]
	m.mu.Unlock()
	if rw == nil || !m.listedFor(rw.store, cluster) {
		return nil // requeued when the watch has listed
	}
	gvr := &ferryv1.GroupVersionResource{Group: ref.Resource.Group, Version: ref.Resource.Version, Resource: ref.Resource.Resource}
	in := &ferryv1.SyncIntent{
		Key:               &ferryv1.ObjectKey{Cluster: cluster, Resource: gvr, Namespace: ns, Name: name},
		PublishedResource: it.pr,
		RelatedTo:         &ferryv1.RelatedTo{Primary: primaryKey, Identifier: ref.Identifier},
		Version:           &ferryv1.ObjectVersion{},
	}
	raw, exists, err = rw.store.GetByKey(srcKey)
	if err != nil {
		return err
	}
	sent := relatedDeleted
	if exists {
		src := raw.(*unstructured.Unstructured)
		content := objects.RelatedContent(src)
		// The entry's mutation shapes what the edge writes; the state is
		// the hash of exactly that (the edge's inventory lists it).
		if err := ref.MutateContent(content.Object, mutation.Objects{Remote: src.Object}); err != nil {
			m.note(ctx, it, primaryKey, "Warning", "RelatedMutationFailed", fmt.Sprintf("%v; %s %s/%s is not sent to the service cluster", err, ref.Kind.Kind, ns, name))
			return nil
		}
		data, err := json.Marshal(content.Object)
		if err != nil {
			return fmt.Errorf("cannot encode %s: %w", srcKey, err)
		}
		in.Key.Uid = string(src.GetUID())
		in.Version.ResourceVersion = src.GetResourceVersion()
		in.Operation = &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{Object: data}}
		sent = relatedState(cluster, ns, name, string(src.GetUID()), objects.RelatedHash(content))
		m.clearNote(it)
	} else {
		in.Operation = &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{}}
		m.note(ctx, it, primaryKey, "Normal", "RelatedMissing",
			fmt.Sprintf("related %q: waiting for %s %s/%s in this workspace", ref.Identifier, ref.Kind.Kind, ns, name))
	}
	m.mu.Lock()
	send, drop := m.relSent.next(it, primaryKey.GetUid(), sent)
	m.mu.Unlock()
	switch {
	case send:
		m.opts.Outbox.Put(in)
	case drop:
		// The edge's inventory shows it holds this state: an intent the
		// previous stream did not deliver is obsolete.
		m.opts.Outbox.Drop(in.GetKey(), in.GetRelatedTo())
	}
	return nil
}

// WriteRelated applies a related object the edge reported (origin service)
// to the primary's workspace. Errors wrapping ErrRefused are final.
func (m *Manager) WriteRelated(ctx context.Context, pr string, r *ferryv1.RelatedObjectReport) error {
	id := r.GetRelatedTo().GetIdentifier()
	m.mu.Lock()
	res, known := m.desired[pr]
	w, running := m.running[pr]
	m.mu.Unlock()
	ref := res.related(id)
	if !known || ref == nil || ref.Origin != ferryv1alpha1.OriginService {
		m.refused.Add(1)
		return fmt.Errorf("%w: PublishedResource %q has no related entry %q that originates on the service cluster", ErrRefused, pr, id)
	}
	pk := r.GetRelatedTo().GetPrimary()
	if !running || !m.listedFor(w.store, pk.GetCluster()) {
		// Not an answer: after a broker restart the edge re-reports before
		// the watch has listed the primaries.
		return errors.New("the published resource is not listed yet")
	}
	if err := m.checkKey(pr, pk); err != nil {
		return err
	}
	it := item{pr: pr, key: storeKey(pk), related: id}
	raw, exists, err := w.store.GetByKey(storeKey(pk))
	if err != nil || !exists {
		m.mu.Lock()
		delete(m.relReports, it)
		m.mu.Unlock()
		return err // the primary is gone: nothing to write
	}
	primary := raw.(*unstructured.Unstructured)
	if string(primary.GetUID()) != pk.GetUid() || primary.GetDeletionTimestamp() != nil {
		return nil // another object now, or being deleted (copies go with it)
	}
	if !m.holds(pr, res, primary) {
		m.refused.Add(1)
		return fmt.Errorf("%w: %s is not synced for this edge (no finalizer, or outside the PublishedResource's filters)", ErrRefused, KeyString(pk))
	}
	m.mu.Lock()
	m.relReports[it] = r
	rw := m.relWatchers[ref.Resource]
	m.mu.Unlock()
	if rw == nil || !m.listedFor(rw.store, pk.GetCluster()) {
		return fmt.Errorf("the watch of %s in kcp has not listed yet", ref.Resource)
	}
	copies := copiesOf(rw, pk.GetUid(), id)
	var content map[string]any
	switch state := r.GetState().(type) {
	case *ferryv1.RelatedObjectReport_Unresolved:
		m.note(ctx, it, pk, "Warning", "RelatedUnresolved", fmt.Sprintf("related %q: %s", id, state.Unresolved.GetMessage()))
		return nil
	case *ferryv1.RelatedObjectReport_Gone:
		m.note(ctx, it, pk, "Normal", "RelatedMissing", relatedMissingMessage(ref, r.GetLocalNamespace(), r.GetLocalName()))
		return m.deleteCopies(ctx, ref.Resource, copies, nil)
	case *ferryv1.RelatedObjectReport_Error:
		// The edge refuses to read the object (a place the tenant may not
		// reach) or to copy it (more than one primary points at it): no
		// data moves, and a copy written before goes.
		reason := "RelatedNotSynced"
		switch state.Error.GetReason() {
		case ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN:
			reason = "RelatedForbidden"
		case ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT:
			reason = "RelatedConflict"
		}
		m.note(ctx, it, pk, "Warning", reason, state.Error.GetMessage())
		return m.deleteCopies(ctx, ref.Resource, copies, nil)
	case *ferryv1.RelatedObjectReport_Object:
		if ref.IsSelector() || ref.IsList() {
			return fmt.Errorf("%w: related %q names several objects; the report names one", ErrRefused, id)
		}
		if err := json.Unmarshal(state.Object, &content); err != nil {
			return fmt.Errorf("%w: the related object is not JSON: %v", ErrRefused, err)
		}
	case *ferryv1.RelatedObjectReport_Objects:
		switch {
		case ref.IsSelector():
			return m.writeRelatedSet(ctx, it, pk, primary, ref, copies, state.Objects)
		case ref.IsList():
			return m.writeRelatedList(ctx, it, pk, primary, ref, copies, state.Objects)
		}
		return fmt.Errorf("%w: related %q locates one object by name; the report holds a set", ErrRefused, id)
	default:
		return fmt.Errorf("%w: the report has no state", ErrRefused)
	}
	env, err := m.relatedEnv(ctx, ref, pk.GetCluster())
	if err != nil {
		return err
	}
	ns, name, err := ref.Locate(primary.Object, env)
	if err != nil {
		m.note(ctx, it, pk, "Warning", "RelatedUnresolved", err.Error())
		return nil
	}
	existing := findCopy(copies, ns, name)
	// The reference moved: copies elsewhere go.
	if err := m.deleteCopies(ctx, ref.Resource, copies, existing); err != nil {
		return err
	}
	return m.writeCopy(ctx, it, pk, primary, ref, ns, name, content, existing)
}

// findCopy returns the copy at ns/name among copies (nil when none).
func findCopy(copies []*unstructured.Unstructured, ns, name string) *unstructured.Unstructured {
	for _, c := range copies {
		if c.GetNamespace() == ns && c.GetName() == name {
			return c
		}
	}
	return nil
}

// writeRelatedSet writes every object a label-selected entry found for
// primary into the namespace the entry locates on the kcp primary, under
// the names the edge's rewrite gave them, and deletes the entry's copies
// of objects no longer found.
func (m *Manager) writeRelatedSet(ctx context.Context, it item, pk *ferryv1.ObjectKey, primary *unstructured.Unstructured, ref *related.Reference, copies []*unstructured.Unstructured, set *ferryv1.RelatedObjectSet) error {
	env, err := m.relatedEnv(ctx, ref, pk.GetCluster())
	if err != nil {
		return err
	}
	ns, err := ref.LocateNamespace(primary.Object, env)
	if err != nil {
		m.note(ctx, it, pk, "Warning", "RelatedUnresolved", err.Error())
		return nil
	}
	type entry struct {
		name     string
		content  map[string]any
		existing *unstructured.Unstructured
	}
	entries := make([]entry, 0, len(set.GetEntries()))
	seen := map[string]bool{}
	for _, e := range set.GetEntries() {
		if errs := validation.IsDNS1123Subdomain(e.GetName()); len(errs) > 0 {
			return fmt.Errorf("%w: related %q: the name %q is not valid: %s", ErrRefused, ref.Identifier, e.GetName(), strings.Join(errs, "; "))
		}
		if seen[e.GetName()] {
			return fmt.Errorf("%w: related %q: the name %q appears twice", ErrRefused, ref.Identifier, e.GetName())
		}
		seen[e.GetName()] = true
		var content map[string]any
		if err := json.Unmarshal(e.GetObject(), &content); err != nil {
			return fmt.Errorf("%w: related object %s is not JSON: %v", ErrRefused, e.GetLocalName(), err)
		}
		entries = append(entries, entry{name: e.GetName(), content: content, existing: findCopy(copies, ns, e.GetName())})
	}
	// Objects no longer found (or found under another name) go.
	stale := slices.DeleteFunc(slices.Clone(copies), func(c *unstructured.Unstructured) bool {
		return c.GetNamespace() == ns && seen[c.GetName()]
	})
	if err := m.deleteCopies(ctx, ref.Resource, stale, nil); err != nil {
		return err
	}
	for _, e := range entries {
		if err := m.writeCopy(ctx, it, pk, primary, ref, ns, e.name, e.content, e.existing); err != nil {
			return err
		}
	}
	return nil
}

// writeCopy creates or updates the copy of a service-origin related
// object at ns/name in the primary's workspace; existing is the copy
// already there (nil when none is known).
func (m *Manager) writeCopy(ctx context.Context, it item, pk *ferryv1.ObjectKey, primary *unstructured.Unstructured, ref *related.Reference, ns, name string, content map[string]any, existing *unstructured.Unstructured) error {
	id := ref.Identifier
	desired := objects.RelatedContent(&unstructured.Unstructured{Object: content})
	// The entry's mutation shapes the copy (related_mutation.go).
	if err := mutateCopy(ref, desired, content, existing); err != nil {
		m.note(ctx, it, pk, "Warning", "RelatedMutationFailed", fmt.Sprintf("%v; %s %s/%s is not written", err, ref.Kind.Kind, ns, name))
		return nil
	}
	desired.SetAPIVersion(ref.Kind.GroupVersion().String())
	desired.SetKind(ref.Kind.Kind)
	desired.SetNamespace(ns)
	desired.SetName(name)
	desired.SetLabels(objects.MergeStrings(desired.GetLabels(), map[string]string{naming.LabelRelatedTo: pk.GetUid(), naming.LabelRelatedIdentifier: id}))
	if ns == primary.GetNamespace() && ref.Cleanup {
		// A safety net only (and never when the copy outlives the primary) (copies are deleted explicitly, found by their
		// labels): kcp's garbage collector refuses an owner in another
		// namespace and would delete the copy again and again.
		desired.SetOwnerReferences([]metav1.OwnerReference{{
			APIVersion: primary.GetAPIVersion(), Kind: primary.GetKind(), Name: primary.GetName(), UID: primary.GetUID(),
		}})
	}
	client, err := m.client(pk.GetCluster())
	if err != nil {
		return err
	}
	ri := client.Resource(ref.Resource).Namespace(ns)
	m.mu.Lock()
	m.relCopies[relatedPlace{gvr: ref.Resource, objectName: objectName{cluster: pk.GetCluster(), namespace: ns, name: name}}] = it
	m.mu.Unlock()
	var written *unstructured.Unstructured
	if existing == nil {
		written, err = ri.Create(ctx, desired, metav1.CreateOptions{FieldManager: FieldManager})
		if apierrors.IsNotFound(err) {
			// The namespace does not exist in the workspace (yet): created
			// through the namespaces claim, then the copy.
			if nsErr := m.ensureNamespace(ctx, client, ns); nsErr != nil {
				m.note(ctx, it, pk, "Warning", "RelatedNotWritten", fmt.Sprintf(
					"related %q: namespace %s does not exist in this workspace and the broker cannot create it (retrying): %v", id, ns, nsErr))
				return fmt.Errorf("cannot create namespace %s for related %s: %w", ns, ref.Kind.Kind, nsErr)
			}
			written, err = ri.Create(ctx, desired, metav1.CreateOptions{FieldManager: FieldManager})
		}
		if apierrors.IsAlreadyExists(err) {
			// Ours, but not in the watch yet (written moments ago)?
			got, getErr := ri.Get(ctx, name, metav1.GetOptions{})
			if getErr != nil {
				return fmt.Errorf("cannot read %s %s/%s: %w", ref.Kind.Kind, ns, name, getErr)
			}
			if l := got.GetLabels(); l[naming.LabelRelatedTo] == pk.GetUid() && l[naming.LabelRelatedIdentifier] == id {
				existing, err = got, nil
			}
		}
	}
	if existing == nil {
		switch {
		case apierrors.IsAlreadyExists(err):
			m.note(ctx, it, pk, "Warning", "RelatedConflict", fmt.Sprintf(
				"related %q: %s %s/%s already exists in this workspace and was not created by ferry for this object; not overwriting it",
				id, ref.Kind.Kind, ns, name))
			return nil
		case apierrors.IsNotFound(err):
			m.note(ctx, it, pk, "Warning", "RelatedNotWritten", fmt.Sprintf(
				"related %q: cannot create %s %s/%s (retrying): %v", id, ref.Kind.Kind, ns, name, err))
			return fmt.Errorf("cannot create related %s %s/%s: %w", ref.Kind.Kind, ns, name, err)
		case err != nil:
			return fmt.Errorf("cannot create related %s %s/%s: %w", ref.Kind.Kind, ns, name, err)
		}
		if err := writeRelatedStatus(ctx, ri, ref, written, desired); err != nil {
			return err
		}
		m.clearNote(it)
		return nil
	}
	if sameRelated(existing, desired) {
		m.clearNote(it)
		return nil
	}
	// kcp's own labels and annotations (e.g. its claim label) stay.
	desired.SetLabels(objects.MergeStrings(kcpInternal(existing.GetLabels()), desired.GetLabels()))
	desired.SetAnnotations(objects.MergeStrings(kcpInternal(existing.GetAnnotations()), desired.GetAnnotations()))
	desired.SetResourceVersion(existing.GetResourceVersion())
	desired.SetUID(existing.GetUID())
	if written, err = ri.Update(ctx, desired, metav1.UpdateOptions{FieldManager: FieldManager}); err != nil {
		return fmt.Errorf("cannot update related %s %s/%s: %w", ref.Kind.Kind, ns, name, err)
	}
	if err := writeRelatedStatus(ctx, ri, ref, written, desired); err != nil {
		return err
	}
	m.clearNote(it)
	return nil
}

// writeRelatedStatus writes desired's status to written, the copy as
// create or update returned it, when ref carries status (syncStatus) and
// the write did not (the kind has a status subresource, which create and
// update ignore).
func writeRelatedStatus(ctx context.Context, ri dynamic.ResourceInterface, ref *related.Reference, written, desired *unstructured.Unstructured) error {
	want, ok := desired.Object["status"]
	if !ref.SyncStatus || !ok || written == nil || reflect.DeepEqual(written.Object["status"], want) {
		return nil
	}
	u := written.DeepCopy()
	u.Object["status"] = want
	if _, err := ri.UpdateStatus(ctx, u, metav1.UpdateOptions{FieldManager: FieldManager}); err != nil {
		return fmt.Errorf("cannot write the status of related %s %s/%s: %w", ref.Kind.Kind, written.GetNamespace(), written.GetName(), err)
	}
	return nil
}

// relatedEnv is what ref is evaluated with on a kcp primary in cluster:
// the kcp side, the workspace, and its path when a template reads it (the
// edge rejects such a template unless spec.enableWorkspacePaths is set, so
// the edge knows the path as well).
func (m *Manager) relatedEnv(ctx context.Context, ref *related.Reference, cluster string) (related.Env, error) {
	env := related.Env{Side: ferryv1alpha1.OriginKCP, ClusterName: cluster}
	if ref.UsesClusterPath() {
		p, err := m.workspacePath(ctx, cluster)
		if err != nil {
			return env, fmt.Errorf("related %q: cannot find the workspace path of %s: %w", ref.Identifier, cluster, err)
		}
		env.ClusterPath = p
	}
	return env, nil
}

var namespacesGVR = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}

// ensureNamespace creates namespace ns in the workspace client points at
// (through the APIExport's namespaces claim); one that exists is fine.
func (m *Manager) ensureNamespace(ctx context.Context, client dynamic.Interface, ns string) error {
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": ns}}}
	_, err := client.Resource(namespacesGVR).Create(ctx, obj, metav1.CreateOptions{FieldManager: FieldManager})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

// sameRelated tells whether a copy in kcp already holds desired's content,
// labels, annotations and owner.
func sameRelated(existing, desired *unstructured.Unstructured) bool {
	if !reflect.DeepEqual(withoutKCPInternal(existing.GetLabels()), withoutKCPInternal(desired.GetLabels())) ||
		!reflect.DeepEqual(withoutKCPInternal(existing.GetAnnotations()), withoutKCPInternal(desired.GetAnnotations())) ||
		!reflect.DeepEqual(existing.GetOwnerReferences(), desired.GetOwnerReferences()) {
		return false
	}
	for k, v := range desired.Object {
		if k != "metadata" && !reflect.DeepEqual(existing.Object[k], v) {
			return false
		}
	}
	for k := range existing.Object {
		if _, ok := desired.Object[k]; !ok && k != "metadata" {
			return false
		}
	}
	return true
}

func copiesOf(rw *relatedWatcher, uid, id string) []*unstructured.Unstructured {
	objs, _ := rw.store.ByIndex(relatedOwnerIndex, uid)
	var out []*unstructured.Unstructured
	for _, o := range objs {
		u := o.(*unstructured.Unstructured)
		if id == "" || u.GetLabels()[naming.LabelRelatedIdentifier] == id {
			out = append(out, u)
		}
	}
	return out
}

// deleteCopies deletes copies except keep.
func (m *Manager) deleteCopies(ctx context.Context, gvr schema.GroupVersionResource, copies []*unstructured.Unstructured, keep *unstructured.Unstructured) error {
	for _, c := range copies {
		if c == keep {
			continue
		}
		m.mu.Lock()
		delete(m.relCopies, relatedPlace{gvr: gvr, objectName: nameOf(c)})
		m.mu.Unlock()
		client, err := m.client(logicalcluster.From(c).String())
		if err != nil {
			return err
		}
		uid := c.GetUID()
		err = client.Resource(gvr).Namespace(c.GetNamespace()).Delete(ctx, c.GetName(), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !objectGone(err, c.GetName()) && !apierrors.IsConflict(err) {
			return fmt.Errorf("cannot delete related %s %s/%s: %w", c.GetKind(), c.GetNamespace(), c.GetName(), err)
		}
	}
	return nil
}

// releaseCopies hands copies of a deleted primary (by its UID) whose entry
// says cleanup: false over to the workspace: ferry's labels and the owner
// reference to the primary go (kcp's garbage collector would delete the
// copy with its owner), and ferry never finds the copy again.
func (m *Manager) releaseCopies(ctx context.Context, gvr schema.GroupVersionResource, copies []*unstructured.Unstructured, primaryUID string) error {
	for _, c := range copies {
		m.mu.Lock()
		delete(m.relCopies, relatedPlace{gvr: gvr, objectName: nameOf(c)})
		m.mu.Unlock()
		client, err := m.client(logicalcluster.From(c).String())
		if err != nil {
			return err
		}
		owners := []any{}
		for _, o := range c.GetOwnerReferences() {
			if string(o.UID) != primaryUID {
				owners = append(owners, map[string]any{"apiVersion": o.APIVersion, "kind": o.Kind, "name": o.Name, "uid": string(o.UID)})
			}
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
			// The UID is a precondition: exactly this copy.
			"uid":             string(c.GetUID()),
			"labels":          map[string]any{naming.LabelRelatedTo: nil, naming.LabelRelatedIdentifier: nil},
			"ownerReferences": owners,
		}})
		if err != nil {
			return err
		}
		_, err = client.Resource(gvr).Namespace(c.GetNamespace()).Patch(ctx, c.GetName(), types.MergePatchType, patch, metav1.PatchOptions{FieldManager: FieldManager})
		if err != nil && !objectGone(err, c.GetName()) && !apierrors.IsConflict(err) {
			return fmt.Errorf("cannot release related %s %s/%s: %w", c.GetKind(), c.GetNamespace(), c.GetName(), err)
		}
	}
	return nil
}

// defaultRelatedListWait is Options.RelatedListWait's default.
const defaultRelatedListWait = time.Minute

// deleteRelatedCopies deletes every service-origin copy of a deleted
// primary, before its finalizer is released. A related kind whose watch
// has not listed is waited for, for a bounded time (Options.RelatedListWait
// since the watch started): then its copies are found by a live list, and
// when that fails too, the finalizer is released anyway with a warning (a
// copy beside its primary still goes with it, through its owner
// reference): one kind kcp will not list must not hold every deletion of
// the resource.
func (m *Manager) deleteRelatedCopies(ctx context.Context, pr string, key *ferryv1.ObjectKey) error {
	type watched struct {
		rw     *relatedWatcher
		synced bool
	}
	m.mu.Lock()
	res := m.desired[pr]
	var watchers []watched
	kept := map[string]bool{} // identifiers with cleanup: false
	for _, r := range res.Related {
		if r.Origin != ferryv1alpha1.OriginService {
			continue
		}
		if !r.Cleanup {
			kept[r.Identifier] = true
		}
		if rw := m.relWatchers[r.Resource]; rw != nil && !slices.ContainsFunc(watchers, func(w watched) bool { return w.rw == rw }) {
			watchers = append(watchers, watched{rw: rw, synced: m.listedFor(rw.store, key.GetCluster())})
		}
	}
	m.mu.Unlock()
	wait := m.opts.RelatedListWait
	if wait <= 0 {
		wait = defaultRelatedListWait
	}
	for _, w := range watchers {
		rw := w.rw
		copies := copiesOf(rw, key.GetUid(), "")
		if !w.synced {
			if waited := time.Since(rw.started); waited < wait {
				return fmt.Errorf("the watch of %s in kcp has not listed yet (waiting %s more before listing directly)", rw.gvr, (wait - waited).Round(time.Second))
			}
			var err error
			if copies, err = m.listRelatedCopies(ctx, rw.gvr, key); err != nil {
				m.opts.Log.Error(err, "the watch of a related kind has not listed and its copies cannot be listed; releasing the deleted object without deleting them",
					logging.KeyObject, KeyString(key), "resource", rw.gvr.String(), "waited", time.Since(rw.started).Round(time.Second).String())
				if evErr := m.recordEvent(ctx, pr, key, "Warning", "RelatedNotDeleted", fmt.Sprintf(
					"the broker cannot list %s in this workspace (%v); copies of this object's related objects may be left behind", rw.gvr.GroupResource(), err)); evErr != nil {
					m.opts.Log.Error(evErr, "cannot record an Event in kcp", logging.KeyObject, KeyString(key))
				}
				continue
			}
		}
		// Only copies in the primary's own workspace: a UID names one object.
		copies = slices.DeleteFunc(copies, func(c *unstructured.Unstructured) bool { return logicalcluster.From(c).String() != key.GetCluster() })
		keep := slices.DeleteFunc(slices.Clone(copies), func(c *unstructured.Unstructured) bool { return !kept[c.GetLabels()[naming.LabelRelatedIdentifier]] })
		copies = slices.DeleteFunc(copies, func(c *unstructured.Unstructured) bool { return kept[c.GetLabels()[naming.LabelRelatedIdentifier]] })
		if err := m.releaseCopies(ctx, rw.gvr, keep, key.GetUid()); err != nil {
			return err
		}
		if err := m.deleteCopies(ctx, rw.gvr, copies, nil); err != nil {
			return err
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range res.Related {
		it := item{pr: pr, key: storeKey(key), related: r.Identifier}
		delete(m.relNotes, it)
		delete(m.relReports, it)
	}
	return nil
}

// listRelatedCopies lists, live in key's workspace, the related copies of
// gvr labelled as key's (by its UID).
func (m *Manager) listRelatedCopies(ctx context.Context, gvr schema.GroupVersionResource, key *ferryv1.ObjectKey) ([]*unstructured.Unstructured, error) {
	client, err := m.client(key.GetCluster())
	if err != nil {
		return nil, err
	}
	list, err := client.Resource(gvr).List(ctx, metav1.ListOptions{LabelSelector: naming.LabelRelatedTo + "=" + key.GetUid()})
	if err != nil {
		return nil, fmt.Errorf("cannot list related %s in kcp: %w", gvr, err)
	}
	out := make([]*unstructured.Unstructured, 0, len(list.Items))
	for i := range list.Items {
		c := &list.Items[i]
		if c.GetLabels()[naming.LabelRelatedTo] != key.GetUid() {
			continue // a fake or old server ignoring the selector
		}
		if logicalcluster.From(c).Empty() {
			c.SetAnnotations(objects.MergeStrings(c.GetAnnotations(), map[string]string{"kcp.io/cluster": key.GetCluster()}))
		}
		out = append(out, c)
	}
	return out, nil
}

// note records a related problem as an Event on the primary, once per
// distinct message.
func (m *Manager) note(ctx context.Context, it item, primary *ferryv1.ObjectKey, eventType, reason, message string) {
	m.mu.Lock()
	same := m.relNotes[it] == message
	m.relNotes[it] = message
	m.mu.Unlock()
	if same {
		return
	}
	if err := m.recordEvent(ctx, it.pr, primary, eventType, reason, message); err != nil {
		m.opts.Log.Error(err, "cannot record an Event in kcp", logging.KeyObject, KeyString(primary), "reason", reason)
	}
}

func (m *Manager) clearNote(it item) {
	m.mu.Lock()
	delete(m.relNotes, it)
	m.mu.Unlock()
}

// kcpInternal returns the kcp-owned entries of m.
func kcpInternal(m map[string]string) map[string]string {
	out := map[string]string{}
	for k, v := range m {
		if objects.IsKCPInternal(k) {
			out[k] = v
		}
	}
	return out
}

// withoutKCPInternal returns m without kcp-owned entries (nil when empty).
func withoutKCPInternal(m map[string]string) map[string]string {
	var out map[string]string
	for k, v := range m {
		if objects.IsKCPInternal(k) {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[k] = v
	}
	return out
}

// ResendRelated sends a kcp-origin related object again though it did not
// change in kcp: the edge's copy was deleted or edited outside ferry and
// the edge keeps no content to repair it from.
func (m *Manager) ResendRelated(pr string, rt *ferryv1.RelatedTo) {
	it := item{pr: pr, key: storeKey(rt.GetPrimary()), related: rt.GetIdentifier()}
	m.mu.Lock()
	m.relSent.again(it)
	m.mu.Unlock()
	m.queue.Add(it)
}

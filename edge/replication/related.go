package replication

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	"k8s.io/client-go/tools/cache"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/objects"
	"github.com/ferry-dev/ferry/pkg/related"
)

// Related objects on the edge.
//
// Origin service: the edge watches the related resource in the namespaces
// it may read them in (relatedwatch.go; the objects are made by the
// service's controllers, so they carry no label to select on), evaluates
// each primary's reference on the local copy, and reports what it finds — the object, its absence, or
// why the reference cannot be evaluated — whenever either side changes. The
// broker locates the kcp-side object on the kcp primary itself.
//
// Origin kcp: the broker sends the object as a SyncIntent with related_to;
// the edge writes it where the reference points on the local primary,
// labelled with the primary's kcp UID and the entry and annotated with the
// hash of the content it applied, and deletes such copies before it deletes
// the primary. A copy deleted or edited by someone else is asked for again
// (related_repair.go).

// relatedOwnerIndex indexes related copies by primary UID and identifier.
const relatedOwnerIndex = "ferry.dev/related-owner"

// relKey is one primary's reference by one related[] entry: the primary's
// ledger key (its PublishedResource and whole kcp identity) and the entry's
// identifier.
type relKey struct {
	primary ledgerKey
	id      string
}

// relKeyOf is the key of primary's reference by entry id; false when primary
// does not name the kcp object it is a copy of (it has no references).
func relKeyOf(pub *Published, primary *unstructured.Unstructured, id string) (relKey, bool) {
	remote, ok := naming.RemoteFrom(primary.GetLabels(), primary.GetAnnotations())
	if !ok {
		return relKey{}, false
	}
	return relKey{primary: keyFor(pub.Name, remoteKey(pub, remote)), id: id}, true
}

func indexByRelatedOwner(obj any) ([]string, error) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil, nil
	}
	l := u.GetLabels()
	if l[naming.LabelRelatedTo] == "" {
		return nil, nil
	}
	return []string{relatedOwnerKey(l[naming.LabelRelatedTo], l[naming.LabelRelatedIdentifier])}, nil
}

// relatedOwnerKey is relatedOwnerIndex's value for the copies of a primary
// (its kcp UID) by related[] entry identifier.
func relatedOwnerKey(primaryUID, identifier string) string { return primaryUID + "|" + identifier }

// informerObject is an informer event's object, unwrapped from a
// tombstone.
func informerObject(obj any) (*unstructured.Unstructured, bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	u, ok := obj.(*unstructured.Unstructured)
	return u, ok
}

// dropManagedFields keeps the informer caches small: managedFields are
// never read.
func dropManagedFields(obj any) (any, error) {
	if u, ok := obj.(*unstructured.Unstructured); ok {
		u.SetManagedFields(nil)
	}
	return obj, nil
}

func gvrKey(gvr schema.GroupVersionResource, ns, name string) string {
	return gvr.String() + "|" + ns + "/" + name
}

func (p *Published) related(identifier string) *Related {
	for i := range p.Related {
		if p.Related[i].Identifier == identifier {
			return &p.Related[i]
		}
	}
	return nil
}

// relatedChanged re-reports every reference pointing at a changed local
// object.
func (e *Engine) relatedChanged(rw *relatedWatch, obj any) {
	u, ok := informerObject(obj)
	if !ok {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.rereportLocked(gvrKey(rw.gvr, u.GetNamespace(), u.GetName()), relKey{})
	// Label-selected references in the namespace: the object may match
	// now (a Secret labelled later appears by itself).
	e.rereportLocked(gvrKey(rw.gvr, u.GetNamespace(), ""), relKey{})
}

// rereportLocked reports again every reference pointing at key but skip.
func (e *Engine) rereportLocked(key string, skip relKey) {
	if key == "" {
		return
	}
	var refs []relKey
	e.relRefs.To(key, func(rk relKey) {
		if rk != skip {
			refs = append(refs, rk)
		}
	})
	e.relMembers.To(key, func(mk memberKey) {
		if mk.rk != skip && !slices.Contains(refs, mk.rk) {
			refs = append(refs, mk.rk)
		}
	})
	for _, rk := range refs {
		e.reportRefLocked(rk)
	}
}

// reportRelatedLocked reports the service-origin related objects of one
// local primary object.
func (e *Engine) reportRelatedLocked(w *localWatch, obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	for i := range w.pub.Related {
		if w.pub.Related[i].Origin == ferryv1alpha1.OriginService {
			e.reportRelatedRefLocked(w, u, &w.pub.Related[i])
		}
	}
}

// reportLocateError sets report's state for err, the error locating a
// related object on the local primary: FORBIDDEN (a place the edge does not
// read or write) or unresolved. It tells whether there was an error.
func reportLocateError(report *ferryv1.RelatedObjectReport, primary *unstructured.Unstructured, err error) bool {
	switch {
	case err == nil:
		return false
	case errors.Is(err, errForbidden):
		report.State = &ferryv1.RelatedObjectReport_Error{Error: &ferryv1.ApplyError{
			Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN, Message: err.Error(),
		}}
	default:
		report.State = &ferryv1.RelatedObjectReport_Unresolved{Unresolved: &ferryv1.RelatedObjectUnresolved{
			Message: fmt.Sprintf("on the service cluster's copy %s: %v", nsName(primary.GetNamespace(), primary.GetName()), err),
		}}
	}
	return true
}

// reportRelatedRefLocked sends what ref finds for primary when it differs
// from the last report.
func (e *Engine) reportRelatedRefLocked(w *localWatch, primary *unstructured.Unstructured, ref *Related) {
	remote, ok := naming.RemoteFrom(primary.GetLabels(), primary.GetAnnotations())
	if !ok {
		return
	}
	rw := e.relWatches[ref.Local]
	if rw == nil || !e.nsSynced {
		return // reported once the watches have listed
	}
	rk := relKey{primary: keyFor(w.pub.Name, remoteKey(w.pub, remote)), id: ref.Identifier}
	report := &ferryv1.RelatedObjectReport{
		RelatedTo: &ferryv1.RelatedTo{Primary: rk.primary.objectKey(), Identifier: ref.Identifier},
		Resource:  &ferryv1.GroupVersionResource{Group: ref.Local.Group, Version: ref.Local.Version, Resource: ref.Local.Resource},
	}
	switch {
	case ref.IsSelector():
		e.reportSelectedLocked(primary, ref, rw, rk, remote, report)
		return
	case ref.IsList():
		e.reportListedLocked(primary, ref, rw, rk, remote, report)
		return
	}
	ns, name, err := ref.Locate(primary.Object, serviceEnv(remote))
	at := ""
	if err == nil {
		_, err = e.mayRelateLocked(remote.ClusterName, primary.GetNamespace(), ns, ref)
	}
	switch {
	case reportLocateError(report, primary, err):
		if errors.Is(err, errForbidden) {
			// Never read: the consumer wrote the reference.
			report.LocalNamespace, report.LocalName = ns, name
		}
	default:
		if !rw.readyIn(ns) {
			// Reported once the namespace's cache has listed.
			e.waitForSpaceLocked(rw, ns, rk)
			return
		}
		at = gvrKey(ref.Local, ns, name)
		report.LocalNamespace, report.LocalName = ns, name
		// An object without the labels of the entry's watch.labelSelector
		// is not found, also when the informer caches it for another entry
		// of the kind (relatedwatch_selector.go).
		if u, exists := rw.get(ns, name); exists && ref.Watches(u.GetLabels()) {
			data, err := json.Marshal(relatedPayload(ref, u).Object)
			if err != nil {
				return
			}
			report.State = &ferryv1.RelatedObjectReport_Object{Object: data}
		} else {
			report.State = &ferryv1.RelatedObjectReport_Gone{Gone: &ferryv1.RelatedObjectGone{}}
		}
	}
	prev := e.relRefs.At(rk)
	e.relRefs.Point(rk, at)
	if n := e.relRefs.Count(at) + e.relMembers.Count(at); at != "" && n > 1 {
		// Never copied while shared: one workspace would receive what was
		// made for another (a certificate and its private key).
		report.State = &ferryv1.RelatedObjectReport_Error{Error: &ferryv1.ApplyError{
			Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT,
			Message: fmt.Sprintf("related %q: %s %s in the service cluster is referenced by %d objects synced by ferry; it is copied for none of them "+
				"until only one references it (give each its own name, e.g. with a spec mutation that uses the local name)",
				ref.Identifier, ref.ServiceKind, nsName(ns, name), n),
		}}
	}
	if prev != at {
		// Whether the others sharing either object conflict has changed.
		e.rereportLocked(prev, rk)
		e.rereportLocked(at, rk)
	}
	e.sendRelatedLocked(rk, report)
}

// sendRelatedLocked sends report, the state of reference rk, unless it is
// the one sent last.
func (e *Engine) sendRelatedLocked(rk relKey, report *ferryv1.RelatedObjectReport) {
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(report)
	if err != nil {
		return
	}
	sum := sha256.Sum256(data)
	if prev, ok := e.relSum[rk]; ok && prev == sum {
		return
	}
	e.relSum[rk] = sum
	// A service-origin related object the edge refuses (a place it may not
	// read, an object several primaries share) counts on the
	// PublishedResource; an unresolved reference is only not there yet.
	if e.ledger.relatedAnswered(rk, report.GetError() != nil, report.GetError().GetMessage()) {
		e.queue.Add(conditionKey(rk.primary.pr))
	}
	e.report(reportKey{kind: reportRelated, related: rk}, &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_RelatedObjectReport{RelatedObjectReport: report}})
}

// sameIdentity tells whether a and b, two versions of a local primary copy,
// are copies of the same kcp object (their references share keys).
func sameIdentity(p *Published, a, b *unstructured.Unstructured) bool {
	ka, oka := relKeyOf(p, a, "")
	kb, okb := relKeyOf(p, b, "")
	return oka == okb && ka == kb
}

// forgetRelatedLocked drops the references of a local primary that is gone.
func (e *Engine) forgetRelatedLocked(w *localWatch, primary *unstructured.Unstructured) {
	for _, ref := range w.pub.Related {
		rk, ok := relKeyOf(w.pub, primary, ref.Identifier)
		if !ok {
			return // never reported (reportRelatedRefLocked)
		}
		prev := e.relRefs.At(rk)
		e.relRefs.Point(rk, "")
		delete(e.relSum, rk)
		if e.ledger.relatedAnswered(rk, false, "") {
			e.queue.Add(conditionKey(rk.primary.pr))
		}
		e.rereportLocked(prev, rk) // a conflict may be over
		for _, k := range e.setMembersLocked(rk, nil) {
			e.rereportLocked(k, rk)
		}
	}
}

func cacheKeyOf(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

// relatedReady tells whether a related intent can be applied: the primary's
// and the related resource's watches have listed.
func (e *Engine) relatedReady(in *ferryv1.SyncIntent) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	pub := e.published[in.GetPublishedResource()]
	if pub == nil {
		return true // refused by applyRelated
	}
	w := e.watches[pub.Name]
	ref := pub.related(in.GetRelatedTo().GetIdentifier())
	if w == nil || ref == nil {
		return true
	}
	rw := e.relWatches[ref.Local]
	return w.synced && rw != nil && rw.allSynced()
}

// applyRelated writes or deletes the local copy of a related object that
// originates in kcp.
func (e *Engine) applyRelated(ctx context.Context, in *ferryv1.SyncIntent) *ferryv1.IntentResult {
	rt := in.GetRelatedTo()
	e.mu.Lock()
	pub := e.published[in.GetPublishedResource()]
	var w *localWatch
	var ref *Related
	var rw *relatedWatch
	if pub != nil {
		w, ref = e.watches[pub.Name], pub.related(rt.GetIdentifier())
	}
	if ref != nil {
		rw = e.relWatches[ref.Local]
	}
	e.mu.Unlock()
	if w == nil || ref == nil || rw == nil || ref.Origin != ferryv1alpha1.OriginKCP {
		return nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_PUBLISHED, false,
			"PublishedResource %q has no related entry %q that originates in kcp", in.GetPublishedResource(), rt.GetIdentifier())
	}
	copies := rw.owned(relatedOwnerKey(rt.GetPrimary().GetUid(), ref.Identifier))
	if in.GetDelete() != nil {
		if err := e.deleteCopies(ctx, ref, copies, "", ""); err != nil {
			return nack(in, classify(err), true, "%v", err)
		}
		return &ferryv1.IntentResult{Key: in.GetKey(), Version: in.GetVersion()}
	}
	if e.withdrawn(w) {
		return nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_PUBLISHED, true,
			"PublishedResource %s is not valid at the moment (see its Published condition); only deletions are carried out", w.pub.Name)
	}
	pk := rt.GetPrimary()
	primary := e.findLocal(w, remoteOf(pk))
	if primary == nil || !sameObject(primary, pk) {
		return nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_UNAVAILABLE, true,
			"related %q: the primary object has no copy in the service cluster (yet)", ref.Identifier)
	}
	remote, _ := naming.RemoteFrom(primary.GetLabels(), primary.GetAnnotations())
	ns, name, err := ref.Locate(primary.Object, serviceEnv(remote))
	if err != nil {
		return nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_INVALID, false, "on the service cluster's copy %s: %v",
			nsName(primary.GetNamespace(), primary.GetName()), err)
	}
	e.mu.Lock()
	create, err := e.mayRelateLocked(pk.GetCluster(), primary.GetNamespace(), ns, ref)
	e.mu.Unlock()
	if err != nil {
		return nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN, false, "the edge does not write %s %s: %v", ref.ServiceKind, nsName(ns, name), err)
	}
	if create {
		// Labelled for the workspace: from now on the workspace's, and
		// cached by the related watches like every namespace ferry made.
		if err := e.place(ctx, placement{workspace: pk.GetCluster()}, ns); err != nil {
			return nack(in, classify(err), !errors.Is(err, errForbidden), "the edge does not write %s %s: %v", ref.ServiceKind, nsName(ns, name), err)
		}
	}
	var content map[string]any
	if err := utiljson.Unmarshal(in.GetUpsert().GetObject(), &content); err != nil {
		return nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_INVALID, false, "the object is not valid JSON: %v", err)
	}
	local := objects.RelatedContent(&unstructured.Unstructured{Object: content})
	hash := objects.RelatedHash(local)
	for _, c := range copies {
		u := c.(*unstructured.Unstructured)
		if u.GetNamespace() == ns && u.GetName() == name && u.GetAnnotations()[naming.AnnotationContentHash] == hash && !relatedDrifted(u) {
			// The copy holds this content in the fields ferry owns (a
			// re-sent intent): nothing to write.
			return &ferryv1.IntentResult{Key: in.GetKey(), Version: in.GetVersion(), LocalNamespace: ns, LocalName: name}
		}
	}
	if !rw.readyIn(ns) {
		e.mu.Lock()
		e.ensureRelatedWatchesLocked() // a namespace the cache does not hold yet
		e.mu.Unlock()
		return nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_READY, true, "related %q: the edge has not listed %s in namespace %s yet", ref.Identifier, ref.Local.Resource, ns)
	}
	if u, exists := rw.get(ns, name); exists {
		if u.GetLabels()[naming.LabelRelatedTo] != pk.GetUid() {
			return nack(in, ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT, false,
				"related %q: %s %s already exists in the service cluster and was not created by ferry for this object; not overwriting it",
				ref.Identifier, ref.ServiceKind, nsName(ns, name))
		}
	}
	// The reference moved: the copy at the old place goes.
	if err := e.deleteCopies(ctx, ref, copies, ns, name); err != nil {
		return nack(in, classify(err), true, "%v", err)
	}
	local.SetAPIVersion(ref.Local.GroupVersion().String())
	local.SetKind(ref.ServiceKind)
	local.SetNamespace(ns)
	local.SetName(name)
	local.SetLabels(objects.MergeStrings(local.GetLabels(), map[string]string{
		naming.LabelAgent: e.opts.Agent, naming.LabelRelatedTo: pk.GetUid(), naming.LabelRelatedIdentifier: ref.Identifier,
	}))
	key := in.GetKey()
	ann := objects.MergeStrings(local.GetAnnotations(), naming.Annotations(naming.Remote{ClusterName: key.GetCluster(), Namespace: key.GetNamespace(), Name: key.GetName(), UID: key.GetUid()}))
	ann[naming.AnnotationResourceVersion] = in.GetVersion().GetResourceVersion()
	// What ferry applied, to notice edits of the fields it owns
	// (related_repair.go) and to list in the inventory.
	ann[naming.AnnotationContentHash] = hash
	local.SetAnnotations(ann)
	if static, ok := ref.StaticNamespace(); ok && static == ns {
		// The one place related objects may create a namespace: the one the
		// service owner named (shared by all workspaces).
		if err := e.place(ctx, placement{workspace: pk.GetCluster(), static: []string{static}}, ns); err != nil {
			return nack(in, classify(err), true, "%v", err)
		}
	}
	if _, err := e.opts.Dynamic.Resource(ref.Local).Namespace(ns).Apply(ctx, name, local, metav1.ApplyOptions{FieldManager: FieldManager, Force: true}); err != nil {
		if apierrors.IsNotFound(err) {
			e.forgetNamespace(ns)
		}
		return nack(in, classify(err), retryable(err), "the service cluster refused %s %s: %v", ref.ServiceKind, nsName(ns, name), err)
	}
	return &ferryv1.IntentResult{Key: key, Version: in.GetVersion(), LocalNamespace: ns, LocalName: name}
}

// deleteCopies deletes the related copies except the one at keepNS/keepName.
func (e *Engine) deleteCopies(ctx context.Context, ref *Related, copies []any, keepNS, keepName string) error {
	for _, c := range copies {
		u := c.(*unstructured.Unstructured)
		if u.GetNamespace() == keepNS && u.GetName() == keepName {
			continue
		}
		err := e.opts.Dynamic.Resource(ref.Local).Namespace(u.GetNamespace()).Delete(ctx, u.GetName(), metav1.DeleteOptions{
			Preconditions: &metav1.Preconditions{UID: ptrTo(u.GetUID())},
		})
		if err != nil && !apierrors.IsNotFound(err) {
			return fmt.Errorf("cannot delete related %s %s: %w", ref.ServiceKind, nsName(u.GetNamespace(), u.GetName()), err)
		}
	}
	return nil
}

// deleteRelatedCopies deletes the kcp-origin related copies of a primary
// before the primary itself goes; those of entries with cleanup: false, and
// all of them when the primary is orphaned (keep), are released instead.
func (e *Engine) deleteRelatedCopies(ctx context.Context, pub *Published, primaryUID string, keep bool) error {
	for i := range pub.Related {
		ref := &pub.Related[i]
		if ref.Origin != ferryv1alpha1.OriginKCP {
			continue
		}
		e.mu.Lock()
		rw := e.relWatches[ref.Local]
		e.mu.Unlock()
		if rw == nil {
			continue
		}
		copies := rw.owned(relatedOwnerKey(primaryUID, ref.Identifier))
		if keep || !ref.Cleanup {
			if err := e.releaseCopies(ctx, ref, copies); err != nil {
				return err
			}
			continue
		}
		if err := e.deleteCopies(ctx, ref, copies, "", ""); err != nil {
			return err
		}
	}
	return nil
}

// releaseCopies hands the copies of a deleted primary whose entry says
// cleanup: false over to the service cluster: every ferry.dev/ label and
// annotation goes, so no cache, inventory or repair of ferry's finds the
// copy again, and it stays as an ordinary object.
func (e *Engine) releaseCopies(ctx context.Context, ref *Related, copies []any) error {
	for _, c := range copies {
		u := c.(*unstructured.Unstructured)
		labels, annotations := map[string]any{}, map[string]any{}
		for k := range u.GetLabels() {
			if objects.IsFerrys(k) {
				labels[k] = nil
			}
		}
		for k := range u.GetAnnotations() {
			if objects.IsFerrys(k) && k != observedHashKey {
				annotations[k] = nil
			}
		}
		patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
			"uid":    string(u.GetUID()), // a precondition: exactly this copy
			"labels": labels, "annotations": annotations,
		}})
		if err != nil {
			return err
		}
		_, err = e.opts.Dynamic.Resource(ref.Local).Namespace(u.GetNamespace()).Patch(ctx, u.GetName(), types.MergePatchType, patch, metav1.PatchOptions{FieldManager: FieldManager})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return fmt.Errorf("cannot release related %s %s: %w", ref.ServiceKind, nsName(u.GetNamespace(), u.GetName()), err)
		}
	}
	return nil
}

// relatedPayload is what the edge reports of u, a service-origin related
// object of ref: its content, and its status when ref.SyncStatus.
func relatedPayload(ref *Related, u *unstructured.Unstructured) *unstructured.Unstructured {
	out := objects.RelatedContent(u)
	if st, ok := u.Object["status"]; ok && ref.SyncStatus {
		out.Object["status"] = runtime.DeepCopyJSONValue(st)
	}
	return out
}

// serviceEnv is what a related entry is evaluated with on a local primary
// copy of the kcp object remote: the service side and remote's workspace.
func serviceEnv(remote naming.Remote) related.Env {
	return related.Env{Side: ferryv1alpha1.OriginService, ClusterName: remote.ClusterName, ClusterPath: remote.WorkspacePath}
}

func ptrTo[T any](v T) *T { return &v }

package publish

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ferry-dev/ferry/pkg/logging"

	"github.com/go-logr/logr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"
	"sigs.k8s.io/controller-runtime/pkg/source"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/edge/replication"
	"github.com/ferry-dev/ferry/pkg/projection"
	"github.com/ferry-dev/ferry/pkg/related"
	"github.com/ferry-dev/ferry/pkg/templating"
)

// Field indexes: CRDs and PublishedResources by "group/kind".
const (
	crdGroupKindIndex = "ferry.dev/crd-group-kind"
	prGroupKindIndex  = "ferry.dev/published-group-kind"
)

// placeholderGroup stands in for the APIExport's name while the edge has not
// learned it yet; it only serves validation, nothing is sent with it.
const placeholderGroup = "pending.ferry.dev"

// SyncRegistry learns which published resources have their objects
// synced. Implemented by *replication.Engine; must not block.
type SyncRegistry interface {
	SetPublished(p *replication.Published)
	RemovePublished(name string)
	// WithdrawPublished stops applying a resource's objects while its
	// PublishedResource is invalid; deletions of existing copies go on.
	WithdrawPublished(name string)
	// DeleteCopies deletes the local copies of the objects of a withdrawn
	// resource's kcp resource (remote) and tells how many still exist (it
	// may block on the API server).
	DeleteCopies(ctx context.Context, remote schema.GroupResource, local schema.GroupVersionResource, related []replication.Related) (remaining int, err error)
}

// Reconciler publishes PublishedResources through the Store.
type Reconciler struct {
	Client client.Client
	// Mapper resolves related[] kinds to the service cluster's resources.
	Mapper meta.RESTMapper
	Store  *Store
	Sync   SyncRegistry
	Log    logr.Logger
	// Builtins describes kinds no CRD defines; nil publishes CRDs only.
	Builtins *Builtins

	mu sync.Mutex
	// written is the status this reconciler last wrote per
	// PublishedResource: the cache may not show it yet, and a status equal
	// to the cached one is then still written (see setStatus).
	written map[string]ferryv1alpha1.PublishedResourceStatus
}

// SetupWithManager registers the controller and its indexes.
func (r *Reconciler) SetupWithManager(ctx context.Context, mgr ctrl.Manager) error {
	idx := mgr.GetFieldIndexer()
	if err := idx.IndexField(ctx, &apiextensionsv1.CustomResourceDefinition{}, crdGroupKindIndex, crdGroupKind); err != nil {
		return fmt.Errorf("cannot index CRDs: %w", err)
	}
	if err := idx.IndexField(ctx, &ferryv1alpha1.PublishedResource{}, prGroupKindIndex, prGroupKind); err != nil {
		return fmt.Errorf("cannot index PublishedResources: %w", err)
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("publish").
		// Own status writes change no generation and trigger nothing.
		For(&ferryv1alpha1.PublishedResource{}, builder.WithPredicates(predicate.GenerationChangedPredicate{})).
		// A PublishedResource that is gone may have been what refused
		// another one (LocalResourceClaimed, SchemaConflict).
		Watches(&ferryv1alpha1.PublishedResource{}, handler.EnqueueRequestsFromMapFunc(r.forOthers), builder.WithPredicates(predicate.Funcs{
			CreateFunc:  func(event.CreateEvent) bool { return false },
			UpdateFunc:  func(event.UpdateEvent) bool { return false },
			DeleteFunc:  func(event.DeleteEvent) bool { return true },
			GenericFunc: func(event.GenericEvent) bool { return false },
		})).
		Watches(&apiextensionsv1.CustomResourceDefinition{}, handler.EnqueueRequestsFromMapFunc(r.forCRD)).
		WatchesRawSource(source.Func(func(_ context.Context, q workqueueOfRequests) error {
			r.Store.Start(q)
			return nil
		})).
		Complete(r)
}

// crdGroupKind indexes CRDs by "group/kind".
func crdGroupKind(o client.Object) []string {
	crd := o.(*apiextensionsv1.CustomResourceDefinition)
	return []string{crd.Spec.Group + "/" + crd.Spec.Names.Kind}
}

// prGroupKind indexes PublishedResources by the "group/kind" of the CRD
// they publish.
func prGroupKind(o client.Object) []string {
	pr := o.(*ferryv1alpha1.PublishedResource)
	return []string{pr.Spec.Resource.APIGroup + "/" + pr.Spec.Resource.Kind}
}

// forOthers maps a PublishedResource that is gone to all others: one of
// them may have been refused because of it.
func (r *Reconciler) forOthers(ctx context.Context, o client.Object) []reconcile.Request {
	var list ferryv1alpha1.PublishedResourceList
	if err := r.Client.List(ctx, &list); err != nil {
		r.Log.Error(err, "cannot list PublishedResources", logging.KeyPublishedResource, o.GetName())
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for _, pr := range list.Items {
		if pr.Name != o.GetName() {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&pr)})
		}
	}
	return out
}

// forCRD maps a CRD to the PublishedResources that name its group and kind,
// and to all PublishedResources in conflict checks (a new CRD can change
// which of two PublishedResources wins).
func (r *Reconciler) forCRD(ctx context.Context, o client.Object) []reconcile.Request {
	crd := o.(*apiextensionsv1.CustomResourceDefinition)
	var list ferryv1alpha1.PublishedResourceList
	if err := r.Client.List(ctx, &list, client.MatchingFields{prGroupKindIndex: crd.Spec.Group + "/" + crd.Spec.Names.Kind}); err != nil {
		r.Log.Error(err, "cannot list PublishedResources for CRD", "crd", crd.Name)
		return nil
	}
	out := make([]reconcile.Request, 0, len(list.Items))
	for _, pr := range list.Items {
		out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&pr)})
	}
	// And those whose related[] names it: an entry refused (RelatedInvalid)
	// because the service cluster did not serve the kind yet is checked
	// again when it does. CRD events are rare; all PublishedResources are
	// listed from the cache.
	var all ferryv1alpha1.PublishedResourceList
	if err := r.Client.List(ctx, &all); err != nil {
		r.Log.Error(err, "cannot list PublishedResources for CRD", "crd", crd.Name)
		return out
	}
	for _, pr := range all.Items {
		if relatesCRD(&pr, crd) && !slices.ContainsFunc(out, func(q reconcile.Request) bool { return q.Name == pr.Name }) {
			out = append(out, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(&pr)})
		}
	}
	return out
}

// relatesCRD tells whether a related[] entry of pr names crd's kind or
// resource.
func relatesCRD(pr *ferryv1alpha1.PublishedResource, crd *apiextensionsv1.CustomResourceDefinition) bool {
	for i := range pr.Spec.Related {
		r := &pr.Spec.Related[i]
		// The service cluster's side of the entry: its projection for
		// origin kcp.
		local := related.ServiceResource(r)
		if local.Group == crd.Spec.Group && (r.Projection == nil && r.Kind != "" && r.Kind == crd.Spec.Names.Kind || local.Resource == crd.Spec.Names.Plural) {
			return true
		}
	}
	return false
}

// Reconcile validates one PublishedResource, hands it to the Store and
// writes its status.
func (r *Reconciler) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var pr ferryv1alpha1.PublishedResource
	if err := r.Client.Get(ctx, req.NamespacedName, &pr); err != nil {
		if apierrors.IsNotFound(err) {
			r.withdraw(req.Name)
			return reconcile.Result{}, nil
		}
		return reconcile.Result{}, err
	}
	if !pr.DeletionTimestamp.IsZero() {
		return r.finalize(ctx, &pr)
	}
	if !controllerutil.ContainsFinalizer(&pr, ferryv1alpha1.PublishedResourceFinalizer) {
		// Added before anything is published: a deletion then always
		// passes through finalize, which releases the objects in kcp.
		patch := client.MergeFromWithOptions(pr.DeepCopy(), client.MergeFromWithOptimisticLock{})
		controllerutil.AddFinalizer(&pr, ferryv1alpha1.PublishedResourceFinalizer)
		if err := r.Client.Patch(ctx, &pr, patch); err != nil {
			return reconcile.Result{}, fmt.Errorf("cannot add finalizer to PublishedResource %s: %w", pr.Name, err)
		}
	}
	st := r.Store.Status(pr.Name)
	var requeue time.Duration
	group := st.ExportName
	if group == "" {
		group = placeholderGroup
	}

	// One PublishedResource per CRD: two would each list the other's
	// copies as their own and have the broker delete them as gone.
	elder, err := r.olderLocalClaimant(ctx, &pr)
	if err != nil {
		return reconcile.Result{}, err
	}
	if elder != "" {
		r.withdraw(pr.Name)
		return reconcile.Result{}, r.setStatus(ctx, &pr, metav1.ConditionFalse, ferryv1alpha1.ReasonLocalResourceClaimed,
			fmt.Sprintf("PublishedResource %q is older and publishes the same CRD (kind %s in group %s); only one PublishedResource may publish a CRD. "+
				"This one is neither published nor synced, and deleting it deletes no local copy; it takes over by itself once %q is gone",
				elder, pr.Spec.Resource.Kind, pr.Spec.Resource.APIGroup, elder), nil)
	}

	crd, err := r.findCRD(ctx, pr.Spec.Resource)
	if err != nil {
		return reconcile.Result{}, err
	}
	if crd == nil {
		r.withdraw(pr.Name)
		return reconcile.Result{}, r.setStatus(ctx, &pr, metav1.ConditionFalse, ferryv1alpha1.ReasonCRDNotFound,
			fmt.Sprintf("no CRD defines kind %s in group %s on the service cluster, and it serves no built-in kind of that name; publishing starts by itself once it exists",
				pr.Spec.Resource.Kind, pr.Spec.Resource.APIGroup), nil)
	}
	proj, err := Project(&pr, crd, group)
	if err != nil {
		r.withdraw(pr.Name)
		var refusal *Refusal
		if errors.As(err, &refusal) {
			return reconcile.Result{}, r.setStatus(ctx, &pr, metav1.ConditionFalse, refusal.Reason, refusal.Message, nil)
		}
		return reconcile.Result{}, err
	}
	if msg := projectionChange(&pr, proj); msg != "" {
		// Moving to another served resource would have the broker watch
		// the new one, find none of the local copies' objects there and
		// delete every copy, and leave the old one's objects with its
		// finalizer. Refused: what was registered and sent stays as it
		// is (nothing is re-registered, nothing withdrawn).
		r.Log.Info("refusing a projection change of a published resource", logging.KeyPublishedResource, pr.Name, "reason", msg)
		return reconcile.Result{}, r.setStatus(ctx, &pr, metav1.ConditionFalse, ferryv1alpha1.ReasonProjectionChanged, msg, nil)
	}
	winner, err := r.olderClaimant(ctx, &pr, proj.Resource.Resource, group)
	if err != nil {
		return reconcile.Result{}, err
	}
	if winner != "" {
		r.withdraw(pr.Name)
		return reconcile.Result{}, r.setStatus(ctx, &pr, metav1.ConditionFalse, ferryv1alpha1.ReasonSchemaConflict,
			fmt.Sprintf("PublishedResource %q also projects onto resource %q and is older; change this one's projection (kind or plural)",
				winner, proj.Resource.Resource), nil)
	}

	compiled, refusal := CompileRules(&pr, crd)
	if refusal != nil {
		r.withdraw(pr.Name)
		return reconcile.Result{}, r.setStatus(ctx, &pr, metav1.ConditionFalse, refusal.Reason, refusal.Message, nil)
	}

	relatedRefs, err := r.compileRelated(&pr, crd)
	if err != nil {
		r.withdraw(pr.Name)
		return reconcile.Result{}, r.setStatus(ctx, &pr, metav1.ConditionFalse, ferryv1alpha1.ReasonRelatedInvalid, err.Error(), nil)
	}
	msg, err := newPublish(&pr, crd, relatedRefs)
	if err != nil {
		return reconcile.Result{}, err
	}
	r.Store.Set(msg)

	res := st.Result
	current := res != nil && res.GetRevision() == msg.GetRevision()
	if current && res.GetState() == ferryv1.PublishState_PUBLISH_STATE_FAILED {
		r.Sync.RemovePublished(pr.Name)
	} else if pr.Spec.SyncDisabled() {
		// The broker releases the objects in kcp when it takes this
		// Publish; the local copies follow spec.deletionPolicy.
		r.Sync.RemovePublished(pr.Name)
		if served := servedResource(pr.Status.ServedResource); served != nil && pr.Spec.EffectiveDeletionPolicy() == ferryv1alpha1.DeletionPolicyDelete {
			// Never served: no copy of its kcp resource can exist.
			remaining, err := r.Sync.DeleteCopies(ctx, schema.GroupResource{Group: served.GetGroup(), Resource: served.GetResource()}, localResource(crd), relatedRefs)
			if err != nil {
				return reconcile.Result{}, err
			}
			if remaining > 0 {
				// Not the hot path: a withdrawn resource's copies finishing
				// their own finalizers are looked at again after a while.
				r.Log.Info("synchronization disabled; waiting for local copies to be deleted", logging.KeyPublishedResource, pr.Name, "remaining", remaining)
				requeue = releasePoll
			}
		}
	} else if group != placeholderGroup {
		// Sync is registered as soon as the real projection is known, not
		// after the broker's answer, so the local copies are watched (and
		// inventoried) early after a (re)connect.
		compiled.Related = relatedRefs
		r.registerSync(&pr, crd, proj, msg.GetRevision(), compiled)
	}
	result := reconcile.Result{RequeueAfter: requeue}
	switch {
	case current:
		return result, r.statusFromResult(ctx, &pr, crd, res)
	case !st.Connected:
		return result, r.setStatus(ctx, &pr, metav1.ConditionFalse, ferryv1alpha1.ReasonBrokerUnavailable,
			fmt.Sprintf("not connected to the broker at %s; publishing as soon as the edge connects", st.BrokerAddress), nil)
	default:
		return result, r.setStatus(ctx, &pr, metav1.ConditionFalse, ferryv1alpha1.ReasonPending,
			"sent to the broker; waiting for its answer", nil)
	}
}

// releasePoll is how often a PublishedResource whose local copies are being
// deleted (deletionPolicy Delete) is looked at again: the copies may wait
// for finalizers of the service's own controllers, which this controller
// does not watch.
const releasePoll = 2 * time.Second

// localResource is a served version of crd's resource (any one lists and
// deletes the same objects).
func localResource(crd *apiextensionsv1.CustomResourceDefinition) schema.GroupVersionResource {
	gvr := schema.GroupVersionResource{Group: crd.Spec.Group, Resource: crd.Spec.Names.Plural}
	for _, v := range crd.Spec.Versions {
		if v.Served {
			gvr.Version = v.Name
			if v.Storage {
				break
			}
		}
	}
	return gvr
}

// servedResource parses status.servedResource ("plural.group/version").
func servedResource(s string) *ferryv1.GroupVersionResource {
	rg, version, ok := strings.Cut(s, "/")
	if !ok {
		return nil
	}
	resource, group, ok := strings.Cut(rg, ".")
	if !ok || resource == "" || version == "" {
		return nil
	}
	return &ferryv1.GroupVersionResource{Group: group, Version: version, Resource: resource}
}

// finalize handles a deleted PublishedResource: syncing stops, the local
// copies are deleted (deletionPolicy Delete) or left (Orphan), the broker
// releases its finalizer on every object in kcp, and only then the
// PublishedResource's own finalizer is removed. kcp objects are thus never
// left Terminating because a PublishedResource went away.
func (r *Reconciler) finalize(ctx context.Context, pr *ferryv1alpha1.PublishedResource) (reconcile.Result, error) {
	if !controllerutil.ContainsFinalizer(pr, ferryv1alpha1.PublishedResourceFinalizer) {
		r.withdraw(pr.Name)
		return reconcile.Result{}, nil
	}
	r.Sync.RemovePublished(pr.Name) // no repairs of copies from here on
	pol := pr.Spec.EffectiveDeletionPolicy()
	if pol == ferryv1alpha1.DeletionPolicyDelete {
		owner, err := r.ownsCopies(ctx, pr)
		if err != nil {
			return reconcile.Result{}, err
		}
		crd, err := r.findCRD(ctx, pr.Spec.Resource)
		if err != nil {
			return reconcile.Result{}, err
		}
		if crd != nil && owner {
			relatedRefs, _ := r.compileRelated(pr, crd)        // an invalid entry wrote nothing
			served := servedResource(pr.Status.ServedResource) // not nil: ownsCopies
			remaining, err := r.Sync.DeleteCopies(ctx, schema.GroupResource{Group: served.GetGroup(), Resource: served.GetResource()}, localResource(crd), relatedRefs)
			if err != nil {
				return reconcile.Result{}, err
			}
			if remaining > 0 {
				return reconcile.Result{RequeueAfter: releasePoll}, r.setStatus(ctx, pr, metav1.ConditionFalse, ferryv1alpha1.ReasonReleasing,
					fmt.Sprintf("being deleted (deletionPolicy Delete): waiting for %d local copies to be deleted", remaining), nil)
			}
		}
	}
	release := ferryv1.ReleasePolicy_RELEASE_POLICY_ORPHAN
	if pol == ferryv1alpha1.DeletionPolicyDelete {
		release = ferryv1.ReleasePolicy_RELEASE_POLICY_DELETE
	}
	answer := r.Store.Release(&ferryv1.Unpublish{PublishedResource: pr.Name, Release: release, ServedResource: servedResource(pr.Status.ServedResource)})
	if answer == nil {
		st := r.Store.Status(pr.Name)
		msg := "being deleted: waiting for the broker to release the objects in kcp"
		if !st.Connected {
			msg = fmt.Sprintf("being deleted: waiting for the broker at %s to release the objects in kcp (not connected)", st.BrokerAddress)
		}
		// The store requeues when the broker answers or the edge connects.
		return reconcile.Result{}, r.setStatus(ctx, pr, metav1.ConditionFalse, ferryv1alpha1.ReasonReleasing, msg, nil)
	}
	r.Log.Info("PublishedResource deleted; the broker released its objects", logging.KeyPublishedResource, pr.Name,
		"deletionPolicy", string(pol), "broker", answer.GetMessage())
	patch := client.MergeFromWithOptions(pr.DeepCopy(), client.MergeFromWithOptimisticLock{})
	controllerutil.RemoveFinalizer(pr, ferryv1alpha1.PublishedResourceFinalizer)
	if err := r.Client.Patch(ctx, pr, patch); err != nil && !apierrors.IsNotFound(err) {
		return reconcile.Result{}, fmt.Errorf("cannot remove the finalizer of PublishedResource %s: %w", pr.Name, err)
	}
	r.withdraw(pr.Name)
	r.Store.Forget(pr.Name)
	return reconcile.Result{}, nil
}

// ownsCopies tells whether the local copies of pr's CRD can be pr's: it was
// published (a resource was served in kcp, so copies of its objects may
// exist) and no older PublishedResource claims the CRD (the copies would be
// that one's). Only then does deletionPolicy Delete delete copies.
func (r *Reconciler) ownsCopies(ctx context.Context, pr *ferryv1alpha1.PublishedResource) (bool, error) {
	if servedResource(pr.Status.ServedResource) == nil {
		r.Log.Info("PublishedResource deleted before it was published: no local copy is its own, none is deleted", logging.KeyPublishedResource, pr.Name)
		return false, nil
	}
	elder, err := r.olderLocalClaimant(ctx, pr)
	if err != nil {
		return false, err
	}
	if elder != "" {
		r.Log.Info("PublishedResource deleted while an older one publishes its CRD: the local copies are that one's, none is deleted",
			logging.KeyPublishedResource, pr.Name, "elder", elder)
		return false, nil
	}
	return true, nil
}

// withdraw stops publishing (and syncing) a PublishedResource.
func (r *Reconciler) withdraw(name string) {
	r.mu.Lock()
	delete(r.written, name)
	r.mu.Unlock()
	r.Store.Remove(name)
	r.Sync.WithdrawPublished(name)
}

// registerSync tells the sync engine how objects of a published resource
// map onto the CRD, or that they are not synced.
// compiled carries the naming rules and mutators compiled by Reconcile.
func (r *Reconciler) registerSync(pr *ferryv1alpha1.PublishedResource, crd *apiextensionsv1.CustomResourceDefinition,
	proj *projection.Result, revision string, compiled *replication.Published,
) {
	if pr.Spec.Synchronization != nil && pr.Spec.Synchronization.Enabled != nil && !*pr.Spec.Synchronization.Enabled {
		r.Sync.RemovePublished(pr.Name)
		return
	}
	r.Sync.SetPublished(NewPublished(pr, crd, proj, revision, compiled))
}

func (r *Reconciler) statusFromResult(ctx context.Context, pr *ferryv1alpha1.PublishedResource, crd *apiextensionsv1.CustomResourceDefinition, res *ferryv1.PublishResult) error {
	switch res.GetState() {
	case ferryv1.PublishState_PUBLISH_STATE_PUBLISHED:
		msg := res.GetMessage()
		if !hasStatusSubresource(crd, projection.SelectedVersions(&pr.Spec.Resource, crd)) {
			msg += "; the CRD has no status subresource, so no status is synced back"
		}
		return r.setStatus(ctx, pr, metav1.ConditionTrue, ferryv1alpha1.ReasonPublished, msg, res)
	case ferryv1.PublishState_PUBLISH_STATE_FAILED:
		reason := res.GetReason()
		if reason == "" {
			reason = ferryv1alpha1.ReasonBrokerRefused
		}
		return r.setStatus(ctx, pr, metav1.ConditionFalse, reason, res.GetMessage(), nil)
	default:
		reason := res.GetReason()
		if reason == "" {
			reason = ferryv1alpha1.ReasonPending
		}
		return r.setStatus(ctx, pr, metav1.ConditionFalse, reason, "broker: "+res.GetMessage(), nil)
	}
}

// findCRD returns the CRD defining the source resource, or nil. A kind no
// CRD defines is looked up among the service cluster's built-in kinds
// (Builtins), described as a CRD.
func (r *Reconciler) findCRD(ctx context.Context, src ferryv1alpha1.SourceResource) (*apiextensionsv1.CustomResourceDefinition, error) {
	var list apiextensionsv1.CustomResourceDefinitionList
	if err := r.Client.List(ctx, &list, client.MatchingFields{crdGroupKindIndex: src.APIGroup + "/" + src.Kind}); err != nil {
		return nil, fmt.Errorf("cannot list CRDs: %w", err)
	}
	if len(list.Items) > 0 {
		return &list.Items[0], nil
	}
	if r.Builtins == nil {
		return nil, nil
	}
	return r.Builtins.CRDFor(ctx, src)
}

// projectionChange tells (as a message for the Published condition) how
// proj moves a published PublishedResource to another resource in kcp: its
// plural or kind differ from status.servedResource and status.projectedKind.
// "" when pr was never published or proj serves the same resource. The API
// group (the APIExport's name) is not compared, nor the version: another
// version of the same resource lists the same objects.
func projectionChange(pr *ferryv1alpha1.PublishedResource, proj *projection.Result) string {
	old := servedResource(pr.Status.ServedResource)
	if old == nil {
		return ""
	}
	oldKind := pr.Status.ProjectedKind
	if old.GetResource() == proj.Resource.Resource && (oldKind == "" || oldKind == proj.Kind) {
		return ""
	}
	if oldKind == "" {
		oldKind = "?"
	}
	return fmt.Sprintf("the projection changed to resource %q (kind %s), but this PublishedResource is published as %s (kind %s); "+
		"a published resource cannot move: its objects in kcp and their local copies belong to it. It is still synced as %s. "+
		"Restore spec.projection; to serve the CRD as another resource, delete this PublishedResource with deletionPolicy Orphan to keep the copies, "+
		"then create a new one (README: changing a projection)",
		proj.Resource.Resource, proj.Kind, pr.Status.ServedResource, oldKind, pr.Status.ServedResource)
}

// olderLocalClaimant returns the name of an older PublishedResource that
// publishes the same CRD as pr (same group and kind), or "". One being
// deleted counts until it is gone: with deletionPolicy Delete it deletes
// the copies, which must then not be another's.
func (r *Reconciler) olderLocalClaimant(ctx context.Context, pr *ferryv1alpha1.PublishedResource) (string, error) {
	var list ferryv1alpha1.PublishedResourceList
	if err := r.Client.List(ctx, &list, client.MatchingFields{prGroupKindIndex: prGroupKind(pr)[0]}); err != nil {
		return "", fmt.Errorf("cannot list PublishedResources of %s: %w", prGroupKind(pr)[0], err)
	}
	var elder *ferryv1alpha1.PublishedResource
	for i := range list.Items {
		other := &list.Items[i]
		if other.Name == pr.Name || !olderThan(other, pr) {
			continue
		}
		if elder == nil || olderThan(other, elder) {
			elder = other
		}
	}
	if elder == nil {
		return "", nil
	}
	return elder.Name, nil
}

// olderClaimant returns the name of an older PublishedResource projecting
// onto the same plural, or "". Older means earlier creation, then name.
func (r *Reconciler) olderClaimant(ctx context.Context, pr *ferryv1alpha1.PublishedResource, plural, group string) (string, error) {
	var list ferryv1alpha1.PublishedResourceList
	if err := r.Client.List(ctx, &list); err != nil {
		return "", fmt.Errorf("cannot list PublishedResources: %w", err)
	}
	for i := range list.Items {
		other := &list.Items[i]
		if other.Name == pr.Name || !other.DeletionTimestamp.IsZero() || !olderThan(other, pr) {
			continue
		}
		crd, err := r.findCRD(ctx, other.Spec.Resource)
		if err != nil {
			return "", err
		}
		if crd == nil {
			continue
		}
		proj, err := projection.Project(&other.Spec, crd, group)
		if err == nil && proj.Resource.Resource == plural {
			return other.Name, nil
		}
	}
	return "", nil
}

func olderThan(a, b *ferryv1alpha1.PublishedResource) bool {
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

// setStatus writes the Published condition (and, from a PUBLISHED result,
// the schema fields) when anything changed.
func (r *Reconciler) setStatus(ctx context.Context, pr *ferryv1alpha1.PublishedResource, status metav1.ConditionStatus, reason, message string, res *ferryv1.PublishResult) error {
	updated := pr.DeepCopy()
	updated.Status.ObservedGeneration = pr.Generation
	meta.SetStatusCondition(&updated.Status.Conditions, metav1.Condition{
		Type: ferryv1alpha1.ConditionPublished, Status: status, Reason: reason, Message: message, ObservedGeneration: pr.Generation,
	})
	var export *ferryv1.ExportStatus
	if r.Store != nil {
		export = r.Store.Status(pr.Name).Export
	}
	meta.SetStatusCondition(&updated.Status.Conditions, virtualWorkspaceCondition(export, pr.Generation))
	if res != nil {
		gvr := res.GetServedResource()
		updated.Status.ResourceSchemaName = res.GetResourceSchemaName()
		updated.Status.ProjectedKind = res.GetProjectedKind()
		updated.Status.ServedResource = gvr.GetResource() + "." + gvr.GetGroup() + "/" + gvr.GetVersion()
	}
	r.mu.Lock()
	last, wrote := r.written[pr.Name]
	r.mu.Unlock()
	// Skipped only when the cache shows it and nothing else was written
	// since: a broker answer can arrive (and be reconciled) before the
	// cache shows the status written a moment earlier, which the cached
	// object would then wrongly appear to match. A stale write fails with
	// a conflict and is retried.
	if equality.Semantic.DeepEqual(pr.Status, updated.Status) && (!wrote || equality.Semantic.DeepEqual(last, ownStatus(updated.Status))) {
		return nil
	}
	if err := r.Client.Status().Update(ctx, updated); err != nil {
		return fmt.Errorf("cannot update status of PublishedResource %s: %w", pr.Name, err)
	}
	r.mu.Lock()
	if r.written == nil {
		r.written = map[string]ferryv1alpha1.PublishedResourceStatus{}
	}
	r.written[pr.Name] = ownStatus(updated.Status)
	r.mu.Unlock()
	return nil
}

// virtualWorkspaceCondition is the VirtualWorkspaceReady condition the
// broker's latest report on the APIExport (nil: none yet) calls for.
func virtualWorkspaceCondition(export *ferryv1.ExportStatus, generation int64) metav1.Condition {
	c := metav1.Condition{Type: ferryv1alpha1.ConditionVirtualWorkspaceReady, ObservedGeneration: generation}
	switch {
	case export == nil:
		c.Status, c.Reason, c.Message = metav1.ConditionUnknown, ferryv1alpha1.ReasonExportStatusUnknown, "the broker has not reported the APIExport's state yet"
	case !export.GetVirtualWorkspaceReady():
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, ferryv1alpha1.ReasonWaitingForBinding, "waiting for "+export.GetWaitingFor()
	case export.GetWaitingFor() != "":
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, ferryv1alpha1.ReasonEndpointsUnreachable, "waiting for "+export.GetWaitingFor()
	default:
		c.Status, c.Reason = metav1.ConditionTrue, ferryv1alpha1.ReasonVirtualWorkspaceReady
		c.Message = fmt.Sprintf("the broker watches the APIExport's virtual workspace at %d endpoint(s): objects of every bound workspace reach the edge", max(1, len(export.GetEndpoints())))
	}
	return c
}

// ownStatus is the part of a status this reconciler writes: all but the
// conditions other writers own (Synced, by the sync engine).
func ownStatus(st ferryv1alpha1.PublishedResourceStatus) ferryv1alpha1.PublishedResourceStatus {
	out := *st.DeepCopy()
	out.Conditions = slices.DeleteFunc(out.Conditions, func(c metav1.Condition) bool {
		return c.Type != ferryv1alpha1.ConditionPublished && c.Type != ferryv1alpha1.ConditionVirtualWorkspaceReady
	})
	return out
}

// newPublish builds the Publish for pr: its spec and the CRD reduced to the
// selected versions, without server-managed metadata or status, so that the
// revision changes only when what is published changes.
//
// Related entries that name a resource (api-syncagent's spelling) are sent
// with the kind the service cluster serves it as: the broker writes
// service-origin copies into kcp as that kind and has no discovery of the
// service cluster.
func newPublish(pr *ferryv1alpha1.PublishedResource, crd *apiextensionsv1.CustomResourceDefinition, rel []replication.Related) (*ferryv1.Publish, error) {
	selected := projection.SelectedVersions(&pr.Spec.Resource, crd)
	reduced := &apiextensionsv1.CustomResourceDefinition{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: crd.Name},
		Spec:       *crd.Spec.DeepCopy(),
	}
	reduced.Spec.Versions = slices.DeleteFunc(reduced.Spec.Versions, func(v apiextensionsv1.CustomResourceDefinitionVersion) bool {
		return !slices.Contains(selected, v.Name)
	})
	sent := pr.Spec.DeepCopy()
	for i := range sent.Related {
		for _, r := range rel {
			// A projected entry's kinds differ by side: the broker finds
			// the one in kcp itself.
			if r.Identifier == sent.Related[i].Identifier && r.ByResource && !r.Projected {
				sent.Related[i].Kind = r.Kind.Kind
			}
		}
	}
	spec, err := json.Marshal(sent)
	if err != nil {
		return nil, fmt.Errorf("cannot encode spec of %s: %w", pr.Name, err)
	}
	crdJSON, err := json.Marshal(reduced)
	if err != nil {
		return nil, fmt.Errorf("cannot encode CRD %s: %w", crd.Name, err)
	}
	sum := sha256.New()
	sum.Write(spec)
	sum.Write([]byte{0})
	sum.Write(crdJSON)
	return &ferryv1.Publish{
		PublishedResource:        pr.Name,
		Generation:               pr.Generation,
		Spec:                     spec,
		CustomResourceDefinition: crdJSON,
		Revision:                 hex.EncodeToString(sum.Sum(nil))[:16],
	}, nil
}

func hasStatusSubresource(crd *apiextensionsv1.CustomResourceDefinition, versions []string) bool {
	for _, v := range crd.Spec.Versions {
		if slices.Contains(versions, v.Name) && (v.Subresources == nil || v.Subresources.Status == nil) {
			return false
		}
	}
	return true
}

// compileRelated compiles spec.related and resolves each kind in the
// service cluster; related kinds must be namespaced, and a cluster-scoped
// primary needs reference.namespace.
func (r *Reconciler) compileRelated(pr *ferryv1alpha1.PublishedResource, crd *apiextensionsv1.CustomResourceDefinition) ([]replication.Related, error) {
	refs, err := related.Compile(pr.Spec.Related)
	if err != nil {
		return nil, err
	}
	out := make([]replication.Related, 0, len(refs))
	for _, ref := range refs {
		where := fmt.Sprintf("spec.related[%s]", ref.Identifier)
		if ref.ByResource {
			// api-syncagent's spelling names the resource: its kind is
			// what the service cluster serves it as (the projected
			// resource for origin kcp).
			gvk, err := r.Mapper.KindFor(ref.Service)
			if err != nil {
				what := "write the lowercase plural, e.g. secrets, with its group and version"
				if ref.Projected && ref.Origin == ferryv1alpha1.OriginKCP {
					what = "for origin kcp, projection names the service cluster's group, version and resource"
				}
				return nil, fmt.Errorf("%s: resource %s is not served by the service cluster (%s): %w", where, ref.Service, what, err)
			}
			ref.ResolveServiceKind(gvk.Kind)
		}
		if err := ref.CheckMutation(templating.SampleData(ref.Kind.GroupVersion().String(), ref.Kind.Kind, true)); err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if ref.UsesClusterPath() && !pr.Spec.EnableWorkspacePaths {
			return nil, fmt.Errorf("%s: a template reads .ClusterPath, which is known only with spec.enableWorkspacePaths: true", where)
		}
		local := ref.Service.GroupVersion().WithKind(ref.ServiceKind)
		mapping, err := r.Mapper.RESTMapping(local.GroupKind(), local.Version)
		if err != nil {
			return nil, fmt.Errorf("%s: kind %s is not served by the service cluster: %w", where, local, err)
		}
		if mapping.Scope.Name() != meta.RESTScopeNameNamespace {
			return nil, fmt.Errorf("%s: kind %s is cluster-scoped; related objects must be namespaced", where, local)
		}
		if crd.Spec.Scope != apiextensionsv1.NamespaceScoped && !ref.HasNamespace() {
			return nil, fmt.Errorf("%s: %s is cluster-scoped, so reference.namespace is required", where, crd.Spec.Names.Kind)
		}
		out = append(out, replication.Related{Reference: ref, Local: mapping.Resource})
	}
	return out, nil
}

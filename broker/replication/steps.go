package replication

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/logging"
	"github.com/ferry-dev/ferry/pkg/objects"
)

// The decision for one primary object, as ordered steps (kcp's
// sub-reconciler style): each looks at the object's state, may act through
// the effects, and tells whether the object's processing ends there. The
// steps hold no manager: what they read is the object state and the
// ledger, what they do goes through stepEffects, so a table test runs
// them over a state and records the effects without a kcp.

// objectState is what the steps decide on: one primary object of one
// PublishedResource as the broker sees it now.
type objectState struct {
	it  item
	res Resource
	// obj is the cached object; nil when the cache does not hold it.
	obj *unstructured.Unstructured
	// listed: the watch has listed, so an object missing from the cache
	// is gone from kcp (not merely not listed yet).
	listed bool
	// open: the PublishedResource's intents may be sent (the edge's
	// inventory is complete, or gating is off or timed out).
	open bool
	// withdrawn: the PublishedResource is withdrawn (invalid, or paused by
	// its edge): deletions still flow, nothing new is synced.
	withdrawn bool
	// hasFinalizer: obj carries the broker's finalizer.
	hasFinalizer bool
	// hasAdoptFinalizer: obj carries res.AdoptFinalizer (the finalizer of
	// the sync agent whose copies the edge adopts).
	hasAdoptFinalizer bool
	// scope is res's filters evaluated on obj.
	scope scope
}

// deleting tells whether obj is being deleted in kcp.
func (s *objectState) deleting() bool { return s.obj.GetDeletionTimestamp() != nil }

// leaving tells whether obj's copy is to go: it is being deleted in kcp or
// has left the filters (a namespace not known yet is neither).
func (s *objectState) leaving() bool { return s.deleting() || s.scope == outOfScope }

// asksDelete tells whether the broker asks the edge to delete obj's copy:
// obj is leaving, and it carries the finalizer or the edge may hold its
// copy (mayHold: the ledger proves one was sent for this very object, before
// the finalizer landed). It is also the only state in which a deletion
// confirmation is accepted (Release).
//
// An object being deleted that still carries the finalizer of the sync
// agent whose copies the edge adopts (its copy not adopted before the
// deletion) is asked too: the edge deletes that agent's copy of exactly
// this object, and the release takes that agent's finalizer with it
// (adoption.go). Not for an object that merely left the filters: ferry's
// filters say nothing about the other agent's copies.
func (s *objectState) asksDelete(mayHold func() bool) bool {
	return s.leaving() && (s.hasFinalizer || mayHold()) || s.deleting() && s.hasAdoptFinalizer
}

// wantsFinalizer tells whether obj is to carry the broker's finalizer: it
// is in the filters and not being deleted.
func (s *objectState) wantsFinalizer() bool { return !s.deleting() && s.scope == inScope }

// stepEffects are what the steps do outside the object state. The
// manager's are bound to its lock, outbox and queues (Manager.effects).
type stepEffects struct {
	// withLedger runs f with the ledger under the lock guarding it; the
	// effects marked "lock held" are called only inside f, the others
	// only outside.
	withLedger func(f func(*ledger))
	// put puts an intent into the outbox.
	put func(*ferryv1.SyncIntent)
	// drop drops the outbox's undelivered intent for a primary.
	drop func(*ferryv1.ObjectKey)
	// queueFinalizer queues the write of a primary's finalizer.
	queueFinalizer func(item)
	// queueRelated queues the kcp-origin references of a primary the edge
	// holds (lock held).
	queueRelated func(item)
	// queueServiceRelated queues the service-origin references of a
	// primary whose desired state changed.
	queueServiceRelated func(item)
	// resynced counts a primary's first comparison after an inventory
	// comparison; unchanged when the edge holds its desired state (lock
	// held).
	resynced func(it item, unchanged bool)
	// forgetResync stops counting a primary that left the cache (lock
	// held).
	forgetResync func(item)
	// workspacePath resolves a logical cluster's workspace path.
	workspacePath func(ctx context.Context, cluster string) (string, error)
	// warn records a Warning Event on a primary in kcp (best effort: a
	// failure is logged, never retried).
	warn func(ctx context.Context, pr string, key *ferryv1.ObjectKey, reason, message string)
	log  logr.Logger
}

// decision is one run of the steps over one object: its state and what
// the steps derived from it so far.
type decision struct {
	objectState
	// key and id are the object's protocol key and identity (set when obj
	// is).
	key *ferryv1.ObjectKey
	id  objectID
	// upsert is the object's desired state, once desiredState computed it.
	upsert *ferryv1.UpsertIntent
}

// step is one step of the decision: done ends the object's processing.
type step struct {
	name string
	run  func(ctx context.Context, d *decision, fx *stepEffects) (done bool, err error)
}

// objectSteps are the steps, in the order they are evaluated.
func objectSteps() []step {
	return []step{
		{"gone", stepGone},
		{"finalizerWanted", stepFinalizerWanted},
		{"heldUntilInventory", stepHeldUntilInventory},
		{"deleteAsked", stepDeleteAsked},
		{"notSynced", stepNotSynced},
		{"withdrawn", stepWithdrawn},
		{"desiredState", stepDesiredState},
		{"olderCopiesFirst", stepOlderCopiesFirst},
		{"upsertUnchanged", stepUpsertUnchanged},
		{"upsertChanged", stepUpsertChanged},
		{"serviceRelated", stepServiceRelated},
	}
}

// decide runs the steps over s until one ends the object's processing,
// and returns that step's name ("" when none did).
func decide(ctx context.Context, s objectState, fx *stepEffects) (string, error) {
	d := &decision{objectState: s}
	if s.obj != nil {
		d.key = objectKey(s.obj, s.res.GVR)
		d.id = idOf(s.it.pr, d.key)
	}
	for _, st := range objectSteps() {
		done, err := st.run(ctx, d, fx)
		if err != nil {
			return st.name, err
		}
		if done {
			return st.name, nil
		}
	}
	return "", nil
}

// stepGone handles an object that left kcp (or is not there after the
// broker's list) while the edge may still hold a copy: without a confirmed
// deletion the copy would be left behind, so the edge is asked to delete
// it. The finalizer normally prevents this; it happens when kcp deletes an
// object whose finalizer was added concurrently with the delete, or when
// the object was deleted while the broker was down. The edge's
// confirmation releases nothing (Release finds no object).
func stepGone(_ context.Context, d *decision, fx *stepEffects) (bool, error) {
	if d.obj != nil {
		return false, nil
	}
	fx.withLedger(func(*ledger) { fx.forgetResync(d.it) })
	if d.open && d.listed {
		deleteLedgerCopies(fx, d.it.pr, func(l *ledger) []objectID { return l.copiesAt(d.it) },
			"object gone from kcp without a confirmed deletion; deleting its copy")
	}
	return true, nil
}

// stepFinalizerWanted queues the finalizer of an object in the filters
// and not being deleted, unless it is there or the PublishedResource is
// withdrawn. Written off the way to the edge: the upsert does not wait
// for it. A copy sent before it lands is still deleted when the object
// goes: its delete needs no finalizer (stepDeleteAsked), and one that
// vanishes gets one from the ledger (stepGone).
func stepFinalizerWanted(_ context.Context, d *decision, fx *stepEffects) (bool, error) {
	if !d.hasFinalizer && !d.withdrawn && d.wantsFinalizer() {
		fx.queueFinalizer(d.it)
	}
	return false, nil
}

// stepHeldUntilInventory holds the object until the edge's inventory is
// complete (openLocked requeues): the edge cannot act on this resource
// before it watches its copies.
func stepHeldUntilInventory(_ context.Context, d *decision, _ *stepEffects) (bool, error) {
	return !d.open, nil
}

// stepDeleteAsked asks the edge to delete the copy of an object deleted in
// kcp or out of the filters (also while the PublishedResource is
// withdrawn), when it carries the finalizer or the ledger proves the edge
// may hold its copy: the edge deletes it, confirms, and the finalizer is
// released (Release, which accepts a confirmation by the same test).
func stepDeleteAsked(ctx context.Context, d *decision, fx *stepEffects) (bool, error) {
	mayHold := func() (held bool) {
		fx.withLedger(func(l *ledger) { held = l.mayHold(d.id) })
		return held
	}
	if !d.asksDelete(mayHold) {
		return false, nil
	}
	deleteOlderCopies(fx, d.id)
	var queue bool
	fx.withLedger(func(l *ledger) { queue = l.deleteQueued(d.id, d.key) })
	if queue {
		orphan, refusal := d.consumerOrphan()
		if refusal != "" {
			fx.warn(ctx, d.it.pr, d.key, reasonDeletionPolicyIgnored, refusal)
		}
		fx.put(newIntent(d.it.pr, d.key, d.obj, &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{Orphan: orphan}}))
	}
	return true, nil
}

// reasonDeletionPolicyIgnored is the Event reason telling a consumer its
// deletion policy annotation was not honoured.
const reasonDeletionPolicyIgnored = "DeletionPolicyIgnored"

// consumerOrphan tells whether the copy of an object being deleted in kcp
// is left in place (the consumer's annotation says Orphan and the
// PublishedResource allows it), and otherwise, when the consumer asked for
// something not honoured, why (for an Event on the object). Only a deletion
// in kcp counts: an object leaving the filters loses its copy whatever it
// says.
func (d *decision) consumerOrphan() (orphan bool, refusal string) {
	v, set := d.obj.GetAnnotations()[ferryv1alpha1.AnnotationDeletionPolicy]
	switch {
	case !set || !d.deleting():
		return false, ""
	case v != ferryv1alpha1.DeletionOrphan:
		return false, fmt.Sprintf("%s: %q is not a deletion policy (the only one is %s); the local copy in the service cluster is deleted",
			ferryv1alpha1.AnnotationDeletionPolicy, v, ferryv1alpha1.DeletionOrphan)
	case !d.res.ConsumerOrphan:
		return false, fmt.Sprintf("%s: %s is ignored: the service's PublishedResource %s does not allow it (spec.consumerDeletionPolicy is not Allow); the local copy in the service cluster is deleted",
			ferryv1alpha1.AnnotationDeletionPolicy, v, d.it.pr)
	}
	return true, ""
}

// stepNotSynced ends an object that is not synced: being deleted or out of
// the filters (without a copy to delete), or whose namespace is not known
// yet (the namespace watch queues it again).
func stepNotSynced(_ context.Context, d *decision, _ *stepEffects) (bool, error) {
	return d.deleting() || d.scope != inScope, nil
}

// stepWithdrawn ends an object of a withdrawn PublishedResource: nothing
// new is sent until it is published again.
func stepWithdrawn(_ context.Context, d *decision, _ *stepEffects) (bool, error) {
	return d.withdrawn, nil
}

// stepDesiredState computes the upsert of the object's desired state.
func stepDesiredState(ctx context.Context, d *decision, fx *stepEffects) (bool, error) {
	desired := objects.DesiredState(d.obj)
	data, err := json.Marshal(desired.Object)
	if err != nil {
		return false, fmt.Errorf("cannot encode %s: %w", d.it.key, err)
	}
	d.upsert = &ferryv1.UpsertIntent{Object: data}
	if d.res.WorkspacePaths {
		if d.upsert.WorkspacePath, err = fx.workspacePath(ctx, d.key.GetCluster()); err != nil {
			return false, err
		}
	}
	d.upsert.ContentHash = ContentHash(d.upsert)
	return false, nil
}

// stepOlderCopiesFirst deletes the copies of older objects at the
// object's name: the edge keeps one copy per name, so an older object's
// copy goes first; its confirmation (Release) queues this object again.
func stepOlderCopiesFirst(_ context.Context, d *decision, fx *stepEffects) (bool, error) {
	return deleteOlderCopies(fx, d.id), nil
}

// stepUpsertUnchanged ends an object whose desired state the edge holds
// already: a status write or kcp-internal metadata changed the object, not
// its desired state. An undelivered intent for it is dropped, and its
// kcp-origin references are compared again.
func stepUpsertUnchanged(_ context.Context, d *decision, fx *stepEffects) (bool, error) {
	var applied bool
	fx.withLedger(func(l *ledger) {
		if applied = l.applied(d.id) == d.upsert.ContentHash; applied {
			fx.queueRelated(d.it)
			l.unchanged(d.id, d.upsert.ContentHash)
			fx.resynced(d.it, true)
		}
	})
	if applied {
		fx.drop(d.key)
	}
	return applied, nil
}

// stepUpsertChanged queues the upsert of a desired state the edge does not
// hold, unless it is queued already or was refused for good.
func stepUpsertChanged(_ context.Context, d *decision, fx *stepEffects) (bool, error) {
	var queue bool
	fx.withLedger(func(l *ledger) {
		fx.resynced(d.it, false)
		queue = l.upsertQueued(d.id, d.key, d.upsert.ContentHash)
	})
	if queue {
		fx.put(newIntent(d.it.pr, d.key, d.obj, &ferryv1.SyncIntent_Upsert{Upsert: d.upsert}))
	}
	return false, nil
}

// stepServiceRelated re-evaluates the service-origin copies of a primary
// whose desired state changed: its reference may now point elsewhere.
func stepServiceRelated(_ context.Context, d *decision, fx *stepEffects) (bool, error) {
	fx.queueServiceRelated(d.it)
	return true, nil
}

// deleteOlderCopies queues the deletion of the copies the edge may hold at
// id's place of other objects (older UIDs: the name was deleted and
// created again, possibly unseen) and tells whether there are any.
func deleteOlderCopies(fx *stepEffects, id objectID) bool {
	return deleteLedgerCopies(fx, id.pr, func(l *ledger) []objectID { return l.olderCopies(id) },
		"an older object's copy is deleted before the new object's is sent")
}

// deleteLedgerCopies asks the edge to delete the copies of pr's objects
// that copies selects from the ledger: each gets a delete intent carrying
// its own key, UID included, unless one is queued already; why is logged.
// It tells whether copies selected any.
func deleteLedgerCopies(fx *stepEffects, pr string, copies func(*ledger) []objectID, why string) bool {
	var ids []objectID
	var put []*ferryv1.ObjectKey
	fx.withLedger(func(l *ledger) {
		ids = copies(l)
		for _, id := range ids {
			key := l.get(id).key
			if l.deleteQueued(id, key) {
				put = append(put, key)
			}
		}
	})
	for _, key := range put {
		fx.log.V(1).Info(why, logging.KeyObject, KeyString(key))
		fx.put(&ferryv1.SyncIntent{Key: key, PublishedResource: pr, Version: &ferryv1.ObjectVersion{},
			Operation: &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{}}})
	}
	return len(ids) > 0
}

// newIntent is the intent for obj (protocol key key) with operation op.
func newIntent(pr string, key *ferryv1.ObjectKey, obj *unstructured.Unstructured, op any) *ferryv1.SyncIntent {
	in := &ferryv1.SyncIntent{
		Key:               key,
		PublishedResource: pr,
		Version:           &ferryv1.ObjectVersion{ResourceVersion: obj.GetResourceVersion(), Generation: obj.GetGeneration()},
	}
	switch o := op.(type) {
	case *ferryv1.SyncIntent_Upsert:
		in.Operation = o
	case *ferryv1.SyncIntent_Delete:
		in.Operation = o
	}
	return in
}

package engine

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/ferry-dev/ferry/pkg/logging"

	"github.com/go-logr/logr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/workqueue"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/broker/replication"
	"github.com/ferry-dev/ferry/pkg/projection"
	"github.com/ferry-dev/ferry/pkg/protocol"
	"github.com/ferry-dev/ferry/pkg/related"
	"github.com/ferry-dev/ferry/pkg/watching"
)

// syncedResource derives what to sync from a successful publish (spec is
// msg's, decoded); ok is false when the PublishedResource disables
// synchronization.
func syncedResource(msg *ferryv1.Publish, spec *ferryv1alpha1.PublishedResourceSpec, res *ferryv1.PublishResult) (r replication.Resource, ok bool, err error) {
	if spec.SyncDisabled() {
		return r, false, nil
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := json.Unmarshal(msg.GetCustomResourceDefinition(), &crd); err != nil {
		return r, false, err
	}
	selector := labels.Everything()
	if spec.Filter != nil && spec.Filter.Resource != nil {
		if selector, err = metav1.LabelSelectorAsSelector(spec.Filter.Resource); err != nil {
			return r, false, fmt.Errorf("spec.filter.resource: %w", err)
		}
	}
	var nsSelector labels.Selector
	var nsName string
	if spec.Filter != nil {
		if err := spec.Filter.Namespace.Validate(); err != nil {
			return r, false, err
		}
		if sel, ok := spec.Filter.Namespace.LabelSelector(); ok {
			if nsSelector, err = metav1.LabelSelectorAsSelector(sel); err != nil {
				return r, false, fmt.Errorf("spec.filter.namespace: %w", err)
			}
		}
		nsName, _ = spec.Filter.Namespace.NamespaceName()
	}
	refs, err := related.Compile(spec.Related)
	if err != nil {
		return r, false, err
	}
	if err := resolveRelatedKinds(refs, res.GetRelatedKinds()); err != nil {
		return r, false, err
	}
	versions := projection.SelectedVersions(&spec.Resource, &crd)
	hasStatus := true
	for _, v := range crd.Spec.Versions {
		if slices.Contains(versions, v.Name) && (v.Subresources == nil || v.Subresources.Status == nil) {
			hasStatus = false
		}
	}
	gvr := res.GetServedResource()
	return replication.Resource{
		PublishedResource: msg.GetPublishedResource(),
		GVR:               schema.GroupVersionResource{Group: gvr.GetGroup(), Version: gvr.GetVersion(), Resource: gvr.GetResource()},
		HasStatus:         hasStatus,
		Selector:          selector,
		WorkspacePaths:    spec.EnableWorkspacePaths,
		NamespaceSelector: nsSelector,
		NamespaceName:     nsName,
		Related:           refs,
		ConsumerOrphan:    spec.ConsumerOrphanAllowed(),
		AdoptFinalizer:    adoptFinalizer(spec.Adopt),
	}, true, nil
}

// resolveRelatedKinds records on the projected entries of refs the kinds
// the publisher found in kcp (PublishResult.related_kinds): the edge sends
// no kind for them, and the kind on the service cluster may differ.
func resolveRelatedKinds(refs []*related.Reference, kinds []*ferryv1.RelatedKind) error {
	for _, ref := range refs {
		if !ref.Projected {
			continue
		}
		i := slices.IndexFunc(kinds, func(k *ferryv1.RelatedKind) bool { return k.GetIdentifier() == ref.Identifier })
		if i < 0 || kinds[i].GetKind() == "" {
			return fmt.Errorf("spec.related[%s]: the publish found no kind in kcp for the projected resource %s", ref.Identifier, ref.Resource)
		}
		ref.ResolveKind(kinds[i].GetKind())
	}
	return nil
}

// reportTask is one edge report to apply to kcp.
type reportTask struct {
	// id and epoch identify the report for the edge's outbox: ids are
	// unique within an epoch only. Both are echoed in the answer.
	id, epoch uint64
	// attachment is the stream the report came on (Engine.Attach); it is
	// answered on that stream only. Report ids restart with every edge
	// process, so an answer on a later stream could ack another report.
	attachment     uint64
	pr             string
	key            *ferryv1.ObjectKey
	status         *ferryv1.StatusReport        // status report when set
	deletion       bool                         // deletion confirmation
	resend         *ferryv1.ResendRequest       // the edge needs the desired state again
	related        *ferryv1.RelatedObjectReport // related object report when set
	failure        *ferryv1.ApplyError          // a nack to record as an Event (not answered)
	relatedFailure bool                         // the nack is about a related object of key
}

// kind is the task's report kind for metrics; failures are the broker's
// own records of nacks, not edge reports.
func (t reportTask) kind() string {
	switch {
	case t.failure != nil:
		return ""
	case t.deletion:
		return protocol.ReportKindDeletion
	case t.resend != nil:
		return protocol.ReportKindResend
	case t.related != nil:
		return protocol.ReportKindRelated
	}
	return protocol.ReportKindStatus
}

// reportWorker applies the edge's status reports, related object reports
// and deletion confirmations to kcp off the stream loop. Per object and kind
// only the latest report is applied (an older one is answered at once, also
// while it waits for a retry or is being written); transient kcp failures
// are retried with a backoff of at most maxReportBackoff, and all the
// reports waiting for a retry go again at once when a kcp write succeeds;
// permanent failures are answered with a final error; each report is
// answered exactly once, through send (the control lane of the stream the
// report came on; dropped when that stream is gone).
type reportWorker struct {
	mgr  reportWriter
	send func(attachment uint64, m *ferryv1.ConnectResponse)
	log  logr.Logger
	// observer learns the reports received and answered.
	observer Observer

	mu     sync.Mutex
	latest map[string]reportTask
	// waiting holds the keys waiting for a retry after a kcp failure.
	waiting map[string]struct{}
	// restarted is when restartWaiting last restarted them.
	restarted time.Time
	queue     workqueue.TypedRateLimitingInterface[string]
}

// reportWriter writes reports into kcp. Implemented by *replication.Manager.
type reportWriter interface {
	PublishedResourceFor(key *ferryv1.ObjectKey) (string, bool)
	WriteStatus(ctx context.Context, pr string, key *ferryv1.ObjectKey, status []byte) (written bool, err error)
	RecordStatusFailure(ctx context.Context, pr string, key *ferryv1.ObjectKey, applyErr *ferryv1.ApplyError) error
	RecordFailure(ctx context.Context, pr string, key *ferryv1.ObjectKey, applyErr *ferryv1.ApplyError, related bool) error
	Release(ctx context.Context, pr string, key *ferryv1.ObjectKey) error
	Resend(pr string, key *ferryv1.ObjectKey)
	ResendRelated(pr string, rt *ferryv1.RelatedTo)
	WriteRelated(ctx context.Context, pr string, r *ferryv1.RelatedObjectReport) error
}

// reportWorkerOptions configure a reportWorker.
type reportWorkerOptions struct {
	// writer writes the reports into kcp.
	writer reportWriter
	// send sends an answer on the control lane of the stream attachment.
	send func(attachment uint64, m *ferryv1.ConnectResponse)
	log  logr.Logger
	// observer learns the reports received and answered; nil observes
	// nothing.
	observer Observer
	// limiter spaces the retries of one report; nil is
	// reportRateLimiter() (tests observe the delays through it).
	limiter workqueue.TypedRateLimiter[string]
}

func newReportWorker(o reportWorkerOptions) *reportWorker {
	limiter := o.limiter
	if limiter == nil {
		limiter = reportRateLimiter()
	}
	return &reportWorker{
		mgr: o.writer, send: o.send, log: o.log, observer: Observers(o.observer),
		latest:  map[string]reportTask{},
		waiting: map[string]struct{}{},
		queue:   workqueue.NewTypedRateLimitingQueueWithConfig(limiter, workqueue.TypedRateLimitingQueueConfig[string]{Name: "reports"}),
	}
}

// Report retries: per report, from minReportBackoff doubling up to
// maxReportBackoff. Not the controller default (up to 1,000 s per item plus
// a 10 qps bucket shared by all): after a kcp outage every waiting status
// and deletion confirmation must reach kcp within seconds, and the edge
// holds newer reports of an object until the older one is answered. A kcp
// that is down sees at most one attempt per waiting report every
// maxReportBackoff (through the worker goroutines); the first write that
// succeeds restarts all waiting reports at once (restartWaiting).
const (
	minReportBackoff = 100 * time.Millisecond
	maxReportBackoff = 5 * time.Second
)

// reportRateLimiter spaces the retries of one report.
func reportRateLimiter() workqueue.TypedRateLimiter[string] {
	return workqueue.NewTypedItemExponentialFailureRateLimiter[string](minReportBackoff, maxReportBackoff)
}

func (w *reportWorker) add(t reportTask) {
	if kind := t.kind(); kind != "" {
		w.observer.ReportReceived(kind)
	}
	k := reportKey(t)
	w.mu.Lock()
	old, superseded := w.latest[k]
	w.latest[k] = t
	w.mu.Unlock()
	if superseded {
		w.superseded(old, t)
	}
	w.queue.Add(k)
}

// reportKey is t's queue key: the latest report per object and kind wins.
func reportKey(t reportTask) string {
	k := replication.KeyString(t.key)
	switch {
	case t.deletion:
		return "delete|" + k
	case t.resend != nil && t.resend.GetRelatedTo() != nil:
		return "resend|" + k + "|" + t.resend.GetRelatedTo().GetIdentifier()
	case t.resend != nil:
		return "resend|" + k
	case t.related != nil:
		return "related|" + k + "|" + t.related.GetRelatedTo().GetIdentifier()
	case t.failure != nil:
		return "failure|" + k
	}
	return "status|" + k
}

// run applies reports with workers goroutines until ctx ends. The
// workqueue never hands one key to two workers at once.
func (w *reportWorker) run(ctx context.Context, workers int) {
	watching.RunWorkers(ctx, w.queue, workers, func() bool { return w.processNext(ctx) })
}

// processNext applies the next queued report (blocking until there is one);
// false once the queue is shut down.
func (w *reportWorker) processNext(ctx context.Context) bool {
	k, shutdown := w.queue.Get()
	if shutdown {
		return false
	}
	w.mu.Lock()
	t, ok := w.latest[k]
	delete(w.latest, k)
	delete(w.waiting, k)
	w.mu.Unlock()
	if ok {
		w.apply(ctx, k, t)
	}
	w.queue.Done(k)
	return true
}

// unknownResourceRetries bounds how long a report waits for its
// PublishedResource to be synced (about two minutes with the report
// backoff: 6 s for the first six retries, then 5 s each) before it is
// answered with an error.
const unknownResourceRetries = 29

func (w *reportWorker) apply(ctx context.Context, k string, t reportTask) {
	if t.pr == "" {
		pr, ok := w.mgr.PublishedResourceFor(t.key)
		if !ok && w.queue.NumRequeues(k) < unknownResourceRetries {
			w.retry(k, t, false)
			return
		}
		if !ok {
			w.log.Info("edge report for a resource this edge does not sync; dropped", logging.KeyObject, replication.KeyString(t.key))
			w.queue.Forget(k)
			w.done(t, &ferryv1.ReportResult{ReportId: t.id, ReportEpoch: t.epoch, Error: &ferryv1.ApplyError{
				Reason:  ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_PUBLISHED,
				Message: fmt.Sprintf("%s is not synced by this edge", replication.KeyString(t.key)),
			}})
			return
		}
		t.pr = pr
	}
	var err error
	switch {
	case t.failure != nil:
		if err := w.mgr.RecordFailure(ctx, t.pr, t.key, t.failure, t.relatedFailure); err != nil {
			// Best effort: the failure is logged; the next one is recorded.
			w.log.Error(err, "cannot record a sync failure as an Event in kcp", logging.KeyObject, replication.KeyString(t.key))
		} else {
			w.restartWaiting()
		}
		w.queue.Forget(k)
		return
	case t.deletion:
		err = w.mgr.Release(ctx, t.pr, t.key)
		w.log.V(4).Info("edge confirmed a deletion", logging.KeyObject, replication.KeyString(t.key), "error", err)
	case t.resend != nil:
		w.log.Info("edge asked for an object's desired state again", logging.KeyObject, replication.KeyString(t.key),
			"localCopy", t.resend.GetReason())
		if rt := t.resend.GetRelatedTo(); rt != nil {
			w.mgr.ResendRelated(t.pr, rt)
		} else {
			w.mgr.Resend(t.pr, t.key)
		}
	case t.related != nil:
		switch e := t.related.GetError(); {
		case e == nil, e.GetReason() == ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN,
			e.GetReason() == ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT:
			// Refusals remove what was copied before (WriteRelated).
			err = w.mgr.WriteRelated(ctx, t.pr, t.related)
		default:
			err = w.mgr.RecordFailure(ctx, t.pr, t.key, e, true)
		}
	case t.status.GetError() != nil:
		err = w.mgr.RecordStatusFailure(ctx, t.pr, t.key, t.status.GetError())
	default:
		_, err = w.mgr.WriteStatus(ctx, t.pr, t.key, t.status.GetStatus())
	}
	answer := &ferryv1.ReportResult{ReportId: t.id, ReportEpoch: t.epoch}
	switch {
	case err == nil:
		w.queue.Forget(k)
	case Permanent(err):
		w.log.Info("edge report not applied (final)", logging.KeyObject, replication.KeyString(t.key), "error", err.Error())
		answer.Error = &ferryv1.ApplyError{Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_INVALID, Message: err.Error()}
		w.queue.Forget(k)
	default:
		w.log.Error(err, "applying an edge report to kcp failed; retrying", logging.KeyObject, replication.KeyString(t.key))
		w.retry(k, t, true)
		return // answered once it succeeds or fails for good
	}
	if t.resend == nil {
		// kcp answered (a resend writes nothing): the reports waiting
		// because it did not go again now.
		w.restartWaiting()
	}
	w.done(t, answer)
}

// done answers t with answer, for the observer and the edge.
func (w *reportWorker) done(t reportTask, answer *ferryv1.ReportResult) {
	w.observer.ReportAnswered(t.kind(), t.key, answer)
	w.answer(t, answer)
}

// Permanent tells whether a kcp write failed for a reason retrying cannot
// fix: the object is gone or was replaced (a failed UID precondition), the
// write is invalid or forbidden, or the broker refuses the report.
func Permanent(err error) bool {
	switch {
	case errors.Is(err, replication.ErrRefused), errors.Is(err, replication.ErrNoStatus), errors.Is(err, replication.ErrGone),
		errors.Is(err, replication.ErrNotDeleting):
		return true
	case apierrors.IsNotFound(err), apierrors.IsGone(err), apierrors.IsInvalid(err), apierrors.IsBadRequest(err),
		apierrors.IsForbidden(err), apierrors.IsMethodNotSupported(err), apierrors.IsRequestEntityTooLargeError(err):
		return true
	}
	return false
}

// retry applies t again later unless a newer report replaced it while it
// was being applied: the newer one is queued already, and t is answered as
// superseded. kcpFailed tells whether kcp failed (the retry then restarts
// as soon as a kcp write succeeds).
func (w *reportWorker) retry(k string, t reportTask, kcpFailed bool) {
	w.mu.Lock()
	newer, superseded := w.latest[k]
	if !superseded {
		w.latest[k] = t
		if kcpFailed {
			w.waiting[k] = struct{}{}
		}
	}
	w.mu.Unlock()
	if superseded {
		w.superseded(t, newer)
		return
	}
	w.queue.AddRateLimited(k)
}

// minRestartInterval spaces restartWaiting's restarts: when kcp fails
// only some writes (one shard down), every success elsewhere would
// otherwise retry the failing reports again at once.
const minRestartInterval = time.Second

// restartWaiting retries at once the reports waiting for a retry after a
// kcp failure: kcp answers again. Their backoff is kept (forgotten once
// written), so a report that still fails waits as long as before.
func (w *reportWorker) restartWaiting() {
	w.mu.Lock()
	now := time.Now()
	if len(w.waiting) == 0 || now.Sub(w.restarted) < minRestartInterval {
		w.mu.Unlock()
		return
	}
	w.restarted = now
	keys := make([]string, 0, len(w.waiting))
	for k := range w.waiting {
		keys = append(keys, k)
	}
	clear(w.waiting)
	w.mu.Unlock()
	for _, k := range keys {
		w.queue.Add(k)
	}
}

// superseded answers old, replaced by newer before it was applied: only the
// latest report of an object and kind is written.
func (w *reportWorker) superseded(old, newer reportTask) {
	if old.failure != nil || (old.id == newer.id && old.epoch == newer.epoch && old.attachment == newer.attachment) {
		return // not a report, or the same one re-sent: answered once
	}
	w.answer(old, &ferryv1.ReportResult{ReportId: old.id, ReportEpoch: old.epoch})
}

// answer sends t's answer a on the stream t came on.
func (w *reportWorker) answer(t reportTask, a *ferryv1.ReportResult) {
	w.send(t.attachment, &ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_ReportResult{ReportResult: a}})
}

// adoptFinalizer is the finalizer of the sync agent whose copies spec.adopt
// takes over ("" for none).
func adoptFinalizer(a *ferryv1alpha1.AdoptSpec) string {
	if a != nil && a.From == ferryv1alpha1.AdoptFromAPISyncAgent {
		return replication.SyncAgentFinalizer
	}
	return ""
}

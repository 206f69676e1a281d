package engine

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"

	"github.com/ferry-dev/ferry/pkg/logging"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/workqueue"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/publish"
	"github.com/ferry-dev/ferry/broker/replication"
	"github.com/ferry-dev/ferry/pkg/related"
)

// PublishApplier applies one Publish to kcp. Implemented by
// *publish.Publisher; must be safe for concurrent use. An error means "retry
// later"; problems with the input are reported in the result.
type PublishApplier interface {
	Apply(ctx context.Context, export config.APIExportRef, owners publish.Owners, msg *ferryv1.Publish) (*ferryv1.PublishResult, error)
}

// publishWorker applies the edge's Publish and Unpublish messages off the
// stream loop, so slow kcp calls never delay heartbeats. Per
// PublishedResource only the latest message counts; kcp failures are retried
// with the workqueue's rate limiter. A Publish equal to the one last applied
// (every stream re-sends them) is answered from memory, without kcp.
type publishWorker struct {
	applier PublishApplier
	export  config.APIExportRef
	owners  publish.Owners // only touched by run's goroutine
	results func(*ferryv1.PublishResult)
	log     logr.Logger
	mgr     *replication.Manager
	// allowRelated tells whether the edge may name a resource in
	// spec.related[] (the broker's configuration).
	allowRelated func(schema.GroupResource) bool
	// done holds, per PublishedResource, the last Publish applied and its
	// result (only run's goroutine touches it).
	done map[string]applied

	mu     sync.Mutex
	latest map[string]*ferryv1.ConnectRequest
	queue  workqueue.TypedRateLimitingInterface[string]
}

type applied struct {
	msg *ferryv1.Publish
	res *ferryv1.PublishResult
}

// newPublishWorker returns a publish worker; allowRelated nil allows the
// default related resources (config.Edge's).
func newPublishWorker(applier PublishApplier, export config.APIExportRef, results func(*ferryv1.PublishResult), log logr.Logger,
	mgr *replication.Manager, allowRelated func(schema.GroupResource) bool,
) *publishWorker {
	if allowRelated == nil {
		allowRelated = config.Edge{}.AllowsRelated
	}
	return &publishWorker{
		mgr:          mgr,
		allowRelated: allowRelated,
		applier:      applier,
		export:       export,
		owners:       publish.Owners{},
		results:      results,
		log:          log,
		done:         map[string]applied{},
		latest:       map[string]*ferryv1.ConnectRequest{},
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "publish"}),
	}
}

// enqueue records msg (a Publish or Unpublish) as the latest for name.
func (w *publishWorker) enqueue(name string, msg *ferryv1.ConnectRequest) {
	w.mu.Lock()
	w.latest[name] = msg
	w.mu.Unlock()
	w.queue.Add(name)
}

// run processes the queue until ctx ends.
func (w *publishWorker) run(ctx context.Context) {
	go func() {
		<-ctx.Done()
		w.queue.ShutDown()
	}()
	for {
		name, shutdown := w.queue.Get()
		if shutdown {
			return
		}
		w.process(ctx, name)
		w.queue.Done(name)
	}
}

func (w *publishWorker) process(ctx context.Context, name string) {
	w.mu.Lock()
	msg := w.latest[name]
	delete(w.latest, name)
	w.mu.Unlock()

	switch m := msg.GetMessage().(type) {
	case *ferryv1.ConnectRequest_Unpublish:
		publish.Forget(w.owners, name)
		delete(w.done, name)
		if m.Unpublish.GetRelease() == ferryv1.ReleasePolicy_RELEASE_POLICY_UNSPECIFIED {
			// Temporary: the finalizers stay until the edge publishes again;
			// deletions still flow meanwhile.
			w.mgr.Withdraw(name)
			w.queue.Forget(name)
			w.log.Info("PublishedResource withdrawn; its schema stays in the APIExport", logging.KeyPublishedResource, name)
			return
		}
		res, err := w.release(ctx, m.Unpublish)
		if err != nil {
			w.log.Error(err, "releasing the objects of a deleted PublishedResource failed; retrying", logging.KeyPublishedResource, name)
			w.requeue(name, msg)
			return
		}
		w.queue.Forget(name)
		w.results(res)
	case *ferryv1.ConnectRequest_Publish:
		if d, ok := w.done[name]; ok && proto.Equal(d.msg, m.Publish) {
			w.queue.Forget(name)
			w.log.Info("publish unchanged since it was applied; answered without a call to kcp", logging.KeyPublishedResource, name,
				"revision", d.res.GetRevision())
			w.results(d.res)
			return
		}
		// A spec that does not decode is the publisher's to refuse.
		var spec ferryv1alpha1.PublishedResourceSpec
		specErr := json.Unmarshal(m.Publish.GetSpec(), &spec)
		var res *ferryv1.PublishResult
		var err error
		if specErr == nil {
			res = w.refuseRelated(m.Publish, &spec)
		}
		if res == nil {
			res, err = w.applier.Apply(ctx, w.export, w.owners, m.Publish)
		}
		if err == nil && specErr == nil && res.GetState() == ferryv1.PublishState_PUBLISH_STATE_PUBLISHED {
			err = w.published(ctx, m.Publish, &spec, res)
		}
		if err != nil {
			w.log.Error(err, "publishing failed; retrying", logging.KeyPublishedResource, name)
			w.requeue(name, msg)
			res = &ferryv1.PublishResult{
				PublishedResource: name, Generation: m.Publish.GetGeneration(), Revision: m.Publish.GetRevision(),
				State: ferryv1.PublishState_PUBLISH_STATE_PENDING, Reason: "KCPError", Message: "kcp: " + err.Error() + " (retrying)",
			}
		} else {
			w.queue.Forget(name)
			w.done[name] = applied{msg: m.Publish, res: res}
			w.log.Info("publish applied", logging.KeyPublishedResource, name, "revision", res.GetRevision(),
				"state", res.GetState().String(), "reason", res.GetReason(), "schema", res.GetResourceSchemaName())
			if res.GetState() == ferryv1.PublishState_PUBLISH_STATE_FAILED {
				// Invalid for now: nothing new is synced, but objects deleted
				// in kcp still get their copies deleted and are released.
				w.mgr.Withdraw(name)
			}
		}
		w.results(res)
	}
}

// requeue applies msg again later unless a newer message replaced it.
func (w *publishWorker) requeue(name string, msg *ferryv1.ConnectRequest) {
	w.mu.Lock()
	if _, newer := w.latest[name]; !newer {
		w.latest[name] = msg
	}
	w.mu.Unlock()
	w.queue.AddRateLimited(name)
}

// published starts (or updates) syncing a published resource's objects, or
// releases them when its synchronization is disabled.
func (w *publishWorker) published(ctx context.Context, msg *ferryv1.Publish, spec *ferryv1alpha1.PublishedResourceSpec, res *ferryv1.PublishResult) error {
	r, ok, err := syncedResource(msg, spec, res)
	switch {
	case err != nil:
		w.log.Error(err, "cannot sync published resource", logging.KeyPublishedResource, msg.GetPublishedResource())
	case ok:
		w.mgr.Ensure(r)
	default:
		gvr := res.GetServedResource()
		_, err := w.mgr.ReleaseAll(ctx, msg.GetPublishedResource(),
			schema.GroupVersionResource{Group: gvr.GetGroup(), Version: gvr.GetVersion(), Resource: gvr.GetResource()},
			spec.EffectiveDeletionPolicy() == ferryv1alpha1.DeletionPolicyDelete)
		return err
	}
	return nil
}

// release answers an Unpublish with a release policy: every object of the
// served resource is released in kcp. The resource must be the export's.
func (w *publishWorker) release(ctx context.Context, u *ferryv1.Unpublish) (*ferryv1.PublishResult, error) {
	name := u.GetPublishedResource()
	gvr := u.GetServedResource()
	res := &ferryv1.PublishResult{PublishedResource: name, State: ferryv1.PublishState_PUBLISH_STATE_WITHDRAWN, ServedResource: gvr}
	if gvr.GetResource() == "" {
		// Never published: nothing in kcp carries a finalizer of it.
		w.mgr.Remove(name)
		res.Message = "withdrawn; it was never served in kcp"
		w.log.Info("PublishedResource withdrawn; it was never served in kcp", logging.KeyPublishedResource, name)
		return res, nil
	}
	if gvr.GetGroup() != w.export.Name || gvr.GetVersion() == "" {
		// Not the export's: refused, but answered, so the edge is not stuck.
		w.mgr.Remove(name)
		res.State, res.Reason = ferryv1.PublishState_PUBLISH_STATE_FAILED, ferryv1alpha1.ReasonBrokerRefused
		res.Message = fmt.Sprintf("served resource %s.%s/%s is not part of APIExport %s; nothing released",
			gvr.GetResource(), gvr.GetGroup(), gvr.GetVersion(), w.export)
		return res, nil
	}
	n, err := w.mgr.ReleaseAll(ctx, name, schema.GroupVersionResource{Group: gvr.GetGroup(), Version: gvr.GetVersion(), Resource: gvr.GetResource()},
		u.GetRelease() == ferryv1.ReleasePolicy_RELEASE_POLICY_DELETE)
	if err != nil {
		return nil, err
	}
	res.Message = fmt.Sprintf("withdrawn; the broker released its finalizer on %d objects in kcp", n)
	w.log.Info("PublishedResource withdrawn; its objects are released and its schema stays in the APIExport", logging.KeyPublishedResource, name,
		"released", n, "deleteRelated", u.GetRelease() == ferryv1.ReleasePolicy_RELEASE_POLICY_DELETE)
	return res, nil
}

// refuseRelated answers a Publish whose spec.related[] names a resource the
// broker's configuration does not let this edge claim in kcp (nil when
// every entry is allowed; an entry that does not compile is the
// projection's to refuse). Refusals are counted.
func (w *publishWorker) refuseRelated(msg *ferryv1.Publish, spec *ferryv1alpha1.PublishedResourceSpec) *ferryv1.PublishResult {
	refs, err := related.Compile(spec.Related)
	if err != nil {
		return nil
	}
	for _, ref := range refs {
		// The APIExport's own resources (published by this edge, e.g.
		// schema-only with synchronization disabled) are the edge's API:
		// no permission claim, nothing to allow.
		if gr := ref.Resource.GroupResource(); gr.Group != w.export.Name && !w.allowRelated(gr) {
			w.mgr.CountRefused()
			w.log.Info("refused a PublishedResource: its related[] names a resource this edge may not claim", logging.KeyPublishedResource, msg.GetPublishedResource(),
				"related", ref.Identifier, "resource", gr.String())
			return &ferryv1.PublishResult{
				PublishedResource: msg.GetPublishedResource(), Generation: msg.GetGeneration(), Revision: msg.GetRevision(),
				State: ferryv1.PublishState_PUBLISH_STATE_FAILED, Reason: ferryv1alpha1.ReasonBrokerRefused,
				Message: fmt.Sprintf("spec.related[%s]: the broker's configuration does not let this edge claim %s in kcp (ask the platform team to add it to the edge's relatedResources)",
					ref.Identifier, gr.String()),
			}
		}
	}
	return nil
}

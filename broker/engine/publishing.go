package server

import (
	"context"
	"sync"

	"github.com/go-logr/logr"
	"k8s.io/client-go/util/workqueue"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/publish"
)

// PublishApplier applies one Publish to kcp. Implemented by
// *publish.Publisher; must be safe for concurrent use. An error means "retry
// later"; problems with the input are reported in the result.
type PublishApplier interface {
	Apply(ctx context.Context, export config.APIExportRef, owners publish.Owners, msg *ferryv1.Publish) (*ferryv1.PublishResult, error)
}

// publishWorker applies one session's Publish and Unpublish messages off the
// stream loop, so slow kcp calls never delay heartbeats. Per
// PublishedResource only the latest message counts; kcp failures are retried
// with the workqueue's rate limiter.
type publishWorker struct {
	applier PublishApplier
	export  config.APIExportRef
	owners  publish.Owners // only touched by run's goroutine
	results chan<- *ferryv1.PublishResult
	log     logr.Logger
	// onPublished and onWithdrawn tell the session's sync what to watch.
	onPublished func(msg *ferryv1.Publish, res *ferryv1.PublishResult)
	onWithdrawn func(name string)

	mu     sync.Mutex
	latest map[string]*ferryv1.ConnectRequest
	queue  workqueue.TypedRateLimitingInterface[string]
}

func newPublishWorker(applier PublishApplier, export config.APIExportRef, results chan<- *ferryv1.PublishResult, log logr.Logger,
	onPublished func(*ferryv1.Publish, *ferryv1.PublishResult), onWithdrawn func(string),
) *publishWorker {
	return &publishWorker{
		onPublished: onPublished,
		onWithdrawn: onWithdrawn,
		applier:     applier,
		export:      export,
		owners:      publish.Owners{},
		results:     results,
		log:         log,
		latest:      map[string]*ferryv1.ConnectRequest{},
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
		w.onWithdrawn(name)
		w.queue.Forget(name)
		w.log.Info("PublishedResource withdrawn; its schema stays in the APIExport", "publishedResource", name)
	case *ferryv1.ConnectRequest_Publish:
		res, err := w.applier.Apply(ctx, w.export, w.owners, m.Publish)
		if err != nil {
			w.log.Error(err, "publishing failed; retrying", "publishedResource", name)
			w.mu.Lock()
			if _, newer := w.latest[name]; !newer {
				w.latest[name] = msg
			}
			w.mu.Unlock()
			w.queue.AddRateLimited(name)
			res = &ferryv1.PublishResult{
				PublishedResource: name, Generation: m.Publish.GetGeneration(), Revision: m.Publish.GetRevision(),
				State: ferryv1.PublishState_PUBLISH_STATE_PENDING, Reason: "KCPError", Message: "kcp: " + err.Error() + " (retrying)",
			}
		} else {
			w.queue.Forget(name)
			w.log.Info("publish applied", "publishedResource", name, "revision", res.GetRevision(),
				"state", res.GetState().String(), "reason", res.GetReason(), "schema", res.GetResourceSchemaName())
			switch res.GetState() {
			case ferryv1.PublishState_PUBLISH_STATE_PUBLISHED:
				w.onPublished(m.Publish, res)
			case ferryv1.PublishState_PUBLISH_STATE_FAILED:
				w.onWithdrawn(name)
			}
		}
		select {
		case w.results <- res:
		case <-ctx.Done():
		}
	}
}

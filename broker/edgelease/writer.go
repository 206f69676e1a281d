// Package edgelease shows in kcp whether each configured edge is connected:
// the broker keeps a coordination.k8s.io/v1 Lease per configured edge
// identity in the workspace of the APIExport the edge serves. While the edge
// is connected the Lease's holder is the edge's agent name, acquireTime is
// when it connected and renewTime the last message from it; annotations
// (ferry.dev/...) add the state, versions, session and error counts.
//
// Writes never slow an edge's stream: Set only records the latest status
// per identity and wakes a worker; the worker writes the latest status,
// retries failures with backoff and keeps, per identity, one status and the
// last Lease it wrote, so a kcp outage costs no memory beyond that.
package edgelease

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	coordinationv1 "k8s.io/api/coordination/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/util/workqueue"

	"github.com/ferry-dev/ferry/pkg/logging"
)

// Options configure a Writer.
type Options struct {
	// Clients returns the Leases client of a workspace. Required.
	Clients Clients
	// Namespace holds the Leases in every APIExport's workspace. Required.
	Namespace string
	// Workers write Leases of different identities in parallel; default 2.
	Workers int
	// RetryInitial and RetryMax bound the backoff of a failing write;
	// default 500ms and 1m.
	RetryInitial, RetryMax time.Duration
	// WriteTimeout bounds one write (its requests to kcp); default 10s.
	WriteTimeout time.Duration
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Log receives failures (and, at V(1), every write).
	Log logr.Logger
}

// pending is the latest status of an identity and its generation, which
// tells whether it changed while being written.
type pending struct {
	status Status
	gen    uint64
}

// Writer writes edge Leases into kcp off the caller's goroutine: latest
// status per identity wins. Create with NewWriter, then Run. Safe for
// concurrent use.
type Writer struct {
	opts  Options
	queue workqueue.TypedRateLimitingInterface[string]

	mu      sync.Mutex
	gen     uint64
	pending map[string]pending
	// written is the last Lease written per identity: renewals update it
	// without reading it first.
	written map[string]*coordinationv1.Lease
	// failing holds the identities whose last write failed: their retry is
	// scheduled with backoff, and a newer status waits for it rather than
	// hammering a failing kcp.
	failing map[string]bool
	// seeds holds, per workspace, the List of its Leases that the first
	// writes after the broker started begin from (seed.go).
	seeds map[string]*seed
	// idle is closed and replaced when pending becomes empty.
	idle chan struct{}
}

// NewWriter returns a writer; nothing is written before Run.
func NewWriter(o Options) *Writer {
	if o.Workers <= 0 {
		o.Workers = 2
	}
	if o.RetryInitial <= 0 {
		o.RetryInitial = 500 * time.Millisecond
	}
	if o.RetryMax < o.RetryInitial {
		o.RetryMax = max(time.Minute, o.RetryInitial)
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 10 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	return &Writer{
		opts:    o,
		queue:   workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](o.RetryInitial, o.RetryMax)),
		pending: map[string]pending{},
		written: map[string]*coordinationv1.Lease{},
		failing: map[string]bool{},
		seeds:   map[string]*seed{},
		idle:    make(chan struct{}),
	}
}

// Set records s as the latest status of its identity, replacing one not
// written yet. It never blocks on kcp. While the identity's writes fail, s
// waits for the next retry (backoff).
func (w *Writer) Set(s Status) {
	w.mu.Lock()
	w.gen++
	w.pending[s.key()] = pending{status: s, gen: w.gen}
	failing := w.failing[s.key()]
	w.mu.Unlock()
	if !failing {
		w.queue.Add(s.key())
	}
}

// Pending is how many identities have a status not written yet.
func (w *Writer) Pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.pending)
}

// Run writes until ctx ends; it returns when its workers have stopped.
// Statuses set after that are not written.
func (w *Writer) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for range w.opts.Workers {
		wg.Go(func() {
			for w.processNext(ctx) {
			}
		})
	}
	<-ctx.Done()
	w.queue.ShutDown()
	wg.Wait()
}

// Flush waits until every status set so far is written (or, for a Lease
// another session holds, found not to be written), retrying a failing
// write at once rather than after its backoff, until ctx ends. The broker
// calls it when it shuts down, after its edges' streams ended.
func (w *Writer) Flush(ctx context.Context) error {
	w.mu.Lock()
	for k := range w.pending {
		w.queue.Add(k) // skips the backoff of a failed write
	}
	w.mu.Unlock()
	for {
		w.mu.Lock()
		n, idle := len(w.pending), w.idle
		w.mu.Unlock()
		if n == 0 {
			return nil
		}
		select {
		case <-idle:
		case <-ctx.Done():
			return fmt.Errorf("%d edge Lease(s) not written: %w", n, ctx.Err())
		}
	}
}

// processNext writes the latest status of one identity; false once the
// queue shut down.
func (w *Writer) processNext(ctx context.Context) bool {
	key, quit := w.queue.Get()
	if quit {
		return false
	}
	defer w.queue.Done(key)

	w.mu.Lock()
	p, ok := w.pending[key]
	w.mu.Unlock()
	if !ok {
		w.queue.Forget(key)
		return true
	}
	err := w.write(ctx, p.status)
	if err != nil {
		if ctx.Err() != nil {
			return true // shutting down
		}
		w.mu.Lock()
		w.failing[key] = true
		w.mu.Unlock()
		attempts := w.queue.NumRequeues(key) + 1
		w.opts.Log.Error(err, "cannot write the edge's Lease in kcp; retrying with backoff", logging.KeyIdentity, key,
			logging.KeyExport, p.status.Edge.APIExport.String(), "lease", w.opts.Namespace+"/"+p.status.name(), logging.KeyAttempt, attempts)
		w.queue.AddRateLimited(key)
		return true
	}
	w.queue.Forget(key)
	w.mu.Lock()
	delete(w.failing, key)
	if w.pending[key].gen == p.gen {
		delete(w.pending, key)
		if len(w.pending) == 0 {
			close(w.idle)
			w.idle = make(chan struct{})
		}
	}
	w.mu.Unlock()
	return true
}

// write makes s's Lease show s: an update of the Lease last written (no
// read), else of the Lease its workspace's List found (an initial status,
// seed.go), else a read and an update, or a create; a conflict reads
// again.
func (w *Writer) write(ctx context.Context, s Status) error {
	ctx, cancel := context.WithTimeout(ctx, w.opts.WriteTimeout)
	defer cancel()
	getter, err := w.opts.Clients.Leases(s.Edge.APIExport.Workspace)
	if err != nil {
		return err
	}
	leases := getter.Leases(w.opts.Namespace)
	key, name := s.key(), s.name()
	log := w.opts.Log.V(1).WithValues(logging.KeyIdentity, key, "lease", w.opts.Namespace+"/"+name, "state", string(s.State))

	w.mu.Lock()
	cur := w.written[key]
	w.mu.Unlock()
	// absent: the List found no Lease, so the first attempt creates it
	// without reading it.
	absent := false
	if cur == nil {
		var known bool
		cur, known = w.seeded(ctx, leases, s)
		absent = known && cur == nil
	}
	const attempts = 4
	for range attempts {
		if cur == nil {
			notFound := absent
			absent = false
			if !notFound {
				cur, err = leases.Get(ctx, name, metav1.GetOptions{})
				notFound = apierrors.IsNotFound(err)
			}
			if notFound {
				l := newLease(s, w.opts.Namespace)
				if !update(l, s, w.opts.Now()) {
					return nil
				}
				created, err := leases.Create(ctx, l, metav1.CreateOptions{})
				switch {
				case apierrors.IsAlreadyExists(err):
					cur = nil
					continue
				case err != nil:
					return fmt.Errorf("cannot create Lease %s/%s in workspace %s: %w", w.opts.Namespace, name, s.Edge.APIExport.Workspace, err)
				}
				log.Info("created the edge's Lease")
				w.remember(key, created)
				return nil
			}
			if err != nil {
				return fmt.Errorf("cannot read Lease %s/%s in workspace %s: %w", w.opts.Namespace, name, s.Edge.APIExport.Workspace, err)
			}
		}
		desired := cur.DeepCopy()
		if !update(desired, s, w.opts.Now()) {
			log.Info("edge's Lease left as it is (a live session holds it, or it is Disconnected already at start)",
				"leaseState", cur.Annotations[AnnotationState], "holderSession", cur.Annotations[AnnotationSessionID])
			w.remember(key, cur)
			return nil
		}
		if equality.Semantic.DeepEqual(cur, desired) {
			w.remember(key, cur)
			return nil
		}
		updated, err := leases.Update(ctx, desired, metav1.UpdateOptions{})
		switch {
		case apierrors.IsConflict(err) || apierrors.IsNotFound(err):
			// Changed or deleted by someone else: read it again.
			cur = nil
			continue
		case err != nil:
			w.remember(key, nil)
			return fmt.Errorf("cannot update Lease %s/%s in workspace %s: %w", w.opts.Namespace, name, s.Edge.APIExport.Workspace, err)
		}
		log.Info("updated the edge's Lease")
		w.remember(key, updated)
		return nil
	}
	w.remember(key, nil)
	return fmt.Errorf("cannot write Lease %s/%s in workspace %s: it changed under each of %d attempts", w.opts.Namespace, name, s.Edge.APIExport.Workspace, attempts)
}

// remember records the Lease as last written (nil: read it next time).
func (w *Writer) remember(key string, l *coordinationv1.Lease) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if l == nil {
		delete(w.written, key)
		return
	}
	w.written[key] = l
}

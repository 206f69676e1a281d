package ownership

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/ptr"

	"github.com/ferry-dev/ferry/pkg/naming"
)

// Labels of the replica Leases: the observers list and watch by them.
const (
	labelReplica = "ferry.dev/broker-replica"
	// replicaLeaseNamePrefix starts every replica Lease's name.
	replicaLeaseNamePrefix = "ferry-replica-"
)

// ReplicaLeaseName is the Lease of the replica whose address is identity:
// a hash, since an address (host:port) is not a Lease name.
func ReplicaLeaseName(identity string) string {
	return replicaLeaseNamePrefix + naming.Hash(identity)
}

// heartbeat keeps this replica's own Lease renewed: the one thing a
// replica writes periodically, whatever the number of exports it owns.
// alive() is the context of the current unbroken run of renewals: it is
// cancelled when no renewal succeeded for RenewDeadline (everything owned
// under it stops), and a new one starts at the next successful renewal.
type heartbeat struct {
	opts   Options
	leases coordinationv1client.LeaseInterface

	mu sync.Mutex
	// last is the Lease as last written (nil: read it before writing).
	last *coordinationv1.Lease
	// lastRenew is when the last successful renewal was sent.
	lastRenew time.Time
	aliveCtx  context.Context
	aliveStop context.CancelFunc
	// changed is closed and replaced when aliveCtx changes.
	changed chan struct{}
}

func newHeartbeat(opts Options, leases coordinationv1client.LeaseInterface) *heartbeat {
	return &heartbeat{opts: opts, leases: leases, changed: make(chan struct{})}
}

// alive returns the current run's context, or nil while this replica's
// Lease is not renewed.
func (h *heartbeat) alive() (context.Context, <-chan struct{}) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.aliveCtx != nil && h.aliveCtx.Err() == nil {
		return h.aliveCtx, h.changed
	}
	return nil, h.changed
}

// run renews the Lease every RetryPeriod until ctx ends.
func (h *heartbeat) run(ctx context.Context) {
	t := time.NewTicker(h.opts.RetryPeriod)
	defer t.Stop()
	for {
		h.renewOnce(ctx)
		select {
		case <-ctx.Done():
			h.lapse()
			return
		case <-t.C:
		}
	}
}

// renewOnce writes one renewal and moves the alive state accordingly.
func (h *heartbeat) renewOnce(ctx context.Context) {
	sent := time.Now()
	wctx, cancel := context.WithTimeout(ctx, h.opts.RetryPeriod)
	err := h.write(wctx, h.opts.Identity)
	cancel()
	h.mu.Lock()
	defer h.mu.Unlock()
	if err == nil {
		h.lastRenew = sent
		if h.aliveCtx == nil || h.aliveCtx.Err() != nil {
			h.aliveCtx, h.aliveStop = context.WithCancel(context.Background())
			h.signalLocked()
			h.opts.Log.Info("renewing this replica's Lease", "lease", h.opts.Workspace+"/"+h.opts.Namespace+"/"+ReplicaLeaseName(h.opts.Identity))
		}
		return
	}
	if ctx.Err() != nil {
		return
	}
	h.opts.Log.Error(err, "cannot renew this replica's Lease")
	// Measured from when the last successful renewal was sent, which is no
	// later than when kcp stored it, so every observer of that renewal
	// waits out LeaseDuration after this replica stopped.
	if h.aliveCtx != nil && h.aliveCtx.Err() == nil && time.Since(h.lastRenew) >= h.opts.RenewDeadline {
		h.opts.Log.Info("this replica's Lease was not renewed in time: every APIExport it owned stops here", "renewDeadline", h.opts.RenewDeadline.String())
		h.aliveStop()
		h.signalLocked()
	}
}

// lapse ends the current run (shutdown).
func (h *heartbeat) lapse() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.aliveStop != nil {
		h.aliveStop()
		h.signalLocked()
	}
}

func (h *heartbeat) signalLocked() {
	close(h.changed)
	h.changed = make(chan struct{})
}

// release marks the Lease released (no holder), so the other replicas
// take every export this replica owned at once: one write at shutdown,
// whatever the number of exports.
func (h *heartbeat) release(ctx context.Context) error {
	return h.write(ctx, "")
}

// write makes the Lease say holder renewed it now; a conflict or an
// unknown Lease reads it first.
func (h *heartbeat) write(ctx context.Context, holder string) error {
	name := ReplicaLeaseName(h.opts.Identity)
	h.mu.Lock()
	cur := h.last
	h.mu.Unlock()
	for range 3 {
		if cur == nil {
			got, err := h.leases.Get(ctx, name, metav1.GetOptions{})
			switch {
			case apierrors.IsNotFound(err):
				created, err := h.leases.Create(ctx, h.lease(nil, holder), metav1.CreateOptions{})
				if apierrors.IsAlreadyExists(err) {
					continue
				}
				if err != nil {
					return fmt.Errorf("cannot create the replica Lease %s/%s in workspace %s: %w", h.opts.Namespace, name, h.opts.Workspace, err)
				}
				h.remember(created)
				return nil
			case err != nil:
				return fmt.Errorf("cannot read the replica Lease %s/%s in workspace %s: %w", h.opts.Namespace, name, h.opts.Workspace, err)
			}
			cur = got
		}
		updated, err := h.leases.Update(ctx, h.lease(cur, holder), metav1.UpdateOptions{})
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			cur = nil
			continue
		}
		if err != nil {
			h.remember(nil)
			return fmt.Errorf("cannot renew the replica Lease %s/%s in workspace %s: %w", h.opts.Namespace, name, h.opts.Workspace, err)
		}
		h.remember(updated)
		return nil
	}
	h.remember(nil)
	return fmt.Errorf("cannot renew the replica Lease %s/%s in workspace %s: it changed under every attempt", h.opts.Namespace, name, h.opts.Workspace)
}

func (h *heartbeat) remember(l *coordinationv1.Lease) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.last = l
}

// lease is cur (nil: a new Lease) held by holder, renewed now.
func (h *heartbeat) lease(cur *coordinationv1.Lease, holder string) *coordinationv1.Lease {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{
		Namespace: h.opts.Namespace, Name: ReplicaLeaseName(h.opts.Identity),
		Labels: map[string]string{labelReplica: "true"},
	}}
	if cur != nil {
		l = cur.DeepCopy()
		if l.Labels == nil {
			l.Labels = map[string]string{}
		}
		l.Labels[labelReplica] = "true"
	}
	now := metav1.NewMicroTime(time.Now())
	if ptr.Deref(l.Spec.HolderIdentity, "") != holder || l.Spec.AcquireTime == nil {
		l.Spec.AcquireTime = &now
		l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
	}
	l.Spec.HolderIdentity = ptr.To(holder)
	l.Spec.RenewTime = &now
	l.Spec.LeaseDurationSeconds = ptr.To(int32(h.opts.LeaseDuration.Round(time.Second) / time.Second))
	return l
}

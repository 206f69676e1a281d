// Package ownership decides which broker replica serves an APIExport.
//
// Several broker replicas run behind one Service; exactly one of them runs
// an APIExport's sync engine at a time. Two kinds of Lease in kcp decide
// which (kcp, not the cluster the broker pods run in, because kcp is the
// one thing every replica already shares, and everything ownership guards —
// finalizers, status and related writes — is in kcp: a replica that cannot
// reach kcp can neither renew nor write):
//
//   - a replica Lease per replica (ferry-replica-<hash of its address>) in
//     one workspace (Options.Workspace), renewed every RetryPeriod: the only
//     periodic write, however many exports a replica owns;
//   - an ownership record per export (ferry-owner-<export>) in the export's
//     own workspace, naming the owner (its address, so a replica that does
//     not own an export can send its edge there) and where the owner's
//     replica Lease is. It is written only when ownership moves.
//
// One election per export renewing every two seconds would cost kcp a
// write per export every two seconds: 500 writes a second for a replica
// with 1,000 edges.
//
// The guarantees are those of client-go's leader election, applied to the
// replica Lease: an owner stops everything it owns (Held.Context is
// cancelled) when it has not renewed its replica Lease for RenewDeadline; a
// replica takes an export over only when the record's owner released its
// replica Lease, or when it has watched that Lease not change for
// LeaseDuration by its own clock — after the owner stopped. The record is
// taken with a resourceVersion precondition, so of two replicas taking it
// at once one fails. A replica that shuts down gracefully releases its
// replica Lease: the others take all its exports at once.
package ownership

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/singleflight"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/utils/ptr"

	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/kcp"
	"github.com/ferry-dev/ferry/pkg/logging"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// AnnotationReplicaLease is set on an ownership record: the workspace,
// namespace and name of the owner's replica Lease ("root:org:ferry
// ferry-system/ferry-replica-…"), whose renewals say the owner lives.
const AnnotationReplicaLease = "ferry.dev/replica-lease"

// Options configure Owners.
type Options struct {
	// Leases reaches the Leases of workspaces. Required.
	Leases kcp.LeasesClients
	// Namespace holds the ownership records in every export's workspace
	// and the replica Leases in Workspace. Required.
	Namespace string
	// Workspace holds this replica's own Lease. Required. Replicas may
	// use different ones (each record names its owner's).
	Workspace string
	// Identity is this replica's address as edges dial it, e.g.
	// "ferry-broker-0.ferry-broker-pods.ferry-system.svc:8443". Required.
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod are the timings of the
	// replica Lease; defaults 15 s, 10 s and 2 s (client-go's).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Log is the logger; default discards.
	Log logr.Logger
}

func (o *Options) defaults() error {
	switch {
	case o.Leases == nil:
		return errors.New("ownership: Leases is required")
	case o.Namespace == "":
		return errors.New("ownership: Namespace is required")
	case o.Workspace == "":
		return errors.New("ownership: Workspace (of this replica's Lease) is required")
	case o.Identity == "":
		return errors.New("ownership: Identity (this replica's address) is required")
	}
	if o.LeaseDuration == 0 {
		o.LeaseDuration = 15 * time.Second
	}
	if o.RenewDeadline == 0 {
		o.RenewDeadline = 10 * time.Second
	}
	if o.RetryPeriod == 0 {
		o.RetryPeriod = 2 * time.Second
	}
	if o.RenewDeadline >= o.LeaseDuration || o.RetryPeriod >= o.RenewDeadline {
		return fmt.Errorf("ownership: want RetryPeriod (%s) < RenewDeadline (%s) < LeaseDuration (%s)", o.RetryPeriod, o.RenewDeadline, o.LeaseDuration)
	}
	if o.Log.GetSink() == nil {
		o.Log = logr.Discard()
	}
	return nil
}

// Owners holds this replica's ownership of APIExports. Create with New,
// then Start; Close at shutdown. Safe for concurrent use.
type Owners struct {
	opts Options
	beat *heartbeat

	claims singleflight.Group

	mu        sync.Mutex
	runCtx    context.Context
	cancelRun context.CancelFunc
	beatDone  chan struct{}
	observers map[string]*observer
	records   map[string]*recordCache
	held      map[config.APIExportRef]*Held
	closed    bool
}

// New returns Owners with opts; nothing is written before Start.
func New(opts Options) (*Owners, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	leases, err := opts.Leases.Leases(opts.Workspace)
	if err != nil {
		return nil, fmt.Errorf("ownership: cannot reach the Leases of workspace %s: %w", opts.Workspace, err)
	}
	return &Owners{
		opts: opts, beat: newHeartbeat(opts, leases.Leases(opts.Namespace)),
		observers: map[string]*observer{}, records: map[string]*recordCache{}, held: map[config.APIExportRef]*Held{},
	}, nil
}

// Start renews this replica's Lease until ctx ends (then everything owned
// stops; Close releases the Lease).
func (o *Owners) Start(ctx context.Context) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.runCtx != nil {
		return
	}
	o.runCtx, o.cancelRun = context.WithCancel(ctx)
	o.beatDone = make(chan struct{})
	go func() {
		defer close(o.beatDone)
		o.beat.run(o.runCtx)
	}()
}

// ElsewhereError says another replica owns the export: Owner is its
// address, for the edge to connect to.
type ElsewhereError struct {
	Export config.APIExportRef
	Owner  string
}

func (e *ElsewhereError) Error() string {
	return fmt.Sprintf("APIExport %s is served by the broker replica at %s", e.Export, e.Owner)
}

// Held is this replica's ownership of one export, from taking its record
// to the loss or release; comparable (the same pointer while it lasts).
type Held struct {
	owners    *Owners
	export    config.APIExportRef
	workspace string
	ctx       context.Context
	cancel    context.CancelFunc
	// resourceVersion is the record as this replica wrote it: a release
	// clears it only if nobody wrote it since.
	resourceVersion string
}

// Context is cancelled when the ownership is lost (this replica's Lease
// was not renewed for RenewDeadline) or released: every kcp write for the
// export must run under it.
func (h *Held) Context() context.Context { return h.ctx }

// Release gives the export up: Context is cancelled and the record
// cleared (unless another replica wrote it since), so another replica may
// take it without waiting. Call it only once nothing writes for the
// export any more. At shutdown the record is left: Close releases the
// replica Lease, which frees every export at once.
func (h *Held) Release() {
	h.cancel()
	o := h.owners
	o.mu.Lock()
	if o.held[h.export] == h {
		delete(o.held, h.export)
	}
	shuttingDown := o.closed || o.runCtx == nil || o.runCtx.Err() != nil
	o.mu.Unlock()
	if shuttingDown {
		return
	}
	ctx, cancel := context.WithTimeout(o.runCtx, o.opts.RenewDeadline)
	defer cancel()
	if err := o.clear(ctx, h); err != nil {
		o.opts.Log.Error(err, "cannot release the ownership record; another replica takes the export over once it sees this one gone", logging.KeyExport, h.export.String())
	}
}

// Claim returns this replica's ownership of export, whose record is in
// workspace: at once when it holds it, else after reading (and taking)
// the record. When another live replica owns it, the error is an
// *ElsewhereError naming that replica. ctx bounds the wait.
func (o *Owners) Claim(ctx context.Context, export config.APIExportRef, workspace string) (*Held, error) {
	o.mu.Lock()
	h := o.held[export]
	o.mu.Unlock()
	if h != nil && h.ctx.Err() == nil {
		return h, nil
	}
	alive, err := o.waitAlive(ctx)
	if err != nil {
		return nil, err
	}
	// Concurrent handshakes of one export (an edge and its redial) share
	// one read of the record.
	v, err, _ := o.claims.Do(export.String(), func() (any, error) { return o.take(ctx, alive, export, workspace) })
	if err != nil {
		return nil, err
	}
	return v.(*Held), nil
}

// waitAlive returns the context of this replica's current run of Lease
// renewals, waiting for the first renewal (ctx bounds the wait).
func (o *Owners) waitAlive(ctx context.Context) (context.Context, error) {
	for {
		alive, changed := o.beat.alive()
		if alive != nil {
			return alive, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("this replica's Lease in workspace %s is not renewed, so it owns no APIExport: %w", o.opts.Workspace, ctx.Err())
		}
	}
}

// take reads export's record and takes it when it is free, this
// replica's, or its owner is dead.
func (o *Owners) take(ctx context.Context, alive context.Context, export config.APIExportRef, workspace string) (*Held, error) {
	if h := o.current(export); h != nil {
		return h, nil
	}
	getter, err := o.opts.Leases.Leases(workspace)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the Leases of workspace %s: %w", workspace, err)
	}
	records := getter.Leases(o.opts.Namespace)
	name := LeaseName(export.Name)
	cached, err := o.recordCache(ctx, workspace, records)
	if err != nil {
		return nil, err
	}
	// The first attempt trusts the cache; after a conflict the record is
	// read.
	fromCache := true
	for range 4 {
		var rec *coordinationv1.Lease
		if fromCache {
			rec, err = cached.get(o.opts.Namespace, name), nil
			if rec == nil {
				err = apierrors.NewNotFound(coordinationv1.Resource("leases"), name)
			}
			fromCache = false
		} else {
			rec, err = records.Get(ctx, name, metav1.GetOptions{})
		}
		if apierrors.IsNotFound(err) {
			created, err := records.Create(ctx, o.record(nil, export), metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("cannot create the ownership record %s/%s of APIExport %s: %w", o.opts.Namespace, name, export, err)
			}
			return o.hold(alive, export, workspace, created), nil
		}
		if err != nil {
			return nil, fmt.Errorf("cannot read the ownership record %s/%s of APIExport %s: %w", o.opts.Namespace, name, export, err)
		}
		if owner := ptr.Deref(rec.Spec.HolderIdentity, ""); owner != "" && owner != o.opts.Identity {
			dead, err := o.ownerDead(ctx, rec, owner)
			if err != nil {
				return nil, err
			}
			if !dead {
				return nil, &ElsewhereError{Export: export, Owner: owner}
			}
			o.opts.Log.Info("taking over the APIExport: its owner's replica Lease is released or expired", logging.KeyExport, export.String(), logging.KeyOwner, owner)
		}
		updated, err := records.Update(ctx, o.record(rec, export), metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("cannot take the ownership record %s/%s of APIExport %s: %w", o.opts.Namespace, name, export, err)
		}
		return o.hold(alive, export, workspace, updated), nil
	}
	return nil, fmt.Errorf("cannot take the ownership record %s/%s of APIExport %s: it changed under every attempt", o.opts.Namespace, name, export)
}

func (o *Owners) current(export config.APIExportRef) *Held {
	o.mu.Lock()
	defer o.mu.Unlock()
	if h := o.held[export]; h != nil && h.ctx.Err() == nil {
		return h
	}
	return nil
}

func (o *Owners) hold(alive context.Context, export config.APIExportRef, workspace string, rec *coordinationv1.Lease) *Held {
	ctx, cancel := context.WithCancel(alive)
	h := &Held{owners: o, export: export, workspace: workspace, ctx: ctx, cancel: cancel, resourceVersion: rec.ResourceVersion}
	o.mu.Lock()
	o.held[export] = h
	o.mu.Unlock()
	o.opts.Log.Info("this replica owns the APIExport", logging.KeyExport, export.String())
	context.AfterFunc(ctx, func() {
		o.opts.Log.Info("this replica no longer owns the APIExport", logging.KeyExport, export.String())
	})
	return h
}

// record is cur (nil: a new record) naming this replica as the owner.
func (o *Owners) record(cur *coordinationv1.Lease, export config.APIExportRef) *coordinationv1.Lease {
	l := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Namespace: o.opts.Namespace, Name: LeaseName(export.Name)}}
	if cur != nil {
		l = cur.DeepCopy()
	}
	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[labelRecord] = "true"
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	l.Annotations[AnnotationReplicaLease] = o.opts.Workspace + " " + o.opts.Namespace + "/" + ReplicaLeaseName(o.opts.Identity)
	now := metav1.NewMicroTime(time.Now())
	if ptr.Deref(l.Spec.HolderIdentity, "") != o.opts.Identity {
		l.Spec.LeaseTransitions = ptr.To(ptr.Deref(l.Spec.LeaseTransitions, 0) + 1)
	}
	l.Spec.HolderIdentity = ptr.To(o.opts.Identity)
	l.Spec.AcquireTime, l.Spec.RenewTime = &now, &now
	// Not renewed: the owner's replica Lease says whether it lives.
	l.Spec.LeaseDurationSeconds = nil
	return l
}

// clear empties h's record, unless it changed since h took it.
func (o *Owners) clear(ctx context.Context, h *Held) error {
	getter, err := o.opts.Leases.Leases(h.workspace)
	if err != nil {
		return err
	}
	records := getter.Leases(o.opts.Namespace)
	rec, err := records.Get(ctx, LeaseName(h.export.Name), metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if rec.ResourceVersion != h.resourceVersion || ptr.Deref(rec.Spec.HolderIdentity, "") != o.opts.Identity {
		return nil // taken again since (by this replica or another)
	}
	rec.Spec.HolderIdentity = nil
	delete(rec.Annotations, AnnotationReplicaLease)
	_, err = records.Update(ctx, rec, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// ownerDead tells whether the owner rec names released or stopped
// renewing its replica Lease, watching the workspace the record names.
func (o *Owners) ownerDead(ctx context.Context, rec *coordinationv1.Lease, owner string) (bool, error) {
	workspace, namespace := o.opts.Workspace, o.opts.Namespace
	if where, ok := rec.Annotations[AnnotationReplicaLease]; ok {
		ws, rest, _ := strings.Cut(where, " ")
		ns, _, _ := strings.Cut(rest, "/")
		if ws != "" && ns != "" {
			workspace, namespace = ws, ns
		}
	}
	ob, err := o.observer(workspace, namespace)
	if err != nil {
		return false, err
	}
	if err := ob.waitSynced(ctx); err != nil {
		return false, fmt.Errorf("cannot tell whether the owner %s lives: %w", owner, err)
	}
	if !ob.dead(owner) {
		return false, nil
	}
	// Before taking over, read the owner's Lease itself: a watch that
	// stalled without an error must not make a live owner look dead.
	getter, err := o.opts.Leases.Leases(workspace)
	if err != nil {
		return false, fmt.Errorf("cannot reach the Leases of workspace %s: %w", workspace, err)
	}
	l, err := getter.Leases(namespace).Get(ctx, ReplicaLeaseName(owner), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return false, fmt.Errorf("cannot read the replica Lease of the owner %s: %w", owner, err)
	default:
		ob.observe(l)
	}
	return ob.dead(owner), nil
}

// recordCache returns the listed cache of workspace's ownership records,
// starting it the first time (it runs until the replica stops).
func (o *Owners) recordCache(ctx context.Context, workspace string, records coordinationv1client.LeaseInterface) (*recordCache, error) {
	o.mu.Lock()
	c, ok := o.records[workspace]
	if !ok {
		if o.runCtx == nil || o.closed {
			o.mu.Unlock()
			return nil, errors.New("ownership: not running")
		}
		c = newRecordCache(records)
		o.records[workspace] = c
		go c.run(o.runCtx)
	}
	o.mu.Unlock()
	if err := c.waitSynced(ctx); err != nil {
		return nil, fmt.Errorf("cannot read the ownership records of workspace %s: %w", workspace, err)
	}
	return c, nil
}

// observer returns the running watch of the replica Leases in workspace,
// starting it the first time.
func (o *Owners) observer(workspace, namespace string) (*observer, error) {
	key := workspace + " " + namespace
	o.mu.Lock()
	defer o.mu.Unlock()
	if ob, ok := o.observers[key]; ok {
		return ob, nil
	}
	if o.runCtx == nil || o.closed {
		return nil, errors.New("ownership: not running")
	}
	getter, err := o.opts.Leases.Leases(workspace)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the Leases of workspace %s: %w", workspace, err)
	}
	ob := newObserver(getter.Leases(namespace), o.opts.LeaseDuration, time.Now)
	o.observers[key] = ob
	go ob.run(o.runCtx)
	return ob, nil
}

// Close stops everything this replica owns and releases its replica Lease
// (graceful shutdown: the other replicas take every export over at once).
// Call it once the engines have stopped.
func (o *Owners) Close() {
	o.mu.Lock()
	if o.closed {
		o.mu.Unlock()
		return
	}
	o.closed = true
	for _, h := range o.held {
		h.cancel()
	}
	cancel, done := o.cancelRun, o.beatDone
	o.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done // no renewal after the release
	ctx, stop := context.WithTimeout(context.Background(), o.opts.RenewDeadline)
	defer stop()
	if err := o.beat.release(ctx); err != nil {
		o.opts.Log.Error(err, "cannot release this replica's Lease; the other replicas take its APIExports over once it expires")
		return
	}
	o.opts.Log.Info("released this replica's Lease: the other replicas take its APIExports over")
}

// leaseNamePrefix starts every ownership Lease's name.
const leaseNamePrefix = "ferry-owner-"

// LeaseName is the ownership Lease of the APIExport named export in its
// workspace: "ferry-owner-<export>" (an export's name is a DNS subdomain,
// like a Lease's), with a hash instead of the name when it is too long.
func LeaseName(export string) string {
	name := leaseNamePrefix + strings.ToLower(export)
	if len(name) > 253 {
		return leaseNamePrefix + naming.Hash(export)
	}
	return name
}

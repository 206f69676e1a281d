// Package ownership decides which broker replica serves an APIExport.
//
// Several broker replicas run behind one Service; exactly one of them runs
// an APIExport's sync engine at a time: the holder of a coordination.k8s.io
// Lease in the APIExport's own workspace in kcp (beside the edge Leases,
// package edgelease). The Lease lives in kcp, not in the cluster the broker
// pods run in, because kcp is the one thing every replica already shares and
// everything the Lease guards — the finalizers, the objects' status and
// related writes — is in kcp: a replica that cannot reach kcp cannot renew
// the Lease and has nothing to write either. The holder identity is the
// replica's own address (the pod's name in a headless Service), so a replica
// that does not own an export can tell an edge where to go.
//
// The election is client-go's leaderelection, one elector per export, with
// its usual guarantees: the holder renews every RetryPeriod and stops
// (Held.Context is cancelled) when it has not renewed for RenewDeadline,
// before another replica may take the Lease over (LeaseDuration after it
// last saw the record change) — the fencing that keeps two replicas from
// writing for one export at once. A replica that shuts down gracefully
// releases the Lease, so another takes the export over at once.
package ownership

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/kcp"
	"github.com/ferry-dev/ferry/pkg/logging"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// Options configure Owners.
type Options struct {
	// Leases reaches the Leases of export workspaces. Required.
	Leases kcp.LeasesClients
	// Namespace holds the ownership Leases in every export's workspace
	// (the edge Leases' namespace). Required.
	Namespace string
	// Identity is this replica's address as edges dial it, e.g.
	// "ferry-broker-0.ferry-broker-pods.ferry-system.svc:8443". Required.
	Identity string
	// LeaseDuration, RenewDeadline and RetryPeriod are the election's
	// timings; defaults 15 s, 10 s and 2 s (client-go's).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Linger is how long a replica that does not own an export keeps
	// competing for it after the last Claim (so it takes over an owner
	// that died while its edge keeps knocking); default 2 × LeaseDuration.
	// Never longer: every candidate reads its Lease every RetryPeriod.
	Linger time.Duration
	// Log is the logger; default discards.
	Log logr.Logger
}

func (o *Options) defaults() error {
	switch {
	case o.Leases == nil:
		return errors.New("ownership: Leases is required")
	case o.Namespace == "":
		return errors.New("ownership: Namespace is required")
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
	if o.Linger == 0 {
		o.Linger = 2 * o.LeaseDuration
	}
	if o.Log.GetSink() == nil {
		o.Log = logr.Discard()
	}
	return nil
}

// Owners competes for the ownership of APIExports on behalf of this
// replica. Safe for concurrent use.
type Owners struct {
	opts Options

	mu         sync.Mutex
	candidates map[config.APIExportRef]*candidate
}

// New returns Owners with opts.
func New(opts Options) (*Owners, error) {
	if err := opts.defaults(); err != nil {
		return nil, err
	}
	return &Owners{opts: opts, candidates: map[config.APIExportRef]*candidate{}}, nil
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

// Held is this replica's ownership of one export, from one acquisition of
// its Lease to the loss or release; comparable (the same pointer while it
// lasts).
type Held struct {
	c *candidate
}

// Context is cancelled when the ownership is lost (the Lease was not
// renewed for RenewDeadline) or released: every kcp write for the export
// must run under it.
func (h *Held) Context() context.Context { return h.c.leadCtx }

// Release gives the export up at once: the Lease is released (another
// replica may take it without waiting), and Context is cancelled. Call it
// only once nothing writes for the export any more.
func (h *Held) Release() { h.c.stop() }

// Claim returns this replica's ownership of export, whose Lease is in
// workspace: at once when it holds it, after one round trip when the Lease
// is free or expired. When another replica holds it, the error is an
// *ElsewhereError naming that replica, and this replica keeps competing
// for Options.Linger, so that it takes over when the owner stops renewing.
// ctx bounds the wait for the first answer.
func (o *Owners) Claim(ctx context.Context, export config.APIExportRef, workspace string) (*Held, error) {
	c, err := o.candidate(export, workspace)
	if err != nil {
		return nil, err
	}
	for {
		c.mu.Lock()
		leading, owner, stopped, changed := c.leading, c.owner, c.stopped, c.changed
		c.mu.Unlock()
		switch {
		case leading:
			return c.held, nil
		case stopped:
			// Lost or released between the lookup and now: compete
			// again with a new candidate.
			if c, err = o.candidate(export, workspace); err != nil {
				return nil, err
			}
			continue
		case owner != "" && owner != o.opts.Identity:
			return nil, &ElsewhereError{Export: export, Owner: owner}
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, fmt.Errorf("no answer from the ownership Lease of APIExport %s in kcp: %w", export, ctx.Err())
		}
	}
}

// Close releases every export this replica owns and stops competing
// (graceful shutdown: the other replicas take over at once).
func (o *Owners) Close() {
	o.mu.Lock()
	all := make([]*candidate, 0, len(o.candidates))
	for _, c := range o.candidates {
		all = append(all, c)
	}
	o.mu.Unlock()
	for _, c := range all {
		c.stop()
		<-c.done
	}
}

// candidate returns the running candidate of export, starting one when
// none runs, and extends its linger.
func (o *Owners) candidate(export config.APIExportRef, workspace string) (*candidate, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if c, ok := o.candidates[export]; ok && !c.isStopped() {
		c.claimed()
		return c, nil
	}
	leases, err := o.opts.Leases.Leases(workspace)
	if err != nil {
		return nil, fmt.Errorf("cannot reach the Leases of workspace %s: %w", workspace, err)
	}
	c := &candidate{export: export, changed: make(chan struct{}), done: make(chan struct{}), linger: o.opts.Linger}
	c.held = &Held{c: c}
	runCtx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	log := o.opts.Log.WithValues(logging.KeyExport, export.String())
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: &resourcelock.LeaseLock{
			LeaseMeta:  metav1.ObjectMeta{Namespace: o.opts.Namespace, Name: LeaseName(export.Name)},
			Client:     leases,
			LockConfig: resourcelock.ResourceLockConfig{Identity: o.opts.Identity},
		},
		LeaseDuration:   o.opts.LeaseDuration,
		RenewDeadline:   o.opts.RenewDeadline,
		RetryPeriod:     o.opts.RetryPeriod,
		ReleaseOnCancel: true,
		Name:            export.String(),
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				log.Info("this replica owns the APIExport")
				c.update(func() { c.leading, c.leadCtx = true, ctx })
			},
			OnStoppedLeading: func() {
				c.mu.Lock()
				was := c.leading
				c.mu.Unlock()
				if was {
					log.Info("this replica no longer owns the APIExport")
				}
				c.update(func() { c.leading, c.stopped = false, true })
			},
			OnNewLeader: func(identity string) {
				if identity != o.opts.Identity {
					log.V(1).Info("the APIExport is owned by another replica", "owner", identity)
				}
				c.update(func() { c.owner = identity })
			},
		},
	})
	if err != nil {
		cancel()
		return nil, fmt.Errorf("cannot compete for APIExport %s: %w", export, err)
	}
	c.lingerTimer = time.AfterFunc(o.opts.Linger, c.lingered)
	o.candidates[export] = c
	go func() {
		defer close(c.done)
		le.Run(runCtx)
		c.update(func() { c.leading, c.stopped = false, true })
		o.mu.Lock()
		if o.candidates[export] == c {
			delete(o.candidates, export)
		}
		o.mu.Unlock()
	}()
	return c, nil
}

// candidate is one export's elector and what it observed.
type candidate struct {
	export config.APIExportRef
	cancel context.CancelFunc
	done   chan struct{}
	linger time.Duration
	// held is the one Held of this candidate's leadership: Claims while
	// it leads return the same, so callers can tell a renewed ownership.
	held *Held

	mu          sync.Mutex
	leading     bool
	leadCtx     context.Context
	owner       string // the holder last observed
	stopped     bool
	changed     chan struct{} // closed and replaced on every change
	lingerTimer *time.Timer
}

// update changes the candidate's state and wakes Claims waiting for it.
func (c *candidate) update(f func()) {
	c.mu.Lock()
	f()
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

func (c *candidate) isStopped() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stopped
}

// claimed restarts the linger of a candidate that does not lead.
func (c *candidate) claimed() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lingerTimer != nil {
		c.lingerTimer.Reset(c.linger)
	}
}

// lingered stops a candidate nobody claimed for its linger, unless it
// leads (an owner stays until it is released).
func (c *candidate) lingered() {
	c.mu.Lock()
	leading := c.leading
	c.mu.Unlock()
	if !leading {
		c.cancel()
	}
}

// stop releases the Lease when held and stops competing.
func (c *candidate) stop() {
	c.mu.Lock()
	if c.lingerTimer != nil {
		c.lingerTimer.Stop()
	}
	c.mu.Unlock()
	c.cancel()
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

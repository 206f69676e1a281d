package ownership

import (
	"context"
	"fmt"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// observer watches the replica Leases of one workspace and remembers, by
// its own clock, when it last saw each one change: a replica is dead when
// its Lease has not changed for LeaseDuration (the rule of client-go's
// leader election, which never compares another machine's clock), or
// released. One watch per workspace holding replica Leases — usually
// one — instead of a read per export.
type observer struct {
	leaseDuration time.Duration
	now           func() time.Time
	informer      cache.SharedIndexInformer

	mu sync.Mutex
	// seen is, by Lease name, the last version seen and when it was seen.
	seen map[string]observation
	// syncedAt is when the first list completed: a Lease absent since
	// then (or deleted since) counts as unchanged from then.
	syncedAt time.Time
	gone     map[string]time.Time
}

type observation struct {
	// version tells two writes apart: the resourceVersion and the
	// renewal time (a fake client keeps the former).
	version string
	holder  string
	at      time.Time
}

func newObserver(leases coordinationv1client.LeaseInterface, leaseDuration time.Duration, now func() time.Time) *observer {
	ob := &observer{
		leaseDuration: leaseDuration, now: now,
		informer: leaseInformer(leases, labelReplica),
		seen:     map[string]observation{}, gone: map[string]time.Time{},
	}
	_, _ = ob.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    ob.observe,
		UpdateFunc: func(_, obj any) { ob.observe(obj) },
		DeleteFunc: ob.deleted,
	})
	return ob
}

// run watches until ctx ends.
func (ob *observer) run(ctx context.Context) {
	ob.informer.RunWithContext(ctx)
}

// waitSynced waits for the first list.
func (ob *observer) waitSynced(ctx context.Context) error {
	if !cache.WaitForCacheSync(ctx.Done(), ob.informer.HasSynced) {
		return fmt.Errorf("the replica Leases were not listed: %w", ctx.Err())
	}
	ob.mu.Lock()
	defer ob.mu.Unlock()
	if ob.syncedAt.IsZero() {
		ob.syncedAt = ob.now()
	}
	return nil
}

func (ob *observer) observe(obj any) {
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	ob.mu.Lock()
	defer ob.mu.Unlock()
	version := l.ResourceVersion
	if l.Spec.RenewTime != nil {
		version += "/" + l.Spec.RenewTime.UTC().Format(time.RFC3339Nano)
	}
	holder := ptr.Deref(l.Spec.HolderIdentity, "")
	if prev, ok := ob.seen[l.Name]; ok && prev.version == version && prev.holder == holder {
		return
	}
	delete(ob.gone, l.Name)
	ob.seen[l.Name] = observation{version: version, holder: holder, at: ob.now()}
}

func (ob *observer) deleted(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	l, ok := obj.(*coordinationv1.Lease)
	if !ok {
		return
	}
	ob.mu.Lock()
	defer ob.mu.Unlock()
	delete(ob.seen, l.Name)
	ob.gone[l.Name] = ob.now()
}

// dead tells whether the replica at identity no longer holds what it
// owned: its Lease is released, or has not changed for LeaseDuration as
// this observer saw it (absent counts as unchanged since the first list
// or its deletion). Call after waitSynced.
func (ob *observer) dead(identity string) bool {
	name := ReplicaLeaseName(identity)
	ob.mu.Lock()
	defer ob.mu.Unlock()
	now := ob.now()
	if o, ok := ob.seen[name]; ok {
		return o.holder == "" || now.Sub(o.at) >= ob.leaseDuration
	}
	since := ob.syncedAt
	if at, ok := ob.gone[name]; ok {
		since = at
	}
	return !since.IsZero() && now.Sub(since) >= ob.leaseDuration
}

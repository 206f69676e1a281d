package replication

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/ferry-dev/ferry/pkg/logging"
)

// Resyncs an admin asks for (AdminService.Resync): the edge sends its
// complete inventory again on the running stream and the manager compares
// it the way it does after a handshake (Inventory, compareInventoryLocked,
// openLocked), without resetting the outbox. A resync is complete once
// every resource's inventory was compared (or its gate timed out) and every
// object that comparison queued was processed; the intents those queued
// are counted.

// defaultResyncGate bounds the wait for a resource's inventory when the
// manager's InventoryGate is off.
const defaultResyncGate = 30 * time.Second

// ErrResyncAborted is the error of a resync whose stream ended first.
var ErrResyncAborted = errors.New("the edge's stream ended before the resync completed; the next stream's handshake compares inventories anyway")

// ResyncStatus describes a resync.
type ResyncStatus struct {
	// PublishedResources compared.
	PublishedResources []string
	// Requested is when the resync started; Completed when it completed
	// (zero while it runs or when it failed).
	Requested, Completed time.Time
	// InventoryEntries counts the objects the edge listed.
	InventoryEntries int
	// QueuedIntents counts intents queued because kcp's desired state
	// differed from the inventory.
	QueuedIntents int
	// Err tells why the resync did not complete.
	Err error
}

// Resync is a running or finished resync.
type Resync struct {
	// Done is closed when the resync completed or failed.
	Done <-chan struct{}

	done    chan struct{}
	onDone  func(ResyncStatus)
	status  ResyncStatus
	waiting map[string]bool   // resources whose inventory is awaited
	queued  map[item]bool     // objects the comparison queued, not processed yet
	entries map[string]int    // inventory entries per resource
	counted map[item]struct{} // objects whose intent was counted
}

// ResyncStatus returns r's figures.
func (m *Manager) ResyncStatus(r *Resync) ResyncStatus {
	m.mu.Lock()
	defer m.mu.Unlock()
	return r.snapshotLocked()
}

func (r *Resync) snapshotLocked() ResyncStatus {
	s := r.status
	s.PublishedResources = slices.Clone(s.PublishedResources)
	s.InventoryEntries = 0
	for _, n := range r.entries {
		s.InventoryEntries += n
	}
	s.QueuedIntents = len(r.counted)
	return s
}

// LastResync returns the status of the last resync, false when there was
// none.
func (m *Manager) LastResync() (ResyncStatus, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.resyncLast == nil {
		return ResyncStatus{}, false
	}
	return m.resyncLast.snapshotLocked(), true
}

// StartResync starts comparing a fresh inventory of prs (all published
// resources when empty) and returns the resync; the caller asks the edge
// for the inventory when started is true. While a resync runs, another call
// joins it (started false). onDone is called once, on its own goroutine,
// when the resync it started completes or fails.
func (m *Manager) StartResync(prs []string, onDone func(ResyncStatus)) (r *Resync, started bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if r := m.resyncActive; r != nil {
		return r, false, nil
	}
	if !m.attached {
		return nil, false, errors.New("no edge stream is attached")
	}
	if len(prs) == 0 {
		for pr := range m.desired {
			prs = append(prs, pr)
		}
		if len(prs) == 0 {
			return nil, false, errors.New("the edge has published no resource yet")
		}
	}
	sort.Strings(prs)
	prs = slices.Compact(prs)
	var unknown []string
	for _, pr := range prs {
		if _, ok := m.desired[pr]; !ok {
			unknown = append(unknown, pr)
		}
	}
	if len(unknown) > 0 {
		known := make([]string, 0, len(m.desired))
		for pr := range m.desired {
			known = append(known, pr)
		}
		sort.Strings(known)
		return nil, false, fmt.Errorf("%w: %s (the edge publishes: %s)", ErrUnknownResource, strings.Join(unknown, ", "), strings.Join(known, ", "))
	}
	done := make(chan struct{})
	r = &Resync{
		Done: done, done: done, onDone: onDone,
		status:  ResyncStatus{PublishedResources: prs, Requested: time.Now()},
		waiting: map[string]bool{}, queued: map[item]bool{},
		entries: map[string]int{}, counted: map[item]struct{}{},
	}
	m.resyncActive, m.resyncLast = r, r
	m.resyncSince = r.status.Requested // the resync duration metric starts here
	gate := m.opts.InventoryGate
	if gate <= 0 {
		gate = defaultResyncGate
	}
	for _, pr := range prs {
		r.waiting[pr] = true
		delete(m.inventoried, pr)
		delete(m.inventory, pr)
		delete(m.unlisted, pr)
		// Compared again: what was queued on this stream before is no
		// reason not to queue it again (the copy may be gone).
		m.ledger.compareAgain(pr)
		m.closeGateLocked(pr, gate)
	}
	return r, true, nil
}

// ErrUnknownResource refuses a resync of a resource the edge does not
// publish.
var ErrUnknownResource = errors.New("not a published resource of this edge")

// closeGateLocked holds pr's upserts until its inventory is complete or d
// has passed.
func (m *Manager) closeGateLocked(pr string, d time.Duration) {
	m.open[pr] = false
	m.afterLocked(d, func() {
		switch open, ok := m.open[pr]; {
		case ok && !open:
			m.opts.Log.Info("no complete inventory from the edge in time for the resync; comparing with what is known", logging.KeyPublishedResource, pr)
			m.openLocked(pr)
		case !ok:
			// Withdrawn meanwhile: nothing to compare.
			if r := m.resyncActive; r != nil && r.waiting[pr] {
				delete(r.waiting, pr)
				m.finishResyncLocked(nil)
			}
		}
	})
}

// resyncInventoryLocked counts the entries of an inventory chunk for the
// running resync.
func (m *Manager) resyncInventoryLocked(pr string, entries int) {
	if r := m.resyncActive; r != nil && r.waiting[pr] {
		r.entries[pr] += entries
	}
}

// resyncOpenedLocked records that pr's gate opened: the objects openLocked
// queued are awaited.
func (m *Manager) resyncOpenedLocked(pr string) {
	r := m.resyncActive
	if r == nil || !r.waiting[pr] {
		return
	}
	delete(r.waiting, pr)
	if w, ok := m.running[pr]; ok {
		for _, k := range w.store.ListKeys() {
			r.queued[item{pr: pr, key: k}] = true
		}
	}
	for _, s := range m.ledger.slotsWithCopies(pr) {
		r.queued[s] = true
	}
	m.finishResyncLocked(nil)
}

// resyncProcessed records that it was processed; an intent queued for it
// counts when the edge did not hold that state.
func (m *Manager) resyncProcessed(it item) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.resyncActive
	if r == nil || !r.queued[it] {
		return
	}
	delete(r.queued, it)
	if m.ledger.pendingAt(it) {
		r.counted[it] = struct{}{}
	}
	m.finishResyncLocked(nil)
}

// finishResyncLocked completes the running resync when nothing is awaited
// any more, or fails it with err.
func (m *Manager) finishResyncLocked(err error) {
	r := m.resyncActive
	if r == nil || (err == nil && (len(r.waiting) > 0 || len(r.queued) > 0)) {
		return
	}
	m.resyncActive = nil
	if err != nil {
		r.status.Err = err
	} else {
		r.status.Completed = time.Now()
	}
	close(r.done)
	if r.onDone != nil {
		st := r.snapshotLocked()
		go r.onDone(st)
	}
}

// resyncedLocked counts the first comparison of it after an inventory
// comparison (see resyncing): unchanged when the edge has its desired state.
func (m *Manager) resyncedLocked(it item, unchanged bool) {
	if _, ok := m.resyncing[it]; !ok {
		return
	}
	delete(m.resyncing, it)
	m.resyncObserver().ResyncObject(unchanged)
}

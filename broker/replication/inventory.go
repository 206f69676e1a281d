package replication

import (
	"time"

	"github.com/ferry-dev/ferry/pkg/logging"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// Streams and inventories: every attach closes the resources' gates until
// the edge's inventory tells what it holds; a complete inventory is
// compared with the caches in memory and opens the gate.

// gateLocked closes pr's gate until its inventory is complete or the gate
// times out (the timer ends with the manager's context).
func (m *Manager) gateLocked(pr string) {
	if m.opts.InventoryGate <= 0 || m.inventoried[pr] || !m.attached || m.ctx == nil {
		m.open[pr] = true
		return
	}
	m.open[pr] = false
	m.afterLocked(m.opts.InventoryGate, func() {
		if open, ok := m.open[pr]; ok && !open {
			m.opts.Log.Info("no complete inventory from the edge in time; comparing with what is known", logging.KeyPublishedResource, pr)
			m.openLocked(pr)
		}
	})
}

// Attach prepares for a new edge stream: unanswered intents are sent again,
// and every resource waits for the edge's inventory before anything else is
// sent (the edge may have lost or changed local copies meanwhile).
func (m *Manager) Attach() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.attached = true
	m.resyncSince = time.Now()
	clear(m.resyncing)
	clear(m.inventoried)
	clear(m.inventory)
	clear(m.unlisted)
	m.ledger.streamAttached()
	m.relSent.streamAttached()
	for pr := range m.desired {
		m.gateLocked(pr)
	}
	m.opts.Outbox.Reset()
}

// Detach records that the stream ended; state stays for the next one.
func (m *Manager) Detach() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.attached = false
	m.finishResyncLocked(ErrResyncAborted)
}

// openLocked opens pr's gate and re-evaluates all its objects, and the
// copies the edge may hold of objects that are gone.
func (m *Manager) openLocked(pr string) {
	m.open[pr] = true
	if w, ok := m.running[pr]; ok {
		for _, k := range w.store.ListKeys() {
			m.queue.Add(item{pr: pr, key: k})
		}
	}
	m.queueCopiesLocked(pr)
	m.resyncOpenedLocked(pr)
}

// queueCopiesLocked queues the objects of pr whose copies the edge may hold.
func (m *Manager) queueCopiesLocked(pr string) {
	for _, s := range m.ledger.slotsWithCopies(pr) {
		m.queue.Add(s)
	}
}

// Inventory records a chunk of the edge's inventory; the last chunk of a
// PublishedResource replaces what the manager knows the edge applied for it
// and opens its gate: every object is compared (in memory) and only those
// whose content hash differs are sent.
func (m *Manager) Inventory(inv *ferryv1.Inventory) {
	pr := inv.GetPublishedResource()
	m.mu.Lock()
	defer m.mu.Unlock()
	entries := m.inventory[pr]
	if entries == nil {
		entries = map[objectID]string{}
		m.inventory[pr] = entries
	}
	m.resyncInventoryLocked(pr, len(inv.GetEntries()))
	for _, e := range inv.GetEntries() {
		// The UID is part of the identity: a copy of an older object by
		// the same name does not count as applied.
		id := idOf(pr, e.GetKey())
		entries[id] = e.GetAppliedHash()
		// Every copy the edge holds, whether its object is still in kcp or
		// not: one that is gone gets a delete intent (see gone).
		m.ledger.copyListed(id, e.GetKey())
		// A copy adopted from another agent whose finalizer swap may
		// have been lost with a stream (adoption.go).
		if f := foreignFinalizer(e.GetAdoptedFrom()); f != "" {
			m.adopted[id] = f
			m.finalizers.Add(item{pr: pr, key: storeKey(e.GetKey())})
		}
	}
	// The related copies it holds: not sent again while unchanged.
	m.relSent.inventoried(pr, inv.GetRelatedEntries(), inv.GetComplete() && inv.GetRelatedComplete())
	if !inv.GetComplete() {
		return
	}
	m.inventoried[pr] = true
	delete(m.inventory, pr)
	if w, ok := m.running[pr]; ok && w.store.listed() {
		m.compareInventoryLocked(pr, w, entries)
		return
	}
	m.unlisted[pr] = entries
	m.opts.Log.Info("edge inventory received; compared once the published resource is listed", logging.KeyPublishedResource, pr, logging.KeyObjects, len(entries))
}

// compareInventoryLocked replaces what the manager knows the edge applied
// for pr with a complete inventory (entries: object key and UID → content
// hash) and opens pr's gate: every object is compared in memory and only
// those whose hash differs are sent. w's cache must be listed at every
// endpoint: an object is "gone" only when no shard that may hold it can
// still list it.
func (m *Manager) compareInventoryLocked(pr string, w *watcher, entries map[objectID]string) {
	m.ledger.inventoried(pr, entries)
	objects := w.store.List()
	for _, raw := range objects {
		if m.opts.Metrics != nil {
			m.resyncing[item{pr: pr, key: clusterKeyOf(raw.(*unstructured.Unstructured))}] = struct{}{}
		}
	}
	m.resyncObserver().Resynced(m.resyncSince, len(objects))
	m.opts.Log.Info("edge inventory complete", logging.KeyPublishedResource, pr, logging.KeyObjects, len(entries))
	m.openLocked(pr)
}

package replication

import (
	"slices"

	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// objectID is the whole identity of a kcp object the broker syncs: its
// PublishedResource, resource, logical cluster, namespace, name and UID. A
// new UID at the same name is a new object: nothing recorded about the old
// one (what the edge applied, what was sent) counts for it.
type objectID struct {
	pr                       string
	resource                 schema.GroupResource
	cluster, namespace, name string
	uid                      string
}

// idOf is the identity of the object behind key, synced by pr.
func idOf(pr string, key *ferryv1.ObjectKey) objectID {
	r := key.GetResource()
	return objectID{pr: pr, resource: schema.GroupResource{Group: r.GetGroup(), Resource: r.GetResource()},
		cluster: key.GetCluster(), namespace: key.GetNamespace(), name: key.GetName(), uid: key.GetUid()}
}

// slot is the object's place without its UID: the cache key, and where the
// edge keeps (at most) one copy.
func (id objectID) slot() item {
	return item{pr: id.pr, key: objectName{cluster: id.cluster, namespace: id.namespace, name: id.name}.storeKey()}
}

// sentDelete is the state recorded as sent for a delete intent.
const sentDelete = "delete"

// record is what the broker knows of one object (by objectID).
type record struct {
	// key is the object's protocol key (with its resource's version).
	key *ferryv1.ObjectKey
	// applied is the content hash the edge is known to hold for this
	// object (its inventory or an ack); it outlives streams.
	applied string
	// sent is the state last queued on the current stream: a content hash,
	// sentDelete, or "" (nothing, or to be compared again).
	sent string
	// copy tells that the edge may hold a copy of this object: an upsert
	// was queued for it, or its inventory listed it. Cleared only when the
	// edge confirms the copy's deletion.
	copy bool
	// rejected: the edge refused the last intent with a final error; it is
	// tried again when the object's desired state or the PublishedResource
	// changes. rejectedHash is the refused state: it is not sent again on
	// later streams (nor evented again) while it stays the desired one.
	rejected     bool
	rejectedHash string
}

// ledger records, per object (whole identity), what the edge holds and
// what is in flight. It holds no clients and starts nothing; the manager
// calls it under its lock. Records are grouped by slot: the edge keeps
// one copy per slot, so a copy of an older object at a slot must be
// deleted (and confirmed) before a newer object's is sent.
type ledger struct {
	slots map[item]map[objectID]*record
}

func newLedger() *ledger { return &ledger{slots: map[item]map[objectID]*record{}} }

// get returns id's record, or nil.
func (l *ledger) get(id objectID) *record { return l.slots[id.slot()][id] }

// ensure returns id's record, creating it.
func (l *ledger) ensure(id objectID, key *ferryv1.ObjectKey) *record {
	s := id.slot()
	recs := l.slots[s]
	if recs == nil {
		recs = map[objectID]*record{}
		l.slots[s] = recs
	}
	r := recs[id]
	if r == nil {
		r = &record{key: key}
		recs[id] = r
	}
	return r
}

// drop removes id's record.
func (l *ledger) drop(id objectID) {
	s := id.slot()
	delete(l.slots[s], id)
	if len(l.slots[s]) == 0 {
		delete(l.slots, s)
	}
}

// applied is the content hash the edge is known to hold for id ("" none).
func (l *ledger) applied(id objectID) string {
	if r := l.get(id); r != nil {
		return r.applied
	}
	return ""
}

// mayHold tells whether the edge may hold a copy of exactly id.
func (l *ledger) mayHold(id objectID) bool {
	r := l.get(id)
	return r != nil && r.copy
}

// upsertQueued records that an upsert of hash is queued for id (the edge
// may hold a copy from now on) and tells whether it was not already.
func (l *ledger) upsertQueued(id objectID, key *ferryv1.ObjectKey, hash string) bool {
	r := l.ensure(id, key)
	r.key = key
	r.copy = true
	if r.sent == hash || r.rejected && r.rejectedHash == hash {
		r.sent = hash
		return false
	}
	r.sent = hash
	r.rejected, r.rejectedHash = false, ""
	return true
}

// unchanged records that the edge holds id's desired state hash already:
// nothing is queued.
func (l *ledger) unchanged(id objectID, hash string) {
	if r := l.get(id); r != nil {
		r.sent = hash
	}
}

// deleteQueued records that the deletion of id's copy is queued and tells
// whether it was not already. What the edge applied no longer counts: it
// is asked to delete it, and an object back in scope before the edge
// answered must be sent again.
func (l *ledger) deleteQueued(id objectID, key *ferryv1.ObjectKey) bool {
	r := l.ensure(id, key)
	r.applied = ""
	r.rejected = false
	if r.sent == sentDelete {
		return false
	}
	r.sent = sentDelete
	return true
}

// acked records that the edge applied hash for id.
func (l *ledger) acked(id objectID, key *ferryv1.ObjectKey, hash string) {
	r := l.ensure(id, key)
	r.applied, r.copy = hash, true
}

// retry forgets what was queued for id: the edge could not apply it and
// it is sent again.
func (l *ledger) retry(id objectID) {
	if r := l.get(id); r != nil {
		r.sent = ""
	}
}

// rejectedFinal records a final refusal of id's intent.
func (l *ledger) rejectedFinal(id objectID, key *ferryv1.ObjectKey) {
	r := l.ensure(id, key)
	r.rejected, r.rejectedHash = true, r.sent
}

// unreject clears a final refusal of id: it is compared and sent again.
func (l *ledger) unreject(id objectID) {
	if r := l.get(id); r != nil {
		r.rejected, r.rejectedHash, r.sent = false, "", ""
	}
}

// resend forgets what the edge applied for id and what was queued: its
// copy drifted.
func (l *ledger) resend(id objectID) {
	if r := l.get(id); r != nil {
		r.applied, r.sent = "", ""
	}
}

// confirmed records that the edge's copy of id is gone (deletion
// confirmed, finalizer released): id's record goes.
func (l *ledger) confirmed(id objectID) {
	l.drop(id)
}

// olderCopies returns the copies the edge may hold at id's slot of other
// objects (other UIDs), which go before id's own is sent.
func (l *ledger) olderCopies(id objectID) []objectID {
	// Another UID: the same UID is the same object, whatever else differs.
	return slices.DeleteFunc(l.copiesAt(id.slot()), func(other objectID) bool { return other.uid == id.uid })
}

// copiesAt returns the objects at slot whose copies the edge may hold.
func (l *ledger) copiesAt(s item) []objectID {
	var out []objectID
	for id, r := range l.slots[s] {
		if r.copy {
			out = append(out, id)
		}
	}
	return out
}

// slotsWithCopies returns pr's slots where the edge may hold a copy.
func (l *ledger) slotsWithCopies(pr string) []item {
	var out []item
	for s, recs := range l.slots {
		if s.pr != pr {
			continue
		}
		for _, r := range recs {
			if r.copy {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

// slotsApplied returns pr's slots where the edge holds some object's state.
func (l *ledger) slotsApplied(pr string) []item {
	var out []item
	for s := range l.slots {
		if s.pr == pr && l.appliedAt(s) {
			out = append(out, s)
		}
	}
	return out
}

// appliedAt tells whether the edge holds some object's state at s.
func (l *ledger) appliedAt(s item) bool {
	for _, r := range l.slots[s] {
		if r.applied != "" {
			return true
		}
	}
	return false
}

// pendingAt tells whether a state the edge does not hold was queued at s
// on this stream.
func (l *ledger) pendingAt(s item) bool {
	for _, r := range l.slots[s] {
		if r.sent != "" && r.sent != r.applied {
			return true
		}
	}
	return false
}

// appliedCount is the number of pr's objects whose applied hash is known.
func (l *ledger) appliedCount(pr string) int {
	n := 0
	for s, recs := range l.slots {
		if s.pr != pr {
			continue
		}
		for _, r := range recs {
			if r.applied != "" {
				n++
			}
		}
	}
	return n
}

// records returns the records at s (for views).
func (l *ledger) records(s item) map[objectID]*record { return l.slots[s] }

// forEach calls f for every record of pr.
func (l *ledger) forEach(pr string, f func(objectID, *record)) {
	for s, recs := range l.slots {
		if s.pr != pr {
			continue
		}
		for id, r := range recs {
			f(id, r)
		}
	}
}

// compareAgain forgets what was queued for pr's objects on this stream:
// everything is compared again (a resync an operator asked for, e.g. after
// fixing what made the service cluster refuse objects: refusals are tried
// again too).
func (l *ledger) compareAgain(pr string) {
	l.forEach(pr, func(_ objectID, r *record) { r.sent, r.rejected, r.rejectedHash = "", false, "" })
}

// streamAttached forgets what was queued on the previous stream.
func (l *ledger) streamAttached() {
	for _, recs := range l.slots {
		for _, r := range recs {
			r.sent = ""
		}
	}
}

// withdrawn records that pr is withdrawn (invalid, or paused by its
// edge): deletions are still asked for, so what was queued is compared
// again (a deletion whose confirmation was lost is asked for again).
// Copies stay known: their objects' deletions still need them.
func (l *ledger) withdrawn(pr string) {
	l.forEach(pr, func(_ objectID, r *record) { r.sent = "" })
}

// republished records that pr is published again after a withdrawal:
// copies may have been deleted or changed meanwhile, and refusals may no
// longer hold, so every object is sent again (the edge skips states it
// holds).
func (l *ledger) republished(pr string) {
	l.forEach(pr, func(_ objectID, r *record) { r.sent, r.applied, r.rejected, r.rejectedHash = "", "", false, "" })
}

// rejectedOf returns pr's objects refused with a final error.
func (l *ledger) rejectedOf(pr string) []objectID {
	var out []objectID
	l.forEach(pr, func(id objectID, r *record) {
		if r.rejected {
			out = append(out, id)
		}
	})
	return out
}

// inventoried records the copies a complete inventory of pr lists
// (entries: identity → applied hash): what the edge holds is exactly
// that; an object it does not list holds nothing.
func (l *ledger) inventoried(pr string, entries map[objectID]string) {
	l.forEach(pr, func(id objectID, r *record) {
		h := entries[id] // "" when not listed
		r.applied = h
		if r.sent != h && r.sent != sentDelete {
			// The edge does not hold what was sent last (its copy is gone,
			// or was applied under PublishedResource settings that changed
			// since): that state is sent again. One still in flight is only
			// replaced by itself in the outbox.
			r.sent = ""
		}
	})
}

// copyListed records a copy the edge's inventory lists.
func (l *ledger) copyListed(id objectID, key *ferryv1.ObjectKey) {
	l.ensure(id, key).copy = true
}

// forget removes every record of pr (its objects are released).
func (l *ledger) forget(pr string) {
	for s := range l.slots {
		if s.pr == pr {
			delete(l.slots, s)
		}
	}
}

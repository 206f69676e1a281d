package replication

import (
	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// relatedSent records, per kcp-origin related reference, what the edge
// holds or was last sent on the current stream, so that an unchanged
// related object is not sent again — in particular not after a reconnect,
// when the edge's inventory lists the related copies it holds with the
// hash of their content. It holds states (key, UID, content hash), never
// objects. Not safe for concurrent use (the Manager's mutex guards it).
type relatedSent struct {
	// sent is what was sent per reference on this stream; "" asks for the
	// next state to be sent whatever the edge holds.
	sent map[item]string
	// held is what the edge's inventory on this stream said it holds.
	held map[item]heldRelated
	// listed holds the PublishedResources whose inventory on this stream
	// listed every related copy the edge holds: a reference without an
	// entry has none.
	listed map[string]bool
}

// heldRelated is one related copy the edge listed: the state of the kcp
// object it holds (relatedState), for the primary of this UID.
type heldRelated struct{ primaryUID, state string }

// relatedDeleted is the state "no object": the reference points at
// nothing in kcp, and the edge holds (or is to hold) no copy.
const relatedDeleted = "delete"

// relatedState is the state of a kcp-origin related object as the edge
// applies it: where it is in kcp, its UID and the hash of its content
// (objects.RelatedHash). An empty hash (a copy edited locally) is a state
// nothing equals.
func relatedState(cluster, namespace, name, uid, hash string) string {
	if hash == "" {
		return ""
	}
	return objectName{cluster: cluster, namespace: namespace, name: name}.storeKey() + "#" + uid + "@" + hash
}

func newRelatedSent() *relatedSent {
	return &relatedSent{sent: map[item]string{}, held: map[item]heldRelated{}, listed: map[string]bool{}}
}

// streamAttached forgets what the previous stream carried: the edge's next
// inventory tells what it holds.
func (r *relatedSent) streamAttached() {
	clear(r.sent)
	clear(r.held)
	clear(r.listed)
}

// again makes the next state of it be sent, whatever the edge was known to
// hold (the edge asked for it again, or could not apply it, or a changed
// PublishedResource may now accept what it refused).
func (r *relatedSent) again(it item) { r.sent[it] = "" }

// forget drops it (its primary is gone).
func (r *relatedSent) forget(it item) {
	delete(r.sent, it)
	delete(r.held, it)
}

// forgetResource drops every reference of pr.
func (r *relatedSent) forgetResource(pr string) {
	for it := range r.sent {
		if it.pr == pr {
			delete(r.sent, it)
		}
	}
	for it := range r.held {
		if it.pr == pr {
			delete(r.held, it)
		}
	}
	delete(r.listed, pr)
}

// inventoried records a chunk of pr's inventory: the related copies the
// edge holds. all tells that the inventory is complete and lists every
// related copy; then every reference of pr is compared with it again (an
// inventory asked for on a running stream replaces what was sent).
func (r *relatedSent) inventoried(pr string, entries []*ferryv1.RelatedInventoryEntry, all bool) {
	for _, e := range entries {
		rt, k := e.GetRelatedTo(), e.GetKey()
		it := item{pr: pr, key: storeKey(rt.GetPrimary()), related: rt.GetIdentifier()}
		r.held[it] = heldRelated{primaryUID: rt.GetPrimary().GetUid(),
			state: relatedState(k.GetCluster(), k.GetNamespace(), k.GetName(), k.GetUid(), e.GetAppliedHash())}
		delete(r.sent, it)
	}
	if !all {
		return
	}
	r.listed[pr] = true
	for it := range r.sent {
		if it.pr == pr {
			delete(r.sent, it)
		}
	}
}

// next records that the reference it of the primary with UID primaryUID
// is now in state (relatedState or relatedDeleted) and tells whether its
// intent is to be sent, or, when the edge's inventory shows that it holds
// that state already, whether an intent still waiting in the outbox (one
// the previous stream did not deliver) is to be dropped.
func (r *relatedSent) next(it item, primaryUID, state string) (send, drop bool) {
	prev, known := r.sent[it]
	inventory := false
	if !known {
		if h, ok := r.held[it]; ok && h.primaryUID == primaryUID {
			prev, known, inventory = h.state, true, true
		} else if r.listed[it.pr] {
			// Listed without a copy for this primary (or only one for an
			// older object of its name, which the edge deletes with it).
			prev, known, inventory = relatedDeleted, true, true
		}
	}
	r.sent[it] = state
	if known && prev == state {
		return false, inventory
	}
	return true, false
}

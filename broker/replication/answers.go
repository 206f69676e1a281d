package replication

import (
	"time"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// The edge's answers to intents: acks, retries after a failure, final
// refusals and requests to send again.

// Retry re-sends the object behind key after an apply failed, with an
// exponential per-object delay (1 s doubling up to 5 min).
func (m *Manager) Retry(pr string, key *ferryv1.ObjectKey) time.Duration {
	it := item{pr: pr, key: storeKey(key)}
	m.mu.Lock()
	m.ledger.retry(idOf(pr, key))
	m.mu.Unlock()
	d := m.nacks.When(it)
	m.queue.AddAfter(it, d)
	return d
}

// Resend forgets what the edge applied for key and queues its desired state
// (or its delete) again: the edge's copy drifted and it does not hold the
// state. Checked against the cache like any intent: an object the engine
// does not sync sends nothing.
func (m *Manager) Resend(pr string, key *ferryv1.ObjectKey) {
	it := item{pr: pr, key: storeKey(key)}
	m.mu.Lock()
	m.ledger.resend(idOf(pr, key))
	m.mu.Unlock()
	m.queue.Add(it)
}

// Applied records that the edge applied in (an upsert) and forgets the
// failure history of its object.
func (m *Manager) Applied(pr string, in *ferryv1.SyncIntent) {
	it := item{pr: pr, key: storeKey(in.GetKey())}
	m.nacks.Forget(it)
	m.mu.Lock()
	defer m.mu.Unlock()
	if h := in.GetUpsert().GetContentHash(); h != "" {
		id := idOf(pr, in.GetKey())
		m.ledger.acked(id, in.GetKey(), h)
		// An inventory waiting for every endpoint to list (a shard that
		// cannot be reached) is the edge's state when it was sent: what
		// the edge applied since is part of it, or the comparison would
		// send it again.
		if entries, waiting := m.unlisted[pr]; waiting {
			entries[id] = h
		}
	}
	m.queueRelatedLocked(pr, it.key)
}

// RetryRelated re-sends a related object after the edge could not apply it,
// with the same per-object backoff as Retry.
func (m *Manager) RetryRelated(pr string, rt *ferryv1.RelatedTo) time.Duration {
	it := item{pr: pr, key: storeKey(rt.GetPrimary()), related: rt.GetIdentifier()}
	m.mu.Lock()
	m.relSent.again(it)
	m.mu.Unlock()
	d := m.nacks.When(it)
	m.queue.AddAfter(it, d)
	return d
}

// Rejected records that the edge refused the object's (or, with related
// set, the reference's) intent with a final error (invalid, forbidden, a
// failing mutation): it is sent again only when the kcp object changes
// (its desired state differs) or its PublishedResource does.
func (m *Manager) Rejected(pr string, key *ferryv1.ObjectKey, related string) {
	it := item{pr: pr, key: storeKey(key), related: related}
	m.mu.Lock()
	defer m.mu.Unlock()
	if related == "" {
		m.ledger.rejectedFinal(idOf(pr, key), key)
	} else {
		m.rejected[it] = struct{}{}
	}
	m.nacks.Forget(it)
}

// AppliedRelated forgets the failure history of a related object.
func (m *Manager) AppliedRelated(pr string, rt *ferryv1.RelatedTo) {
	m.nacks.Forget(item{pr: pr, key: storeKey(rt.GetPrimary()), related: rt.GetIdentifier()})
}

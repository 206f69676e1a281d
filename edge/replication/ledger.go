package replication

import (
	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// The edge's ledger: per kcp object (its whole identity), what the service
// cluster holds of it and what is in flight. It keeps hashes, places and
// keys — never the object's content once applied: a copy that drifted is
// repaired with the desired state the broker sends again on request
// (drift.go), so memory per copy does not grow with the object's size.
//
// The ledger holds no clients and starts no goroutines. It is not safe for
// concurrent use: the engine calls it under its own lock (Engine.mu),
// because its decisions combine the ledger with the rest of its state under
// that lock — the watch's withdrawn flag, the report outbox, the related
// index (a delete in flight must be seen by relatedGone in the same critical
// section that reads the watch's store). A mutex of its own would split
// those check-then-act steps or ask for a lock order.

// ledgerKey is the whole identity of a kcp object the edge copies: the
// PublishedResource that routes it on this edge, its kcp resource (group,
// version, resource), logical cluster, namespace, name and UID. A new UID at
// the same name is a new object: nothing recorded about the old one counts
// for it.
type ledgerKey struct {
	pr       string
	resource schema.GroupVersionResource
	cluster  string
	// namespace is empty for a cluster-scoped kcp object.
	namespace, name string
	uid             string
}

// keyFor is the ledger key of key's object, routed by PublishedResource pr.
func keyFor(pr string, key *ferryv1.ObjectKey) ledgerKey {
	r := key.GetResource()
	return ledgerKey{pr: pr, resource: schema.GroupVersionResource{Group: r.GetGroup(), Version: r.GetVersion(), Resource: r.GetResource()},
		cluster: key.GetCluster(), namespace: key.GetNamespace(), name: key.GetName(), uid: key.GetUid()}
}

// objectKey is the protocol key of k's object.
func (k ledgerKey) objectKey() *ferryv1.ObjectKey {
	return &ferryv1.ObjectKey{
		Cluster:   k.cluster,
		Resource:  &ferryv1.GroupVersionResource{Group: k.resource.Group, Version: k.resource.Version, Resource: k.resource.Resource},
		Namespace: k.namespace, Name: k.name, Uid: k.uid,
	}
}

// String is k as logs show it.
func (k ledgerKey) String() string {
	return k.cluster + "|" + k.resource.GroupResource().String() + "|" + nsName(k.namespace, k.name) + "|" + k.uid
}

// queueKey is an item of the apply queue: an object (its intent, or a check
// of its copy when no intent is pending), a related object's slot (object is
// its primary, related the related[] identifier), or the Synced condition
// of a PublishedResource (condition, nothing else set).
type queueKey struct {
	object    ledgerKey
	related   string
	condition string
}

// objectRecord is what the ledger knows of one object. Its zero value means
// nothing is known (the record is dropped).
type objectRecord struct {
	// applied: this process applied the copy (or found it holding the
	// desired state) at namespace/name, with content hash and shape, and
	// the copy's generation was generation right after.
	applied         bool
	hash, shape     string
	namespace, name string
	generation      int64
	// resendAsked: the copy drifted and the broker was asked for the
	// desired state; the next upsert is applied even when its hash matches.
	resendAsked bool
	// statusSum is the last status reported (statusKnown: one was).
	statusSum   [32]byte
	statusKnown bool
	// deleting is the version of the delete intent carried out, awaiting
	// the copy's disappearance to be confirmed (nil: none in flight).
	deleting *ferryv1.ObjectVersion
	// refusal is how the last intent was refused for good (a final CONFLICT:
	// the local name is taken; or any other final refusal); counted in the
	// PublishedResource's status.
	refusal refusalKind
}

// refusalKind is how the edge last refused an object's intent for good.
type refusalKind uint8

const (
	refusalNone     refusalKind = iota
	refusalConflict             // a final CONFLICT: the local name is taken
	refusalFailing              // any other final refusal
)

// refusalCounts are a PublishedResource's objects refused for good, and
// the message of the latest refusal (for its Synced condition).
type refusalCounts struct {
	conflicting, failing int
	// relatedFailing counts related objects refused (kcp-origin intents the
	// edge refused for good, service-origin reports of a place it may not
	// read or an object shared by several primaries).
	relatedFailing int
	latest         string
}

// ledger is the edge's per-object bookkeeping; see the top of this file.
type ledger struct {
	records map[ledgerKey]*objectRecord
	// pending holds intents received and not yet taken by a worker (latest
	// per queue key). Bounded by the broker's window, and dropped with the
	// stream: the broker sends unanswered intents again.
	pending map[queueKey]*ferryv1.SyncIntent
	// refused counts the records with a refusal, per PublishedResource.
	refused map[string]*refusalCounts
	// relatedRefused holds the related objects refused (by primary and
	// entry); only refused ones, so it stays as small as the refusals.
	relatedRefused map[relKey]bool
}

func newLedger() *ledger {
	return &ledger{records: map[ledgerKey]*objectRecord{}, pending: map[queueKey]*ferryv1.SyncIntent{}, refused: map[string]*refusalCounts{},
		relatedRefused: map[relKey]bool{}}
}

// get returns k's record, or nil.
func (l *ledger) get(k ledgerKey) *objectRecord { return l.records[k] }

// ensure returns k's record, creating it.
func (l *ledger) ensure(k ledgerKey) *objectRecord {
	r := l.records[k]
	if r == nil {
		r = &objectRecord{}
		l.records[k] = r
	}
	return r
}

// tidy drops k's record when it holds nothing any more.
func (l *ledger) tidy(k ledgerKey) {
	if r := l.records[k]; r != nil && *r == (objectRecord{}) {
		delete(l.records, k)
	}
}

// received keeps in as the latest intent for q.
func (l *ledger) received(q queueKey, in *ferryv1.SyncIntent) { l.pending[q] = in }

// take returns and forgets q's pending intent (nil: none).
func (l *ledger) take(q queueKey) *ferryv1.SyncIntent {
	in := l.pending[q]
	delete(l.pending, q)
	return in
}

// streamEnded forgets the pending intents: the broker sends what it has
// no answer for again on the next stream.
func (l *ledger) streamEnded() { clear(l.pending) }

// applied records that k's copy at namespace/name holds content hash and
// shape, with generation right after the apply; a resend asked for is
// answered.
func (l *ledger) applied(k ledgerKey, hash, shape, namespace, name string, generation int64) {
	r := l.ensure(k)
	r.applied, r.hash, r.shape, r.namespace, r.name, r.generation = true, hash, shape, namespace, name, generation
	r.resendAsked = false
}

// appliedAt returns where this process applied k's copy.
func (l *ledger) appliedAt(k ledgerKey) (namespace, name string, ok bool) {
	if r := l.get(k); r != nil && r.applied {
		return r.namespace, r.name, true
	}
	return "", "", false
}

// drifted tells whether a copy of k seen with generation and content hash
// and shape annotations was changed by someone else since this process
// applied it: its generation moved (a spec change; status writes do not
// move it when the CRD has a status subresource), or its hash or shape is
// not the applied one. Copies this process did not apply are trusted.
func (l *ledger) drifted(k ledgerKey, generation int64, hash, shape string) bool {
	r := l.get(k)
	if r == nil || !r.applied {
		return false
	}
	return generation != r.generation || hash != r.hash || shape != r.shape
}

// askResend records that the broker is asked for k's desired state (its
// copy drifted) and tells whether to ask: not while its delete is in
// flight.
func (l *ledger) askResend(k ledgerKey) bool {
	if l.deleting(k) {
		return false
	}
	l.ensure(k).resendAsked = true
	return true
}

// resendPending tells whether k's next upsert is applied even when the
// copy holds its hash (a resend was asked for).
func (l *ledger) resendPending(k ledgerKey) bool {
	r := l.get(k)
	return r != nil && r.resendAsked
}

// statusSeen records the status sum of k's copy and tells whether it
// differs from the last one reported (to be reported).
func (l *ledger) statusSeen(k ledgerKey, sum [32]byte) bool {
	r := l.ensure(k)
	if r.statusKnown && r.statusSum == sum {
		return false
	}
	r.statusSum, r.statusKnown = sum, true
	return true
}

// deleteIssued records that the delete intent of version is carried out on
// k's copy: its disappearance confirms it, and it is no drift.
func (l *ledger) deleteIssued(k ledgerKey, version *ferryv1.ObjectVersion) {
	r := l.ensure(k)
	r.deleting = version
	if r.deleting == nil {
		r.deleting = &ferryv1.ObjectVersion{}
	}
}

// deleteFailed forgets a delete in flight that could not be issued (the
// broker retries it).
func (l *ledger) deleteFailed(k ledgerKey) {
	if r := l.get(k); r != nil {
		r.deleting = nil
		l.tidy(k)
	}
}

// deleting tells whether a delete of k's copy is in flight.
func (l *ledger) deleting(k ledgerKey) bool {
	r := l.get(k)
	return r != nil && r.deleting != nil
}

// gone records that k's copy left the service cluster. It returns the
// version of the delete in flight when there was one (to confirm); the
// copy's applied state and status no longer count either way.
func (l *ledger) gone(k ledgerKey) (version *ferryv1.ObjectVersion, wasDeleting bool) {
	r := l.get(k)
	if r == nil {
		return nil, false
	}
	version, wasDeleting = r.deleting, r.deleting != nil
	r.statusSum, r.statusKnown = [32]byte{}, false
	if wasDeleting {
		r.deleting = nil
		r.applied, r.hash, r.shape, r.namespace, r.name, r.generation = false, "", "", "", "", 0
		r.resendAsked = false
	}
	l.tidy(k)
	return version, wasDeleting
}

// confirmed records that k's deletion is confirmed to the broker: nothing
// of its copy is left to track (a final conflict stays until the answer
// that clears it is counted).
func (l *ledger) confirmed(k ledgerKey) {
	r := l.get(k)
	if r == nil {
		return
	}
	*r = objectRecord{refusal: r.refusal}
	l.tidy(k)
}

// answered records the answer to an intent for k: a final refusal (kind,
// with its message) sets the record's refusal, a success or an answered
// delete (clears) clears it. It tells whether pr's counts or latest
// refusal changed (its status is to be written).
func (l *ledger) answered(k ledgerKey, kind refusalKind, message string, clears bool) bool {
	r := l.get(k)
	was := refusalNone
	if r != nil {
		was = r.refusal
	}
	switch {
	case kind != refusalNone:
		c := l.refused[k.pr]
		if c == nil {
			c = &refusalCounts{}
			l.refused[k.pr] = c
		}
		changed := c.latest != message || was != kind
		c.latest = message
		if was != kind {
			c.add(was, -1)
			c.add(kind, 1)
			l.ensure(k).refusal = kind
		}
		return changed
	case was != refusalNone && clears:
		r.refusal = refusalNone
		if c := l.refused[k.pr]; c != nil {
			c.add(was, -1)
			l.dropEmpty(k.pr)
		}
		l.tidy(k)
		return true
	}
	return false
}

// relatedAnswered records whether the related object of rk is refused
// (with message) and tells whether its PublishedResource's counts changed.
func (l *ledger) relatedAnswered(rk relKey, refused bool, message string) bool {
	was := l.relatedRefused[rk]
	c := l.refused[rk.primary.pr]
	switch {
	case refused:
		if c == nil {
			c = &refusalCounts{}
			l.refused[rk.primary.pr] = c
		}
		changed := !was || c.latest != message
		c.latest = message
		if !was {
			l.relatedRefused[rk] = true
			c.relatedFailing++
		}
		return changed
	case was:
		delete(l.relatedRefused, rk)
		if c != nil {
			c.relatedFailing--
			l.dropEmpty(rk.primary.pr)
		}
		return true
	}
	return false
}

// dropEmpty forgets pr's counts when nothing is refused any more.
func (l *ledger) dropEmpty(pr string) {
	if c := l.refused[pr]; c != nil && c.conflicting <= 0 && c.failing <= 0 && c.relatedFailing <= 0 {
		delete(l.refused, pr)
	}
}

func (c *refusalCounts) add(kind refusalKind, n int) {
	switch kind {
	case refusalConflict:
		c.conflicting += n
	case refusalFailing:
		c.failing += n
	}
}

// refusals returns pr's counts of objects refused for good (zero when
// none).
func (l *ledger) refusals(pr string) refusalCounts {
	if c := l.refused[pr]; c != nil {
		return *c
	}
	return refusalCounts{}
}

// resetRefusals forgets pr's refusals: a new revision of it is registered,
// whose answers count them again.
func (l *ledger) resetRefusals(pr string) {
	for k, r := range l.records {
		if k.pr == pr && r.refusal != refusalNone {
			r.refusal = refusalNone
			l.tidy(k)
		}
	}
	l.forgetRelatedOf(pr)
	delete(l.refused, pr)
}

// forgetRelatedOf drops the related refusals of pr's objects.
func (l *ledger) forgetRelatedOf(pr string) {
	for rk := range l.relatedRefused {
		if rk.primary.pr == pr {
			delete(l.relatedRefused, rk)
		}
	}
}

// forget drops everything recorded of pr's copies: it is no longer synced
// by this edge (no watch sees its copies, so nothing recorded could be
// acted on or confirmed). Its pending intents stay: each is answered (not
// published), or the broker's window would keep them in flight.
func (l *ledger) forget(pr string) {
	for k := range l.records {
		if k.pr == pr {
			delete(l.records, k)
		}
	}
	l.forgetRelatedOf(pr)
	delete(l.refused, pr)
}

// len is the number of objects recorded.
func (l *ledger) len() int { return len(l.records) }

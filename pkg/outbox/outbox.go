// Package outbox is ferry's reliable sender state, used in both directions
// of the edge ↔ broker stream: sync intents (broker → edge) and reports
// (edge → broker). It holds the latest message per key, hands messages out
// with at most Window of them awaiting an answer, matches answers by key and
// sequence, and puts unanswered messages back when a stream is replaced.
//
// The rules:
//   - Latest wins: a Put replaces the pending message of its key (a delete
//     is just a newer message and so supersedes pending updates). A replaced
//     message keeps its key's place in line.
//   - One message per key in flight: a newer message for a key whose older
//     one awaits an answer is held until that answer arrives. The peer
//     therefore sees a key's messages in order and never two at once — a
//     delete cannot overtake the upsert it follows.
//   - Answers match by key and sequence; anything else is stale and ignored.
//   - Reset (a new stream) moves every unanswered message back to the front
//     of the line, in the order it was first sent, unless a newer message for
//     its key is pending.
//
// Memory is bounded by the number of keys: at most one pending and one
// in-flight message per key.
package outbox

import (
	"slices"
	"sync"
	"time"
)

// Entry is one message handed out by Next.
type Entry[K comparable, V any] struct {
	// Key identifies what the message is about.
	Key K
	// Seq is unique per Outbox and increases with every Put; answers carry it.
	Seq uint64
	// Value is the message.
	Value V
	// queued is when the message was Put.
	queued time.Time
}

// Queued is when the message was Put.
func (e Entry[K, V]) Queued() time.Time { return e.queued }

// Outbox is the reliable sender state for one peer. Safe for concurrent use;
// no method blocks.
type Outbox[K comparable, V any] struct {
	window int
	wake   func()

	mu       sync.Mutex
	seq      uint64
	order    []K // keys ready to send, oldest first; none of them in flight
	pending  map[K]Entry[K, V]
	inflight map[K]Entry[K, V]
	bySeq    map[uint64]K // in-flight sequences
}

// New returns an outbox allowing window unanswered messages; wake is called
// (it must not block) whenever Next may return something new.
func New[K comparable, V any](window int, wake func()) *Outbox[K, V] {
	if window < 1 {
		window = 1
	}
	if wake == nil {
		wake = func() {}
	}
	return &Outbox[K, V]{
		window: window, wake: wake,
		pending: map[K]Entry[K, V]{}, inflight: map[K]Entry[K, V]{}, bySeq: map[uint64]K{},
	}
}

// Put queues v as the latest message for k and returns its sequence.
func (o *Outbox[K, V]) Put(k K, v V) uint64 {
	o.mu.Lock()
	o.seq++
	seq := o.seq
	_, wasPending := o.pending[k]
	o.pending[k] = Entry[K, V]{Key: k, Seq: seq, Value: v, queued: time.Now()}
	_, busy := o.inflight[k]
	if !wasPending && !busy {
		o.order = append(o.order, k)
	}
	o.mu.Unlock()
	if !busy {
		o.wake()
	}
	return seq
}

// Drop removes k's pending message (not an in-flight one): the peer is known
// to have that state already.
func (o *Outbox[K, V]) Drop(k K) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if _, ok := o.pending[k]; !ok {
		return
	}
	delete(o.pending, k)
	o.removeFromOrderLocked(k)
}

// Forget removes everything about k, pending and in flight.
func (o *Outbox[K, V]) Forget(k K) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if f, ok := o.inflight[k]; ok {
		delete(o.bySeq, f.Seq)
		delete(o.inflight, k)
	}
	if _, ok := o.pending[k]; ok {
		delete(o.pending, k)
		o.removeFromOrderLocked(k)
	}
}

func (o *Outbox[K, V]) removeFromOrderLocked(k K) {
	if i := slices.Index(o.order, k); i >= 0 {
		o.order = slices.Delete(o.order, i, i+1)
	}
}

// Next returns the next message to send and counts it as in flight, or
// false when nothing is ready or the window is full.
func (o *Outbox[K, V]) Next() (Entry[K, V], bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.inflight) >= o.window || len(o.order) == 0 {
		return Entry[K, V]{}, false
	}
	k := o.order[0]
	o.order[0] = *new(K) // let the key be collected
	o.order = o.order[1:]
	e := o.pending[k]
	delete(o.pending, k)
	o.inflight[k] = e
	o.bySeq[e.Seq] = k
	return e, true
}

// Ack records the answer to k's message seq and returns that message; false
// when the answer is stale (not the in-flight message of k).
func (o *Outbox[K, V]) Ack(k K, seq uint64) (Entry[K, V], bool) {
	o.mu.Lock()
	f, ok := o.inflight[k]
	if !ok || f.Seq != seq {
		o.mu.Unlock()
		return Entry[K, V]{}, false
	}
	o.doneLocked(k, f)
	o.mu.Unlock()
	o.wake()
	return f, true
}

// AckSeq is Ack for answers that carry only the sequence.
func (o *Outbox[K, V]) AckSeq(seq uint64) (Entry[K, V], bool) {
	o.mu.Lock()
	k, ok := o.bySeq[seq]
	if !ok {
		o.mu.Unlock()
		return Entry[K, V]{}, false
	}
	f := o.inflight[k]
	o.doneLocked(k, f)
	o.mu.Unlock()
	o.wake()
	return f, true
}

func (o *Outbox[K, V]) doneLocked(k K, f Entry[K, V]) {
	delete(o.inflight, k)
	delete(o.bySeq, f.Seq)
	if _, held := o.pending[k]; held {
		o.order = append(o.order, k) // the held newer message may go now
	}
}

// Reset puts every unanswered message back in line ahead of the rest (a new
// stream: the old one's answers will never come). A message whose key has a
// newer pending one is dropped instead.
func (o *Outbox[K, V]) Reset() {
	o.mu.Lock()
	back := make([]Entry[K, V], 0, len(o.inflight))
	for k, f := range o.inflight {
		if _, newer := o.pending[k]; newer {
			// The newer message is held, not in order yet: line it up.
			o.order = append(o.order, k)
			continue
		}
		back = append(back, f)
	}
	slices.SortFunc(back, func(a, b Entry[K, V]) int { return cmpUint(a.Seq, b.Seq) })
	keys := make([]K, 0, len(back)+len(o.order))
	for _, f := range back {
		o.pending[f.Key] = f
		keys = append(keys, f.Key)
	}
	o.order = append(keys, o.order...)
	clear(o.inflight)
	clear(o.bySeq)
	o.mu.Unlock()
	o.wake()
}

// Pending returns k's pending (not yet sent) message.
func (o *Outbox[K, V]) Pending(k K) (Entry[K, V], bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	e, ok := o.pending[k]
	return e, ok
}

// InFlight returns k's message awaiting an answer.
func (o *Outbox[K, V]) InFlight(k K) (Entry[K, V], bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	e, ok := o.inflight[k]
	return e, ok
}

// Stats describes the outbox for metrics and the admin API.
type Stats struct {
	// Pending messages wait to be sent; InFlight ones for an answer.
	Pending, InFlight int
	// OldestInFlight is when the oldest unanswered message was queued (zero
	// when none).
	OldestInFlight time.Time
}

// Stats returns the outbox's current figures.
func (o *Outbox[K, V]) Stats() Stats {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := Stats{Pending: len(o.pending), InFlight: len(o.inflight)}
	for _, f := range o.inflight {
		if s.OldestInFlight.IsZero() || f.queued.Before(s.OldestInFlight) {
			s.OldestInFlight = f.queued
		}
	}
	return s
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

package replication

import (
	"time"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/outbox"
	"github.com/ferry-dev/ferry/pkg/protocol"
)

// Intents is the broker's outbox of sync intents for one APIExport's edge:
// pkg/outbox keyed by protocol.IntentKey. It outlives streams: a new stream
// gets the unanswered intents again (Reset). Intent versions carry the
// outbox's sequence, so an answer matches exactly one intent. Safe for
// concurrent use.
type Intents struct {
	epoch uint64
	box   *outbox.Outbox[string, *ferryv1.SyncIntent]
}

// NewIntents returns an outbox allowing window unanswered intents; wake is
// called (without blocking) whenever Next may have something new.
func NewIntents(epoch uint64, window int, wake func()) *Intents {
	return &Intents{epoch: epoch, box: outbox.New[string, *ferryv1.SyncIntent](window, wake)}
}

// KeyString is the map key of an object (see protocol.ObjectKeyString).
func KeyString(k *ferryv1.ObjectKey) string { return protocol.ObjectKeyString(k) }

func intentKey(in *ferryv1.SyncIntent) string {
	return protocol.IntentKey(in.GetKey(), in.GetRelatedTo())
}

// Put queues in as the latest intent of its key (its version's sequence is
// assigned when it is sent).
func (o *Intents) Put(in *ferryv1.SyncIntent) { o.box.Put(intentKey(in), in) }

// Drop removes the pending intent of a key: the edge has that state.
func (o *Intents) Drop(key *ferryv1.ObjectKey, relatedTo *ferryv1.RelatedTo) {
	o.box.Drop(protocol.IntentKey(key, relatedTo))
}

// Forget removes everything about a key.
func (o *Intents) Forget(key *ferryv1.ObjectKey, relatedTo *ferryv1.RelatedTo) {
	o.box.Forget(protocol.IntentKey(key, relatedTo))
}

// Next returns the next intent to send, stamped with its version, or nil.
func (o *Intents) Next() *ferryv1.SyncIntent {
	e, ok := o.box.Next()
	if !ok {
		return nil
	}
	// A shallow copy: the stored intent is shared with the outbox.
	in := e.Value
	v := &ferryv1.ObjectVersion{
		BrokerEpoch: o.epoch, Sequence: e.Seq,
		ResourceVersion: in.GetVersion().GetResourceVersion(), Generation: in.GetVersion().GetGeneration(),
	}
	return &ferryv1.SyncIntent{
		Key: in.GetKey(), Version: v, PublishedResource: in.GetPublishedResource(),
		RelatedTo: in.GetRelatedTo(), Operation: in.GetOperation(),
	}
}

// Done records the edge's answer to the intent of key (and relatedTo) at
// version and returns the intent it answers, or nil when the answer is stale.
func (o *Intents) Done(key *ferryv1.ObjectKey, relatedTo *ferryv1.RelatedTo, version *ferryv1.ObjectVersion) *ferryv1.SyncIntent {
	in, _ := o.Answer(key, relatedTo, version)
	return in
}

// Answer is Done that also returns when the answered intent was queued
// (the start of its sync latency).
func (o *Intents) Answer(key *ferryv1.ObjectKey, relatedTo *ferryv1.RelatedTo, version *ferryv1.ObjectVersion) (*ferryv1.SyncIntent, time.Time) {
	if version.GetBrokerEpoch() != o.epoch {
		return nil, time.Time{}
	}
	e, ok := o.box.Ack(protocol.IntentKey(key, relatedTo), version.GetSequence())
	if !ok {
		return nil, time.Time{}
	}
	return e.Value, e.Queued()
}

// Reset re-queues every unanswered intent (a new stream).
func (o *Intents) Reset() { o.box.Reset() }

// Stats returns the outbox's figures.
func (o *Intents) Stats() outbox.Stats { return o.box.Stats() }

package replicate

import (
	"sync"

	"google.golang.org/protobuf/proto"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/protocol"
)

// Outbox holds the sync intents of one edge session: the latest intent per
// object, handed out in first-pending order with at most Window intents
// awaiting a result (backpressure). A delete supersedes pending updates of
// the same object; a result for anything but the latest intent is ignored.
// Its size is bounded by the number of objects. Safe for concurrent use.
type Outbox struct {
	window int
	wake   func()

	mu       sync.Mutex
	order    []string
	pending  map[string]*ferryv1.SyncIntent
	inflight map[string]*ferryv1.SyncIntent
}

// NewOutbox returns an outbox allowing window unanswered intents; wake is
// called (without blocking) whenever Next may have something new.
func NewOutbox(window int, wake func()) *Outbox {
	return &Outbox{
		window: window, wake: wake,
		pending: map[string]*ferryv1.SyncIntent{}, inflight: map[string]*ferryv1.SyncIntent{},
	}
}

// KeyString is the map key of an object (see protocol.ObjectKeyString).
func KeyString(k *ferryv1.ObjectKey) string { return protocol.ObjectKeyString(k) }

// Put queues intent as the latest for its object. An upsert does not
// replace a pending or in-flight delete of the same object (a deleting
// object cannot come back; related objects can). An intent equal in content to the in-flight one
// is not queued again.
func (o *Outbox) Put(intent *ferryv1.SyncIntent) {
	k := protocol.IntentKey(intent.GetKey(), intent.GetRelatedTo())
	o.mu.Lock()
	if intent.GetUpsert() != nil && intent.GetRelatedTo() == nil {
		if p, ok := o.pending[k]; ok && p.GetDelete() != nil {
			o.mu.Unlock()
			return
		}
		if f, ok := o.inflight[k]; ok && (f.GetDelete() != nil || sameContent(f, intent)) {
			o.mu.Unlock()
			return
		}
	}
	if _, ok := o.pending[k]; !ok {
		o.order = append(o.order, k)
	}
	o.pending[k] = intent
	o.mu.Unlock()
	o.wake()
}

func sameContent(a, b *ferryv1.SyncIntent) bool {
	return a.GetVersion().GetResourceVersion() == b.GetVersion().GetResourceVersion() &&
		proto.Equal(a.GetUpsert(), b.GetUpsert())
}

// Next returns the next intent to send, or nil when nothing is pending or
// the window is full. The intent counts as in flight until Done.
func (o *Outbox) Next() *ferryv1.SyncIntent {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.inflight) >= o.window || len(o.order) == 0 {
		return nil
	}
	k := o.order[0]
	o.order = o.order[1:]
	intent := o.pending[k]
	delete(o.pending, k)
	o.inflight[k] = intent
	return intent
}

// Done records the edge's result for key (and relatedTo) at version and returns the intent
// it answers, or nil when the result is stale (a newer intent exists).
func (o *Outbox) Done(key *ferryv1.ObjectKey, relatedTo *ferryv1.RelatedTo, version *ferryv1.ObjectVersion) *ferryv1.SyncIntent {
	k := protocol.IntentKey(key, relatedTo)
	o.mu.Lock()
	f, ok := o.inflight[k]
	if !ok || f.GetVersion().GetSequence() != version.GetSequence() || f.GetVersion().GetBrokerEpoch() != version.GetBrokerEpoch() {
		o.mu.Unlock()
		return nil
	}
	delete(o.inflight, k)
	o.mu.Unlock()
	o.wake()
	return f
}

// Forget drops everything about an object (it is gone from kcp).
func (o *Outbox) Forget(key *ferryv1.ObjectKey) {
	k := KeyString(key)
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.inflight, k)
	if _, ok := o.pending[k]; ok {
		delete(o.pending, k)
		for i, q := range o.order {
			if q == k {
				o.order = append(o.order[:i], o.order[i+1:]...)
				break
			}
		}
	}
}

// Len is the number of pending and in-flight intents.
func (o *Outbox) Len() (pending, inflight int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.pending), len(o.inflight)
}

// Package admin keeps the broker's admin API's per-object records and builds
// its object views. The sync engine keeps no admin bookkeeping: Objects
// learns the engine's transitions as its Observer (broker/engine.Observer)
// and ObjectState reads the engine's own state through Source.
package admin

import (
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/protocol"
)

// Error sources of ObjectError.source.
const (
	errorSourceIntent   = "intent"
	errorSourceTooLarge = "too_large"
	errorSourceReport   = "report"
)

// Applied state sources of AppliedState.source.
const (
	appliedFromAck       = "ack"
	appliedFromInventory = "inventory"
)

// Objects keeps, per primary object (keyed with its UID), what the edge
// last reported about it. An entry goes when the edge confirms the copy's
// deletion. It implements the engine's Observer. Safe for concurrent use.
type Objects struct {
	// now is the clock of the records' times.
	now func() time.Time
	// known tells whether the broker syncs key's object: a refused report
	// makes a record only for those, so keys an edge makes up cannot grow
	// the records. (Inventory entries make records: a copy of an object
	// the broker does not hold is shown, and its record goes with the
	// deletion the broker then asks for.)
	known func(key *ferryv1.ObjectKey) bool

	mu   sync.Mutex
	byID map[string]*objectRecord
}

// NewObjects returns empty records of the objects known tells (nil: every
// key; see Objects.known), timed by now (nil: time.Now).
func NewObjects(known func(key *ferryv1.ObjectKey) bool, now func() time.Time) *Objects {
	if known == nil {
		known = func(*ferryv1.ObjectKey) bool { return true }
	}
	if now == nil {
		now = time.Now
	}
	return &Objects{known: known, now: now, byID: map[string]*objectRecord{}}
}

// objectRecord is what the edge last reported about one object.
type objectRecord struct {
	// operation and contentHash describe the last answered intent (not the
	// intent itself: its object would be held for every synced object),
	// version is its version as sent, answeredAt the time of the answer.
	// operation is empty before the first answer.
	operation, contentHash string
	version                *ferryv1.ObjectVersion
	answeredAt             time.Time
	// lastErr is the error of the latest answer or report; nil after a
	// success.
	lastErr *ferryv1.ObjectError
	// applied is what the edge holds, from an ack or its inventory.
	applied *ferryv1.AppliedState
	// local is where the copy is; nil when the edge reported none.
	local *ferryv1.LocalCopy
}

func (o *Objects) recordLocked(key *ferryv1.ObjectKey) *objectRecord {
	id := protocol.ObjectKeyString(key)
	rec, ok := o.byID[id]
	if !ok {
		rec = &objectRecord{}
		o.byID[id] = rec
	}
	return rec
}

// IntentAnswered records the edge's answer res to the primary intent in.
func (o *Objects) IntentAnswered(in *ferryv1.SyncIntent, res *ferryv1.IntentResult, _ time.Time) {
	if in.GetRelatedTo() != nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	now := o.now()
	rec := o.recordLocked(in.GetKey())
	rec.operation, rec.contentHash = protocol.OperationName(in), in.GetUpsert().GetContentHash()
	rec.version, rec.answeredAt = res.GetVersion(), now
	if ae := res.GetError(); ae != nil {
		rec.lastErr = &ferryv1.ObjectError{Source: errorSourceIntent, Error: ae, At: timestamppb.New(now)}
		return
	}
	rec.lastErr = nil
	if in.GetDelete() != nil {
		rec.local, rec.applied = nil, nil
		return
	}
	rec.applied = &ferryv1.AppliedState{
		ContentHash: in.GetUpsert().GetContentHash(), ResourceVersion: res.GetVersion().GetResourceVersion(),
		Source: appliedFromAck, ReportedAt: timestamppb.New(now),
	}
	if res.GetLocalName() != "" {
		rec.local = &ferryv1.LocalCopy{Namespace: res.GetLocalNamespace(), Name: res.GetLocalName(), ReportedAt: timestamppb.New(now)}
	}
}

// IntentTooLarge records that a primary intent was not sent for its size.
func (o *Objects) IntentTooLarge(in *ferryv1.SyncIntent, failure *ferryv1.ApplyError) {
	if in.GetRelatedTo() != nil || in.GetKey() == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.recordLocked(in.GetKey()).lastErr = &ferryv1.ObjectError{Source: errorSourceTooLarge, Error: failure, At: timestamppb.New(o.now())}
}

// ReportAnswered records the broker's answer res to a report of kind about
// key: a refusal is the object's last error; a success clears a report
// error, and a confirmed deletion forgets the object.
func (o *Objects) ReportAnswered(kind string, key *ferryv1.ObjectKey, res *ferryv1.ReportResult) {
	if key == nil {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	id := protocol.ObjectKeyString(key)
	switch rec, ok := o.byID[id]; {
	case res.GetError() != nil && !ok && !o.known(key):
		// Refused a report about an object it does not sync: no record.
	case res.GetError() != nil:
		o.recordLocked(key).lastErr = &ferryv1.ObjectError{Source: errorSourceReport, Error: res.GetError(), At: timestamppb.New(o.now())}
	case kind == protocol.ReportKindDeletion:
		delete(o.byID, id) // the copy is gone and the finalizer released
	case ok && rec.lastErr.GetSource() == errorSourceReport:
		rec.lastErr = nil
	}
}

// InventoryReceived records a chunk of the edge's inventory.
func (o *Objects) InventoryReceived(inv *ferryv1.Inventory) {
	o.mu.Lock()
	defer o.mu.Unlock()
	now := timestamppb.New(o.now())
	for _, e := range inv.GetEntries() {
		if e.GetKey() == nil {
			continue
		}
		rec := o.recordLocked(e.GetKey())
		rec.applied = &ferryv1.AppliedState{
			ContentHash: e.GetAppliedHash(), ResourceVersion: e.GetAppliedResourceVersion(),
			Source: appliedFromInventory, ReportedAt: now,
		}
		if e.GetLocalName() != "" {
			rec.local = &ferryv1.LocalCopy{Namespace: e.GetLocalNamespace(), Name: e.GetLocalName(), ReportedAt: now}
		}
	}
}

// The engine's transitions the records do not need (the metrics count them).

// Attached is not recorded.
func (*Objects) Attached() {}

// IntentSent is not recorded: the engine's outbox shows what is in flight.
func (*Objects) IntentSent(*ferryv1.SyncIntent) {}

// ReportReceived is not recorded: ReportAnswered records the outcome.
func (*Objects) ReportReceived(string) {}

// Resynced is not recorded: the engine's resync status shows it.
func (*Objects) Resynced(time.Time, int) {}

// ResyncObject is not recorded.
func (*Objects) ResyncObject(bool) {}

// get returns a copy of key's record, false when there is none.
func (o *Objects) get(key *ferryv1.ObjectKey) (objectRecord, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	rec, ok := o.byID[protocol.ObjectKeyString(key)]
	if !ok {
		return objectRecord{}, false
	}
	return *rec, true
}

// Len is the number of objects recorded.
func (o *Objects) Len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.byID)
}

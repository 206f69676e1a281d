package engine

import (
	"time"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/replication"
)

// Observer learns the engine's transitions. The engine keeps no records for
// anyone else: the admin API's per-object records (broker/admin.Objects)
// and the metrics (pkg/metrics.Export) are Observers, and Observers fans out
// to several. The engine calls it from its goroutines, concurrently; an
// implementation must be safe for concurrent use and must not block.
type Observer interface {
	replication.ResyncObserver
	// Attached: an edge stream attached to the engine.
	Attached()
	// IntentSent: in went to the edge.
	IntentSent(in *ferryv1.SyncIntent)
	// IntentAnswered: the edge answered in, queued at queued, with res.
	// Stale answers (answered already, or of another stream) are not
	// observed.
	IntentAnswered(in *ferryv1.SyncIntent, res *ferryv1.IntentResult, queued time.Time)
	// IntentTooLarge: in was not sent, being larger than the edge accepts;
	// failure is what the kcp object's Event says.
	IntentTooLarge(in *ferryv1.SyncIntent, failure *ferryv1.ApplyError)
	// InventoryReceived: a chunk of the edge's inventory.
	InventoryReceived(inv *ferryv1.Inventory)
	// ReportReceived: an edge report of kind (status, deletion, resend,
	// related).
	ReportReceived(kind string)
	// ReportAnswered: the broker answered the edge's report of kind about
	// the primary object key with res (written, or refused for good).
	ReportAnswered(kind string, key *ferryv1.ObjectKey, res *ferryv1.ReportResult)
}

// Observers returns an Observer that passes every call to each of obs in
// turn; nil ones are left out.
func Observers(obs ...Observer) Observer {
	out := make(fanout, 0, len(obs))
	for _, o := range obs {
		if o != nil {
			out = append(out, o)
		}
	}
	return out
}

// fanout passes every call to each of its Observers.
type fanout []Observer

func (f fanout) Attached() {
	for _, o := range f {
		o.Attached()
	}
}

func (f fanout) IntentSent(in *ferryv1.SyncIntent) {
	for _, o := range f {
		o.IntentSent(in)
	}
}

func (f fanout) IntentAnswered(in *ferryv1.SyncIntent, res *ferryv1.IntentResult, queued time.Time) {
	for _, o := range f {
		o.IntentAnswered(in, res, queued)
	}
}

func (f fanout) IntentTooLarge(in *ferryv1.SyncIntent, failure *ferryv1.ApplyError) {
	for _, o := range f {
		o.IntentTooLarge(in, failure)
	}
}

func (f fanout) InventoryReceived(inv *ferryv1.Inventory) {
	for _, o := range f {
		o.InventoryReceived(inv)
	}
}

func (f fanout) ReportReceived(kind string) {
	for _, o := range f {
		o.ReportReceived(kind)
	}
}

func (f fanout) ReportAnswered(kind string, key *ferryv1.ObjectKey, res *ferryv1.ReportResult) {
	for _, o := range f {
		o.ReportAnswered(kind, key, res)
	}
}

func (f fanout) Resynced(since time.Time, compared int) {
	for _, o := range f {
		o.Resynced(since, compared)
	}
}

func (f fanout) ResyncObject(unchanged bool) {
	for _, o := range f {
		o.ResyncObject(unchanged)
	}
}

package replication

import (
	"time"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// Observer learns the engine's transitions. The engine keeps no records for
// anyone else: the admin API's record of each object (edge/objectlog.Log)
// and the metrics (pkg/metrics.Edge) are Observers, and Observers fans out
// to several. The engine calls it from its goroutines, concurrently; an
// implementation must be safe for concurrent use and must not block.
type Observer interface {
	// IntentReceived: the broker sent in.
	IntentReceived(in *ferryv1.SyncIntent)
	// IntentDone: the engine answered in with res.
	IntentDone(in *ferryv1.SyncIntent, res *ferryv1.IntentResult)
	// ReportQueued: the report m was queued for the broker.
	ReportQueued(m *ferryv1.ConnectRequest)
	// ReportAnswered: the broker answered a report queued at queued.
	ReportAnswered(r *ferryv1.ReportResult, queued time.Time)
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

func (f fanout) IntentReceived(in *ferryv1.SyncIntent) {
	for _, o := range f {
		o.IntentReceived(in)
	}
}

func (f fanout) IntentDone(in *ferryv1.SyncIntent, res *ferryv1.IntentResult) {
	for _, o := range f {
		o.IntentDone(in, res)
	}
}

func (f fanout) ReportQueued(m *ferryv1.ConnectRequest) {
	for _, o := range f {
		o.ReportQueued(m)
	}
}

func (f fanout) ReportAnswered(r *ferryv1.ReportResult, queued time.Time) {
	for _, o := range f {
		o.ReportAnswered(r, queued)
	}
}

// observer is Options.Observer, or one that observes nothing.
func (e *Engine) observer() Observer {
	if e.opts.Observer == nil {
		return fanout(nil)
	}
	return e.opts.Observer
}

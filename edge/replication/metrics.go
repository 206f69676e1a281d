package replication

import "github.com/ferry-dev/ferry/pkg/metrics"

// MetricsState describes the engine for the edge's state gauges: the report
// outbox and the local copies per published resource.
func (e *Engine) MetricsState() metrics.EdgeEngineState {
	st := e.reports.Stats()
	out := metrics.EdgeEngineState{Pending: st.Pending, InFlight: st.InFlight, OldestInFlight: st.OldestInFlight, Objects: map[string]int{}}
	e.mu.Lock()
	defer e.mu.Unlock()
	// The informers' stores: every copy, also those a restarted edge did
	// not need to apply again (the admin view counts the same way).
	for name, w := range e.watches {
		out.Objects[name] = len(w.store.ListKeys())
	}
	return out
}

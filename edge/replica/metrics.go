package replica

import "github.com/ferry-dev/ferry/pkg/metrics"

// MetricsState describes the engine for the edge's state gauges: the report
// outbox and the local copies per published resource.
func (e *Engine) MetricsState() metrics.EdgeEngineState {
	st := e.reports.Stats()
	out := metrics.EdgeEngineState{Pending: st.Pending, InFlight: st.InFlight, OldestInFlight: st.OldestInFlight, Objects: map[string]int{}}
	e.mu.Lock()
	defer e.mu.Unlock()
	for name := range e.published {
		out.Objects[name] = 0
	}
	for _, c := range e.applied {
		out.Objects[c.intent.GetPublishedResource()]++
	}
	return out
}

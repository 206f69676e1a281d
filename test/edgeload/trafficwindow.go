package edgeload

import (
	"slices"
	"time"
)

// Traffic is the intent and report traffic of the steady window, counted
// at the simulated edges.
type Traffic struct {
	// Edges publish a CRD each, bound in one consumer workspace.
	Edges int `json:"edges"`
	// TargetObjectsPerSecond is the generator's write rate across them.
	TargetObjectsPerSecond float64 `json:"targetObjectsPerSecond"`
	// SetupSeconds is the time from the cold start's end until every
	// traffic edge's CRD was published and bound.
	SetupSeconds float64 `json:"setupSeconds"`
	// FirstIntentsSeconds is the time from the generator's first write
	// until every traffic edge received an intent (the broker syncing
	// the newly bound exports); the window starts after it.
	FirstIntentsSeconds float64 `json:"firstIntentsSeconds"`
	// Seconds is the window.
	Seconds float64 `json:"seconds"`
	// Writes are the generator's creates and updates in kcp in the
	// window; WriteErrors those kcp refused or failed.
	Writes      int64 `json:"writes"`
	WriteErrors int64 `json:"writeErrors"`
	// Counts are the edges' over the window.
	Counts TrafficCounts `json:"counts"`
	// Per second of the window.
	IntentsPerSecond       float64 `json:"intentsPerSecond"`
	ReportsPerSecond       float64 `json:"reportsPerSecond"`
	ReportResultsPerSecond float64 `json:"reportResultsPerSecond"`
	// RoundTrips are the intents that carried a new state, each measured
	// from the generator's write (its start) to the edge receiving it.
	RoundTrips          int     `json:"roundTrips"`
	RoundTripP50Seconds float64 `json:"roundTripP50Seconds"`
	RoundTripP99Seconds float64 `json:"roundTripP99Seconds"`
	RoundTripMaxSeconds float64 `json:"roundTripMaxSeconds"`
	// PendingReports are the reports unanswered at the window's end.
	PendingReports int `json:"pendingReports"`
}

// TrafficMark is the traffic edges' counts at the start of a window.
type TrafficMark struct {
	At     time.Time
	counts TrafficCounts
}

// MarkTraffic records the traffic edges' counts now and drops the round
// trips measured so far: the window's are those after the mark.
func (f *Fleet) MarkTraffic() TrafficMark {
	m := TrafficMark{At: time.Now()}
	for _, e := range f.edges {
		m.counts = m.counts.add(e.TrafficCounts())
		e.TakeRoundTrips()
	}
	return m
}

// TrafficSince is the traffic from m until now (Writes, WriteErrors and
// the setup are the generator's to fill in).
func (f *Fleet) TrafficSince(m TrafficMark) Traffic {
	t := Traffic{Seconds: time.Since(m.At).Seconds()}
	var now TrafficCounts
	var trips []time.Duration
	for _, e := range f.edges {
		if !e.IsTrafficEdge() {
			continue
		}
		t.Edges++
		now = now.add(e.TrafficCounts())
		trips = append(trips, e.TakeRoundTrips()...)
		t.PendingReports += e.PendingReports()
	}
	t.Counts = now.sub(m.counts)
	if t.Seconds > 0 {
		t.IntentsPerSecond = float64(t.Counts.Intents) / t.Seconds
		t.ReportsPerSecond = float64(t.Counts.Reports) / t.Seconds
		t.ReportResultsPerSecond = float64(t.Counts.ReportResults) / t.Seconds
	}
	if len(trips) > 0 {
		slices.Sort(trips)
		t.RoundTrips = len(trips)
		t.RoundTripP50Seconds = percentile(trips, 0.50).Seconds()
		t.RoundTripP99Seconds = percentile(trips, 0.99).Seconds()
		t.RoundTripMaxSeconds = trips[len(trips)-1].Seconds()
	}
	return t
}

// TrafficEdges are the edges that publish and answer intents.
func (f *Fleet) TrafficEdges() []*Edge {
	var out []*Edge
	for _, e := range f.edges {
		if e.IsTrafficEdge() {
			out = append(out, e)
		}
	}
	return out
}

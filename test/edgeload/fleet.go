package edgeload

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"
)

// Fleet is the simulated edges of one run.
type Fleet struct {
	edges []*Edge
}

// NewFleet groups edges.
func NewFleet(edges []*Edge) *Fleet { return &Fleet{edges: edges} }

// Len is the number of edges.
func (f *Fleet) Len() int { return len(f.edges) }

// Connected counts the edges whose stream the broker accepted and that
// still runs.
func (f *Fleet) Connected() int {
	n := 0
	for _, e := range f.edges {
		if e.Connected() {
			n++
		}
	}
	return n
}

// Start starts every edge at once (no spreading: the cold start of a
// broker's whole fleet, as after a network partition heals).
func (f *Fleet) Start(ctx context.Context) {
	for _, e := range f.edges {
		e.Start(ctx)
	}
}

// Stop stops every edge, in parallel, and waits for them.
func (f *Fleet) Stop() {
	var wg sync.WaitGroup
	for _, e := range f.edges {
		wg.Go(e.Stop)
	}
	wg.Wait()
}

// Mark is the state of every edge at the start of a wave, to compare the
// wave's end with.
type Mark struct {
	At       time.Time
	accepted []int64
	dials    []int64
}

// Mark records every edge's counters now.
func (f *Fleet) Mark() Mark {
	m := Mark{At: time.Now(), accepted: make([]int64, len(f.edges)), dials: make([]int64, len(f.edges))}
	for i, e := range f.edges {
		m.accepted[i], m.dials[i] = e.Accepted(), e.Dials()
	}
	return m
}

// Drop ends every edge's stream at the same moment (the edges' processes
// "restart": their connections close) and starts them all again at once,
// without any delay, which is the worst case for the broker. It returns the
// mark the reconnect wave is measured from.
func (f *Fleet) Drop(ctx context.Context) Mark {
	f.Stop()
	m := f.Mark()
	f.Start(ctx)
	return m
}

// Wave is how a connect wave went: every edge from a mark until the broker
// accepted it again.
type Wave struct {
	Name string `json:"name"`
	// Edges in the wave; Accepted of them were accepted before the
	// timeout.
	Edges    int `json:"edges"`
	Accepted int `json:"accepted"`
	// Seconds from the mark to the last acceptance.
	Seconds float64 `json:"seconds"`
	// HandshakesPerSecond is Accepted / Seconds.
	HandshakesPerSecond float64 `json:"handshakesPerSecond"`
	// Latency per edge, from the mark to its acceptance.
	P50Seconds float64 `json:"p50Seconds"`
	P99Seconds float64 `json:"p99Seconds"`
	MaxSeconds float64 `json:"maxSeconds"`
	// Attempts are the connection attempts (dials) of every edge in the
	// wave; FailedAttempts those the broker did not accept (refused,
	// timed out or failed), MaxAttempts the most of one edge.
	Attempts       int64 `json:"attempts"`
	FailedAttempts int64 `json:"failedAttempts"`
	MaxAttempts    int64 `json:"maxAttempts"`
	// OverCap counts the edges accepted later than Cap after the mark:
	// kept out longer than the reconnect backoff cap.
	CapSeconds float64 `json:"capSeconds"`
	OverCap    int     `json:"overCap"`
	// Refusals are the broker's handshake refusals during the wave, by
	// reason (its ferry_broker_handshake_refusals_total).
	Refusals map[string]float64 `json:"refusals,omitempty"`
	// BrokerCPUSeconds is the CPU time the broker used during the wave
	// (a restarted broker's: since its start).
	BrokerCPUSeconds float64 `json:"brokerCPUSeconds"`
	// KCPRequests are the broker's requests to kcp during the wave (a
	// restarted broker's: since its start, its start-up reads and Lease
	// writes included).
	KCPRequests float64 `json:"kcpRequests"`
}

// Wait waits until every edge was accepted after m (or timeout passes) and
// returns the wave's figures; capDelay is the reconnect backoff cap.
func (f *Fleet) Wait(ctx context.Context, name string, m Mark, capDelay, timeout time.Duration) (Wave, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	t := time.NewTicker(50 * time.Millisecond)
	defer t.Stop()
	for !f.acceptedSince(m) {
		select {
		case <-ctx.Done():
			return f.wave(name, m, capDelay), fmt.Errorf("%s: %d of %d edges accepted after %s", name, f.countAcceptedSince(m), len(f.edges), timeout)
		case <-t.C:
		}
	}
	return f.wave(name, m, capDelay), nil
}

func (f *Fleet) acceptedSince(m Mark) bool { return f.countAcceptedSince(m) == len(f.edges) }

func (f *Fleet) countAcceptedSince(m Mark) int {
	n := 0
	for i, e := range f.edges {
		if e.Accepted() > m.accepted[i] {
			n++
		}
	}
	return n
}

func (f *Fleet) wave(name string, m Mark, capDelay time.Duration) Wave {
	w := Wave{Name: name, Edges: len(f.edges), CapSeconds: capDelay.Seconds()}
	var latencies []time.Duration
	for i, e := range f.edges {
		dials := e.Dials() - m.dials[i]
		w.Attempts += dials
		w.MaxAttempts = max(w.MaxAttempts, dials)
		accepted := e.Accepted() - m.accepted[i]
		if accepted <= 0 {
			w.FailedAttempts += dials
			continue
		}
		w.Accepted++
		w.FailedAttempts += dials - accepted
		l := max(e.AcceptedAt().Sub(m.At), 0)
		latencies = append(latencies, l)
		if l > capDelay {
			w.OverCap++
		}
	}
	if len(latencies) == 0 {
		return w
	}
	slices.Sort(latencies)
	last := latencies[len(latencies)-1]
	w.Seconds = last.Seconds()
	if w.Seconds > 0 {
		w.HandshakesPerSecond = float64(w.Accepted) / w.Seconds
	}
	w.P50Seconds = percentile(latencies, 0.50).Seconds()
	w.P99Seconds = percentile(latencies, 0.99).Seconds()
	w.MaxSeconds = last.Seconds()
	return w
}

// percentile of sorted (nearest rank).
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"k8s.io/client-go/rest"

	"github.com/ferry-dev/ferry/test/edgeload"
	"github.com/ferry-dev/ferry/test/framework"
)

// startTraffic waits for the traffic edges' CRDs, binds them and starts
// writing objects.
func startTraffic(ctx context.Context, cfg *rest.Config, exports layout, fleet *edgeload.Fleet, o options,
	step func(string, ...any)) (*trafficRun, error) {
	start := time.Now()
	step("traffic: %d edges publish a CRD each; binding them in %s", o.trafficEdges, consumerWorkspace)
	w, err := setupTraffic(ctx, cfg, exports.edgeWorkspaces(o.trafficEdges), fleet.TrafficEdges(), 5*time.Minute)
	if err != nil {
		return nil, err
	}
	r := &trafficRun{fleet: fleet, writer: w, rate: o.trafficRate, setup: time.Since(start), done: make(chan struct{})}
	step("traffic: bound in %.1fs; writing %g objects/s", r.setup.Seconds(), o.trafficRate)
	wctx, cancel := context.WithCancel(ctx)
	r.cancel = cancel
	go func() {
		defer close(r.done)
		w.run(wctx, o.trafficRate)
	}()
	// The window measures steady traffic, not the broker catching up:
	// it waits until the broker syncs every traffic edge's objects.
	writing := time.Now()
	if err := waitFirstIntents(ctx, fleet.TrafficEdges(), 5*time.Minute); err != nil {
		r.stop()
		return nil, err
	}
	r.firstIntents = time.Since(writing)
	step("traffic: every traffic edge received its first intent %.1fs after the first write", r.firstIntents.Seconds())
	return r, nil
}

// waitFirstIntents waits until every edge received an intent.
func waitFirstIntents(ctx context.Context, edges []*edgeload.Edge, timeout time.Duration) error {
	return framework.Eventually(ctx, timeout, 100*time.Millisecond, func(context.Context) (bool, string) {
		var waiting []string
		for _, e := range edges {
			if e.TrafficCounts().Intents == 0 {
				waiting = append(waiting, e.Name())
			}
		}
		if len(waiting) > 0 {
			return false, fmt.Sprintf("no intent yet at %d traffic edges (%s)", len(waiting), strings.Join(waiting[:min(len(waiting), 5)], ", "))
		}
		return true, ""
	})
}

// trafficRun is the generator writing objects, measured over a window.
type trafficRun struct {
	fleet  *edgeload.Fleet
	writer *writer
	rate   float64
	setup  time.Duration
	// firstIntents is the time from the first write until every edge
	// received an intent.
	firstIntents time.Duration
	cancel       context.CancelFunc
	done         chan struct{}

	edges          edgeload.TrafficMark
	writes, errors int64
}

// mark starts the window.
func (r *trafficRun) mark() {
	r.edges = r.fleet.MarkTraffic()
	r.writes, r.errors = r.writer.counts()
}

// stop ends the window and the writes, and returns the window's traffic.
func (r *trafficRun) stop() *edgeload.Traffic {
	writes, errs := r.writer.counts()
	t := r.fleet.TrafficSince(r.edges)
	r.cancel()
	<-r.done
	t.TargetObjectsPerSecond, t.SetupSeconds, t.FirstIntentsSeconds = r.rate, r.setup.Seconds(), r.firstIntents.Seconds()
	t.Writes, t.WriteErrors = writes-r.writes, errs-r.errors
	return &t
}

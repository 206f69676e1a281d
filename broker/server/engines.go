package server

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/ferry-dev/ferry/broker/admin"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/engine"
	"github.com/ferry-dev/ferry/broker/ownership"
	"github.com/ferry-dev/ferry/pkg/logging"
)

// engines holds the long-lived sync engine of every APIExport an edge has
// served. An engine outlives its edge's streams; it stops after idleTimeout
// without a stream (its watches and caches are released then), when the
// edge's configured name changes (its finalizer name changes with it), and
// when the broker shuts down. Safe for concurrent use.
type engines struct {
	newEngine   func(config.APIExportRef, string, string) served
	idleTimeout time.Duration
	// clock runs the idle timers.
	clock clock.WithDelayedExecution
	log   logr.Logger

	mu      sync.Mutex
	ctx     context.Context // set by start; engines run under it
	wg      sync.WaitGroup
	running map[config.APIExportRef]*runningEngine
}

// served is a sync engine with the admin API's records of its objects,
// which learn them as the engine's Observer.
type served struct {
	*engine.Engine
	objects *admin.Objects
}

type runningEngine struct {
	e        *engine.Engine
	objects  *admin.Objects
	cancel   context.CancelFunc
	done     chan struct{}
	attached bool
	idle     clock.Timer
	// held is the ownership the engine runs under (nil: single broker).
	held *ownership.Held
}

func newEngines(idleTimeout time.Duration, clk clock.WithDelayedExecution, log logr.Logger, newEngine func(export config.APIExportRef, agent, logicalCluster string) served) *engines {
	return &engines{newEngine: newEngine, idleTimeout: idleTimeout, clock: clk, log: log, running: map[config.APIExportRef]*runningEngine{}}
}

// start sets the context engines run under.
func (r *engines) start(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ctx = ctx
}

// wait returns when every engine has stopped (after start's ctx ended).
func (r *engines) wait() { r.wg.Wait() }

// attach returns export's engine for agent, starting one when needed, and
// marks it attached; release marks it detached and starts its idle timer.
//
// held is this replica's ownership of export when several replicas share
// the exports (nil for a single broker): a new engine runs only while it
// is held — it stops when the ownership is lost, before another replica
// may start one — and releases it once its writers have stopped (idle, or
// a new edge name).
func (r *engines) attach(sink engine.Sink, export config.APIExportRef, agent, logicalCluster string, held *ownership.Held) (e *engine.Engine, release func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	run, ok := r.running[export]
	if ok && run.e.EdgeName() != agent {
		r.log.Info("edge name (finalizer) changed; starting a new sync engine", logging.KeyExport, export.String(),
			"previousName", run.e.EdgeName(), "name", agent)
		r.stopLocked(export, run)
		<-run.done // its writers stop before another engine starts
		ok = false
	}
	if ok && run.held != held {
		// Ownership lost and taken again since the engine started: the old
		// engine is stopping; a new one runs under the new ownership.
		r.log.Info("ownership of the APIExport renewed; starting a new sync engine", logging.KeyExport, export.String())
		r.stopLocked(export, run)
		<-run.done
		ok = false
	}
	if !ok {
		ctx, cancel := context.WithCancel(r.ctx)
		eng := r.newEngine(export, agent, logicalCluster)
		run = &runningEngine{e: eng.Engine, objects: eng.objects, cancel: cancel, done: make(chan struct{}), held: held}
		r.running[export] = run
		r.wg.Add(1)
		lost := func() bool { return false }
		if held != nil {
			lost = context.AfterFunc(held.Context(), func() {
				r.mu.Lock()
				defer r.mu.Unlock()
				if r.running[export] == run {
					if r.ctx.Err() == nil { // not the broker shutting down
						r.log.Info("this replica lost the ownership of the APIExport; stopping its sync engine", logging.KeyExport, export.String())
					}
					r.stopLocked(export, run)
				}
			})
		}
		go func() {
			defer r.wg.Done()
			defer close(run.done)
			run.e.Run(ctx)
			lost()
			if held != nil {
				// Only now that nothing writes for the export: another
				// replica may take it over at once.
				held.Release()
			}
		}()
	}
	if run.idle != nil {
		run.idle.Stop()
		run.idle = nil
	}
	run.attached = true
	detach := run.e.Attach(sink)
	return run.e, func() {
		detach()
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.running[export] != run {
			return
		}
		run.attached = false
		ctx := r.ctx
		run.idle = r.clock.AfterFunc(r.idleTimeout, func() {
			if ctx.Err() != nil {
				return // shutting down: the context stops the engine
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.running[export] == run && !run.attached {
				r.log.Info("no edge for a while; stopping the sync engine", logging.KeyExport, export.String(), "idle", r.idleTimeout.String())
				run.idle = nil // fired: nothing to stop (a clock may run this under its own lock)
				r.stopLocked(export, run)
			}
		})
	}
}

// stopLocked cancels an engine and forgets it; its goroutines finish on
// their own (wait joins them).
func (r *engines) stopLocked(export config.APIExportRef, run *runningEngine) {
	if run.idle != nil {
		run.idle.Stop()
	}
	run.cancel()
	delete(r.running, export)
}

// done returns a channel closed once export's running engine has stopped
// (nil when none runs).
func (r *engines) done(export config.APIExportRef) <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if run, ok := r.running[export]; ok {
		return run.done
	}
	return nil
}

// served returns export's running engine with the admin API's records of
// its objects.
func (r *engines) served(export config.APIExportRef) (served, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	run, ok := r.running[export]
	if !ok {
		return served{}, false
	}
	return served{Engine: run.e, objects: run.objects}, true
}

// get returns export's running engine.
func (r *engines) get(export config.APIExportRef) (*engine.Engine, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	run, ok := r.running[export]
	if !ok {
		return nil, false
	}
	return run.e, true
}

// unreachableEndpoints lists, sorted, the virtual workspace endpoints (kcp
// shards) a running engine cannot reach, each with its APIExport and error.
func (r *engines) unreachableEndpoints() []string {
	r.mu.Lock()
	runs := make(map[config.APIExportRef]*engine.Engine, len(r.running))
	for export, run := range r.running {
		runs[export] = run.e
	}
	r.mu.Unlock()
	var out []string
	for export, e := range runs {
		for _, ep := range e.Endpoints() {
			if !ep.Reachable {
				out = append(out, fmt.Sprintf("%s: %s unreachable since %s (%s)", export, ep.URL, ep.Since.UTC().Format(time.RFC3339), ep.LastError))
			}
		}
	}
	slices.Sort(out)
	return out
}

package server

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	clocktesting "k8s.io/utils/clock/testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/engine"
	"github.com/ferry-dev/ferry/broker/kcp"
)

// idleWatcher never reports a virtual workspace: the engines under test
// make no call to kcp.
type idleWatcher struct{}

func (idleWatcher) WatchVirtualWorkspace(ctx context.Context, _ config.APIExportRef, _ func(kcp.VirtualWorkspace)) {
	<-ctx.Done()
}

type discardSink struct{}

func (discardSink) Control(*ferryv1.ConnectResponse) error { return nil }

// testEngines returns engines whose idle timers run on clk.
func testEngines(t *testing.T, clk *clocktesting.FakeClock, idle time.Duration) *engines {
	t.Helper()
	r := newEngines(idle, clk, logr.Discard(), func(export config.APIExportRef, agent, lc string) served {
		return served{Engine: engine.New(engine.Options{Export: export, EdgeName: agent, LogicalCluster: lc, Watcher: idleWatcher{},
			Window: 8, Log: logr.Discard()})}
	})
	ctx, cancel := context.WithCancel(context.Background())
	r.start(ctx)
	t.Cleanup(func() {
		cancel()
		r.wait() // every engine's goroutines are joined
	})
	return r
}

var testExport = config.APIExportRef{Workspace: "root:team", Name: "things"}

// TestEngineOutlivesStreamsUntilIdle: a detached engine serves the next
// stream; one without a stream for the idle timeout stops.
func TestEngineOutlivesStreamsUntilIdle(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	r := testEngines(t, clk, time.Minute)
	first, release := r.attach(discardSink{}, testExport, "nora", "lc", nil)
	release()
	clk.Step(30 * time.Second)
	again, release := r.attach(discardSink{}, testExport, "nora", "lc", nil)
	if again != first {
		t.Fatal("a reconnect within the idle timeout got a new engine")
	}
	clk.Step(2 * time.Minute) // attached: the idle timer does not run
	if e, ok := r.get(testExport); !ok || e != first {
		t.Fatal("an attached engine was stopped")
	}
	release()
	done := r.done(testExport)
	clk.Step(59 * time.Second)
	if _, ok := r.get(testExport); !ok {
		t.Fatal("stopped before the idle timeout")
	}
	clk.Step(time.Second)
	if _, ok := r.get(testExport); ok {
		t.Fatal("not stopped after the idle timeout")
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("the idle engine's goroutines did not stop")
	}
	next, release := r.attach(discardSink{}, testExport, "nora", "lc", nil)
	defer release()
	if next == first {
		t.Fatal("a stopped engine was reused")
	}
}

// TestAgentChangeReplacesTheEngine: the finalizer name follows the agent
// name, so a new agent name gets a new engine, and the old one has stopped
// (its writers joined) before the new one is returned.
func TestAgentChangeReplacesTheEngine(t *testing.T) {
	r := testEngines(t, clocktesting.NewFakeClock(time.Now()), time.Hour)
	old, release := r.attach(discardSink{}, testExport, "nora", "lc", nil)
	release()
	oldDone := r.done(testExport)
	renamed, release := r.attach(discardSink{}, testExport, "otto", "lc", nil)
	defer release()
	if renamed == old || renamed.EdgeName() != "otto" {
		t.Fatalf("want a new engine for agent otto, got agent %q (same: %v)", renamed.EdgeName(), renamed == old)
	}
	select {
	case <-oldDone:
	default:
		t.Fatal("the old engine was still running when the new one was returned")
	}
}

package server

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/engine"
)

// idleWatcher never reports a virtual workspace: the engines under test
// make no call to kcp.
type idleWatcher struct{}

func (idleWatcher) WatchVirtualWorkspace(ctx context.Context, _ config.APIExportRef, _ func(string)) {
	<-ctx.Done()
}

type discardSink struct{}

func (discardSink) Control(*ferryv1.ConnectResponse) error { return nil }

func testEngines(t *testing.T, idle time.Duration) *engines {
	t.Helper()
	r := newEngines(idle, logr.Discard(), func(export config.APIExportRef, agent, lc string) *engine.Engine {
		return engine.New(engine.Options{Export: export, EdgeName: agent, LogicalCluster: lc, Watcher: idleWatcher{},
			Window: 8, Log: logr.Discard()})
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

// waitStopped waits until testExport has no running engine.
func waitStopped(t *testing.T, r *engines) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if _, ok := r.get(testExport); !ok {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("the engine did not stop")
}

// TestEngineOutlivesStreamsUntilIdle: a detached engine serves the next
// stream; one without a stream for the idle timeout stops.
func TestEngineOutlivesStreamsUntilIdle(t *testing.T) {
	r := testEngines(t, 200*time.Millisecond)
	first, release := r.attach(discardSink{}, testExport, "nora", "lc")
	release()
	again, release := r.attach(discardSink{}, testExport, "nora", "lc")
	if again != first {
		t.Fatal("a reconnect within the idle timeout got a new engine")
	}
	time.Sleep(400 * time.Millisecond) // attached: the idle timer does not run
	if e, ok := r.get(testExport); !ok || e != first {
		t.Fatal("an attached engine was stopped")
	}
	release()
	waitStopped(t, r)
	next, release := r.attach(discardSink{}, testExport, "nora", "lc")
	defer release()
	if next == first {
		t.Fatal("a stopped engine was reused")
	}
}

// TestAgentChangeReplacesTheEngine: the finalizer name follows the agent
// name, so a new agent name gets a new engine, and the old one has stopped
// (its writers joined) before the new one is returned.
func TestAgentChangeReplacesTheEngine(t *testing.T) {
	r := testEngines(t, time.Hour)
	old, release := r.attach(discardSink{}, testExport, "nora", "lc")
	release()
	r.mu.Lock()
	oldRun := r.running[testExport]
	r.mu.Unlock()
	renamed, release := r.attach(discardSink{}, testExport, "otto", "lc")
	defer release()
	if renamed == old || renamed.EdgeName() != "otto" {
		t.Fatalf("want a new engine for agent otto, got agent %q (same: %v)", renamed.EdgeName(), renamed == old)
	}
	select {
	case <-oldRun.done:
	default:
		t.Fatal("the old engine was still running when the new one was returned")
	}
}

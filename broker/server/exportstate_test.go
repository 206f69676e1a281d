package server

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/kcp"
)

// countingResolver counts Resolve calls (the handshake's kcp reads).
type countingResolver struct {
	fakeResolver
	calls *atomic.Int32
}

func (c countingResolver) Resolve(ctx context.Context, ref config.APIExportRef) (kcp.ExportState, error) {
	c.calls.Add(1)
	return c.fakeResolver.Resolve(ctx, ref)
}

// TestReconnectWhileTheEngineRunsReadsNoKCP: the first handshake of an
// export resolves it in kcp; a reconnect while its engine runs takes the
// export's state from the engine (its watch of the endpoint slice keeps it
// current), so a reconnect storm of edges costs kcp no reads.
func TestReconnectWhileTheEngineRunsReadsNoKCP(t *testing.T) {
	calls := &atomic.Int32{}
	resolver := countingResolver{fakeResolver: fakeResolver{states: map[config.APIExportRef]kcp.ExportState{exportA: {LogicalCluster: "abc"}}}, calls: calls}
	tb := startTestBrokerWith(t, resolver, &echoApplier{}, func(o *Options, _ string) { o.EngineIdleTimeout = time.Minute })
	first, _, err := connect(t, tb.dial(t, "edge-a"), helloRequest(validHello()))
	if err != nil {
		t.Fatal(err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("the first handshake resolved the export %d times, want 1", n)
	}
	if err := first.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := first.Recv(); err != nil {
			break
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, resp, err := connect(t, tb.dial(t, "edge-a"), helloRequest(validHello()))
		if err == nil && resp.GetHello() != nil {
			if got := resp.GetHello().GetExport().GetLogicalCluster(); got != "abc" {
				t.Errorf("the reconnect's export status names logical cluster %q, want abc", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("reconnect refused: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("the export was resolved in kcp %d times, want once: a reconnect while its engine runs reads nothing", n)
	}
}

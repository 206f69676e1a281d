package server

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/kcp"
)

// countingResolver counts Resolve calls (the handshake's kcp reads) and
// reports vw from its watch of the endpoint slice.
type countingResolver struct {
	fakeResolver
	calls *atomic.Int32
	vw    kcp.VirtualWorkspace
}

func (c countingResolver) Resolve(ctx context.Context, ref config.APIExportRef) (kcp.ExportState, error) {
	c.calls.Add(1)
	return c.fakeResolver.Resolve(ctx, ref)
}

func (c countingResolver) WatchVirtualWorkspace(ctx context.Context, _ config.APIExportRef, onChange func(kcp.VirtualWorkspace)) {
	onChange(c.vw)
	<-ctx.Done()
}

// TestReconnectWhileTheEngineRunsReadsNoKCP: the first handshake of an
// export resolves it in kcp; a reconnect while its engine runs takes the
// export's state from the engine (its watch of the endpoint slice keeps it
// current), so a reconnect storm of edges costs kcp no reads — also for an
// export no workspace binds yet (a slice without endpoints). Without the
// slice (the export may be gone) the export is resolved again.
func TestReconnectWhileTheEngineRunsReadsNoKCP(t *testing.T) {
	for _, tc := range []struct {
		name         string
		vw           kcp.VirtualWorkspace
		wantResolves int32
	}{
		{name: "endpoints", vw: kcp.VirtualWorkspace{Exists: true, URLs: []string{"https://kcp.example/services/apiexport/abc/a.ferry.dev"}}, wantResolves: 1},
		{name: "a slice without endpoints", vw: kcp.VirtualWorkspace{Exists: true}, wantResolves: 1},
		{name: "no slice", vw: kcp.VirtualWorkspace{}, wantResolves: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := &atomic.Int32{}
			resolver := countingResolver{fakeResolver: fakeResolver{states: map[config.APIExportRef]kcp.ExportState{exportA: {LogicalCluster: "abc"}}}, calls: calls, vw: tc.vw}
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
			if n := calls.Load(); n != tc.wantResolves {
				t.Errorf("the export was resolved in kcp %d times, want %d", n, tc.wantResolves)
			}
		})
	}
}

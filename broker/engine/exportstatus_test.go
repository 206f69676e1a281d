package engine

import (
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/replication"
)

// TestExportStatusNamesUnreachableEndpoints: the edge and ListEdges see
// every virtual workspace endpoint, and waiting_for names each one the
// broker cannot reach, with its error.
func TestExportStatusNamesUnreachableEndpoints(t *testing.T) {
	ref := config.APIExportRef{Workspace: "root:org", Name: "x.example.com"}
	const a, b = "https://shard-a/vw", "https://shard-b/vw"
	since := time.Unix(1700000000, 0)
	tests := []struct {
		name          string
		urls          []string
		states        []replication.EndpointState
		wantReady     bool
		wantWaiting   []string // substrings; none: nothing waited for
		wantReachable []bool   // per URL
	}{
		{name: "no endpoint yet", wantWaiting: []string{"APIExportEndpointSlice root:org/x.example.com"}},
		{name: "two reachable", urls: []string{a, b}, states: []replication.EndpointState{{URL: a, Reachable: true, Since: since}, {URL: b, Reachable: true, Since: since}},
			wantReady: true, wantReachable: []bool{true, true}},
		{name: "one unreachable", urls: []string{a, b},
			states:    []replication.EndpointState{{URL: a, Reachable: true, Since: since}, {URL: b, LastError: "connection refused", Since: since}},
			wantReady: true, wantWaiting: []string{b + " (connection refused)"}, wantReachable: []bool{true, false}},
		// Listed by kcp, not watched yet (no engine state): nothing known
		// against it.
		{name: "not watched yet", urls: []string{a}, wantReady: true, wantReachable: []bool{true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := ExportStatus(ref, "lc", tt.urls, tt.states)
			if st.GetVirtualWorkspaceReady() != tt.wantReady {
				t.Errorf("ready %v, want %v", st.GetVirtualWorkspaceReady(), tt.wantReady)
			}
			if len(tt.wantWaiting) == 0 && st.GetWaitingFor() != "" {
				t.Errorf("waiting for %q, want nothing", st.GetWaitingFor())
			}
			for _, w := range tt.wantWaiting {
				if !strings.Contains(st.GetWaitingFor(), w) {
					t.Errorf("waiting for %q, want it to say %q", st.GetWaitingFor(), w)
				}
			}
			if len(st.GetEndpoints()) != len(tt.wantReachable) {
				t.Fatalf("endpoints %v, want %d", st.GetEndpoints(), len(tt.wantReachable))
			}
			for i, ep := range st.GetEndpoints() {
				if ep.GetUrl() != tt.urls[i] || ep.GetReachable() != tt.wantReachable[i] {
					t.Errorf("endpoint %d: %v, want %s reachable %v", i, ep, tt.urls[i], tt.wantReachable[i])
				}
			}
		})
	}
}

package engine

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/types/known/timestamppb"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/replication"
)

// ExportStatus describes an APIExport's state for the edge: its virtual
// workspace URLs and, for those the engine watches, their state (nil before
// an engine runs).
func ExportStatus(ref config.APIExportRef, logicalCluster string, vwURLs []string, endpoints []replication.EndpointState) *ferryv1.ExportStatus {
	st := &ferryv1.ExportStatus{
		Export:                &ferryv1.APIExportReference{WorkspacePath: ref.Workspace, Name: ref.Name},
		LogicalCluster:        logicalCluster,
		VirtualWorkspaceReady: len(vwURLs) > 0,
	}
	if !st.VirtualWorkspaceReady {
		st.WaitingFor = fmt.Sprintf("APIExportEndpointSlice %s to list a virtual workspace URL (kcp adds it once the APIExport is bound)", ref)
		return st
	}
	states := make(map[string]replication.EndpointState, len(endpoints))
	for _, s := range endpoints {
		states[s.URL] = s
	}
	var unreachable []string
	for _, url := range vwURLs {
		s, watched := states[url]
		ep := &ferryv1.VirtualWorkspaceEndpoint{Url: url, Reachable: !watched || s.Reachable, LastError: s.LastError}
		if watched {
			ep.Since = timestamppb.New(s.Since)
		}
		if !ep.GetReachable() {
			unreachable = append(unreachable, fmt.Sprintf("%s (%s)", url, s.LastError))
		}
		st.Endpoints = append(st.Endpoints, ep)
	}
	if len(unreachable) > 0 {
		st.WaitingFor = fmt.Sprintf("virtual workspace endpoints the broker cannot reach; the workspaces on their shards are not synced until it can: %s",
			strings.Join(unreachable, "; "))
	}
	return st
}

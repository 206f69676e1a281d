package server

import (
	"context"
	"sort"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/types/known/timestamppb"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/engine"
	"github.com/ferry-dev/ferry/broker/registry"
	"github.com/ferry-dev/ferry/broker/replication"
	"github.com/ferry-dev/ferry/broker/revocation"
)

// adminService implements ferry.v1alpha1.AdminService for identities listed
// as admins in the broker configuration.
type adminService struct {
	ferryv1.UnimplementedAdminServiceServer

	cfg      *config.Config
	registry *registry.Registry
	engines  *engines
	// workspaces resolves workspace paths for GetObjectState; nil accepts
	// logical cluster names only.
	workspaces WorkspaceResolver
	// revocations keeps the blocks Revoke makes.
	revocations *revocation.Set
	log         logr.Logger
	// enrolment creates enrolment tokens.
	enrolment *enrolmentService
}

var _ ferryv1.AdminServiceServer = (*adminService)(nil)

func (a *adminService) ListEdges(ctx context.Context, _ *ferryv1.ListEdgesRequest) (*ferryv1.ListEdgesResponse, error) {
	if err := a.authorize(ctx); err != nil {
		return nil, err
	}
	out := &ferryv1.ListEdgesResponse{}
	for _, e := range a.cfg.Edges {
		edge := &ferryv1.Edge{
			Identity: e.Identity,
			Export:   exportRef(e.APIExport),
			State:    ferryv1.EdgeState_EDGE_STATE_DISCONNECTED,
		}
		if s, ok := a.registry.ForExport(e.APIExport); ok && s.Identity == e.Identity {
			edge.State = ferryv1.EdgeState_EDGE_STATE_CONNECTED
			edge.AgentName = s.AgentName
			edge.SessionId = s.ID
			edge.PeerAddress = s.PeerAddress
			edge.ConnectedAt = timestamppb.New(s.ConnectedAt)
			edge.LastSeen = timestamppb.New(s.LastSeen())
			edge.ProtocolVersion = s.ProtocolVersion
			edge.EdgeVersion = s.EdgeVersion
			edge.Capabilities = s.Capabilities
			edge.CertificateSha256 = s.CertificateSHA256
			st := s.ExportState()
			var endpoints []replication.EndpointState
			if eng, ok := a.engines.get(e.APIExport); ok {
				// The engine follows the virtual workspace; the session
				// only knows it from the handshake.
				if urls, known := eng.VirtualWorkspaceURLs(); known {
					st.VirtualWorkspaceURLs = urls
				}
				endpoints = eng.Endpoints()
			}
			edge.ExportStatus = engine.ExportStatus(s.Export, st.LogicalCluster, st.VirtualWorkspaceURLs, endpoints)
		}
		if e, ok := a.engines.get(e.APIExport); ok {
			edge.Engine = e.Status()
		}
		out.Edges = append(out.Edges, edge)
	}
	sort.Slice(out.Edges, func(i, j int) bool { return out.Edges[i].Identity < out.Edges[j].Identity })
	return out, nil
}

func exportRef(r config.APIExportRef) *ferryv1.APIExportReference {
	return &ferryv1.APIExportReference{WorkspacePath: r.Workspace, Name: r.Name}
}

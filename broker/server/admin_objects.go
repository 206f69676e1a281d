package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/engine"
	"github.com/ferry-dev/ferry/broker/kcp"
	"github.com/ferry-dev/ferry/broker/replication"
	"github.com/ferry-dev/ferry/pkg/protocol"
)

// WorkspaceResolver resolves a kcp workspace path to its logical cluster
// name. Implemented by *kcp.Resolver; must honour ctx.
type WorkspaceResolver interface {
	LogicalCluster(ctx context.Context, path string) (string, error)
}

// workspaceResolverOf returns r's workspace resolution, nil when it has
// none (then GetObjectState accepts logical cluster names only).
func workspaceResolverOf(r ExportResolver) WorkspaceResolver {
	w, _ := r.(WorkspaceResolver)
	return w
}

// Resync waits: the default when the request sets none, and the most it may
// ask for.
const (
	defaultResyncWait = 30 * time.Second
	maxResyncWait     = 5 * time.Minute
)

// authorize checks that the caller is an admin.
func (a *adminService) authorize(ctx context.Context) error {
	id, _, err := identityFrom(ctx)
	if err != nil {
		return status.Error(codes.Unauthenticated, err.Error())
	}
	if !a.cfg.IsAdmin(id) {
		return status.Errorf(codes.PermissionDenied, "identity %q is not an admin of this broker (admins[] in the broker configuration)", id)
	}
	return nil
}

// engineMatch is a published resource of a running engine.
type engineMatch struct {
	edge config.Edge
	eng  served
	ref  replication.ResourceRef
}

func (a *adminService) GetObjectState(ctx context.Context, req *ferryv1.GetObjectStateRequest) (*ferryv1.GetObjectStateResponse, error) {
	if err := a.authorize(ctx); err != nil {
		return nil, err
	}
	group, resource := protocol.SplitResource(req.GetGroup(), req.GetResource())
	switch {
	case req.GetWorkspace() == "":
		return nil, status.Error(codes.InvalidArgument, "workspace is required: the object's workspace path (e.g. root:org:team) or logical cluster name")
	case resource == "":
		return nil, status.Error(codes.InvalidArgument, `resource is required: the plural in kcp (e.g. "manageddatabases") or "<plural>.<group>"`)
	case req.GetName() == "":
		return nil, status.Error(codes.InvalidArgument, "name is required")
	}
	matches := a.matchResource(group, resource)
	switch {
	case len(matches) == 0:
		what := resource
		if group != "" {
			what += "." + group
		}
		return nil, status.Errorf(codes.NotFound, "no sync engine of this broker serves %s: no connected (or recently connected) edge publishes it; ListEdges shows the engines and their resources", what)
	case len(matches) > 1:
		var names []string
		for _, m := range matches {
			names = append(names, m.ref.GVR.Resource+"."+m.ref.GVR.Group)
		}
		return nil, status.Errorf(codes.InvalidArgument, "resource %q is served by several APIExports (%s): name the group, or the resource as <plural>.<group>", resource, strings.Join(names, ", "))
	}
	m := matches[0]
	cluster, path, err := a.logicalCluster(ctx, m.eng, req.GetWorkspace())
	if err != nil {
		return nil, err
	}
	out, ok := m.eng.objects.ObjectState(m.eng, m.ref.PublishedResource, cluster, req.GetNamespace(), req.GetName())
	if !ok {
		where := req.GetWorkspace()
		if path != "" {
			where = fmt.Sprintf("%s (logical cluster %s)", path, cluster)
		}
		return nil, status.Errorf(codes.NotFound, "%s %s in workspace %s is not synced by APIExport %s: the sync engine's cache of kcp does not hold it (it does not exist, or the workspace has not bound the APIExport) and the edge reported no copy of it",
			m.ref.GVR.GroupResource(), nsName(req.GetNamespace(), req.GetName()), where, m.edge.APIExport)
	}
	out.Identity = m.edge.Identity
	out.WorkspacePath = path
	return out, nil
}

// matchResource finds the running engines' published resources served as
// resource in group (any group when empty).
func (a *adminService) matchResource(group, resource string) []engineMatch {
	var out []engineMatch
	seen := map[config.APIExportRef]bool{}
	for _, edge := range a.cfg.Edges {
		if seen[edge.APIExport] {
			continue
		}
		seen[edge.APIExport] = true
		eng, ok := a.engines.served(edge.APIExport)
		if !ok {
			continue
		}
		if s, ok := a.registry.ForExport(edge.APIExport); ok {
			// The identity serving the export now, when several may.
			if e, ok := a.cfg.EdgeFor(s.Identity); ok {
				edge = e
			}
		}
		for _, ref := range eng.MatchResources(group, resource) {
			out = append(out, engineMatch{edge: edge, eng: eng, ref: ref})
		}
	}
	return out
}

// logicalCluster resolves workspace: a logical cluster name is taken as
// is; a path (it has a ':') is looked up in what the engine resolved
// before, then in kcp. path is the workspace path when one was given.
func (a *adminService) logicalCluster(ctx context.Context, eng served, workspace string) (cluster, path string, err error) {
	if !strings.Contains(workspace, ":") {
		return workspace, "", nil
	}
	if c, ok := eng.WorkspaceCluster(workspace); ok {
		return c, workspace, nil
	}
	if a.workspaces == nil {
		return "", "", status.Errorf(codes.InvalidArgument, "this broker cannot resolve workspace paths; pass the workspace's logical cluster name (the kcp.io/cluster annotation of its objects)")
	}
	c, err := a.workspaces.LogicalCluster(ctx, workspace)
	var nf *kcp.NotFoundError
	switch {
	case errors.As(err, &nf):
		return "", "", status.Errorf(codes.NotFound, "%v; pass the workspace's logical cluster name instead (the kcp.io/cluster annotation of its objects)", err)
	case err != nil:
		return "", "", status.Errorf(codes.Unavailable, "cannot resolve workspace %s in kcp: %v", workspace, err)
	}
	return c, workspace, nil
}

func (a *adminService) Resync(ctx context.Context, req *ferryv1.ResyncRequest) (*ferryv1.ResyncResponse, error) {
	if err := a.authorize(ctx); err != nil {
		return nil, err
	}
	edge, err := a.resyncTarget(req)
	if err != nil {
		return nil, err
	}
	wait := defaultResyncWait
	if w := req.GetWait(); w != nil {
		if err := w.CheckValid(); err != nil || w.AsDuration() < 0 {
			return nil, status.Errorf(codes.InvalidArgument, "wait must be a non-negative duration")
		}
		wait = min(w.AsDuration(), maxResyncWait)
	}
	sess, ok := a.registry.ForExport(edge.APIExport)
	if !ok || sess.Identity != edge.Identity {
		return nil, status.Errorf(codes.FailedPrecondition, "edge %q (APIExport %s) is not connected; it sends a complete inventory when it connects anyway", edge.Identity, edge.APIExport)
	}
	if !slices.Contains(sess.Capabilities, ferryv1.Capability_CAPABILITY_INVENTORY_REQUEST) {
		return nil, status.Errorf(codes.FailedPrecondition, "edge %q (agent %q, version %q) does not support inventory requests (CAPABILITY_INVENTORY_REQUEST): upgrade it, or restart its stream to make it send its inventory",
			edge.Identity, sess.AgentName, sess.EdgeVersion)
	}
	eng, ok := a.engines.get(edge.APIExport)
	if !ok {
		return nil, status.Errorf(codes.FailedPrecondition, "no sync engine runs for APIExport %s", edge.APIExport)
	}
	st, err := eng.Resync(ctx, sess.ID, req.GetPublishedResources(), wait)
	switch {
	case errors.Is(err, replication.ErrUnknownResource):
		return nil, status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, engine.ErrNotAttached):
		return nil, status.Errorf(codes.FailedPrecondition, "edge %q is not connected", edge.Identity)
	case ctx.Err() != nil:
		return nil, status.FromContextError(ctx.Err()).Err()
	case err != nil:
		return nil, status.Errorf(codes.FailedPrecondition, "cannot resync edge %q: %v", edge.Identity, err)
	}
	return &ferryv1.ResyncResponse{Resync: st}, nil
}

// resyncTarget finds the configured edge a ResyncRequest names.
func (a *adminService) resyncTarget(req *ferryv1.ResyncRequest) (config.Edge, error) {
	var export config.APIExportRef
	if ex := req.GetExport(); ex != nil {
		export = config.APIExportRef{Workspace: ex.GetWorkspacePath(), Name: ex.GetName()}
	}
	switch {
	case req.GetIdentity() != "":
		edge, ok := a.cfg.EdgeFor(req.GetIdentity())
		if !ok {
			return config.Edge{}, status.Errorf(codes.NotFound, "identity %q is not configured at this broker (edges[] in the broker configuration)", req.GetIdentity())
		}
		if req.GetExport() != nil && edge.APIExport != export {
			return config.Edge{}, status.Errorf(codes.InvalidArgument, "identity %q serves APIExport %s, not %s", req.GetIdentity(), edge.APIExport, export)
		}
		return edge, nil
	case req.GetExport() != nil:
		if _, ok := a.cfg.ExportEntry(export); !ok {
			return config.Edge{}, status.Errorf(codes.NotFound, "APIExport %s is not configured at this broker (edges[] in the broker configuration)", export)
		}
		if s, ok := a.registry.ForExport(export); ok {
			if edge, ok := a.cfg.EdgeFor(s.Identity); ok {
				return edge, nil
			}
		}
		return config.Edge{}, status.Errorf(codes.FailedPrecondition, "no edge serving APIExport %s is connected; it sends a complete inventory when it connects anyway", export)
	default:
		return config.Edge{}, status.Error(codes.InvalidArgument, "identity or export is required")
	}
}

func nsName(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

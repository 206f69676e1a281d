// Package kcp holds the broker's read access to kcp for the edge handshake:
// it resolves an edge's APIExport, the logical cluster of its workspace and
// whether the APIExport's virtual workspace is served yet.
package kcp

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	apisv1alpha1 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha1"
	kcpclientset "github.com/kcp-dev/kcp/sdk/client/clientset/versioned/cluster"
	"github.com/kcp-dev/logicalcluster/v3"
	"golang.org/x/sync/singleflight"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/ferry-dev/ferry/broker/config"
)

// ExportState is what the broker knows about an APIExport.
type ExportState struct {
	// LogicalCluster is the logical cluster name of the export's workspace.
	LogicalCluster string
	// VirtualWorkspaceURLs are the endpoints of the export's
	// APIExportEndpointSlice (one per shard serving bound workspaces),
	// rewritten (EndpointRewrite), sorted; empty until kcp serves it (it
	// needs at least one APIBinding).
	VirtualWorkspaceURLs []string
}

// NotFoundError reports that a workspace or APIExport does not exist or is
// not visible to the broker's kcp credentials.
type NotFoundError struct {
	What string
	Err  error
}

func (e *NotFoundError) Error() string { return e.What + " not found in kcp: " + e.Err.Error() }
func (e *NotFoundError) Unwrap() error { return e.Err }

// Resolver reads APIExport state from kcp. Safe for concurrent use.
type Resolver struct {
	client  kcpclientset.ClusterInterface
	rewrite EndpointRewrite
	// slices watches the endpoint slices of every workspace with a running
	// engine, once per workspace; handshakes of its exports read it.
	slices *sliceWatches
	// workspaces coalesces the reads of a workspace's LogicalCluster, keyed
	// by workspace path: a storm of handshakes for the exports of one
	// workspace (a cold broker) reads it once rather than once per export.
	// Only reads in flight are shared, nothing is kept: a handshake never
	// gets an answer from a read that ended before it arrived.
	workspaces singleflight.Group
}

// NewClient builds a cluster-aware kcp clientset from a rest config; any
// /clusters/... path on its host is dropped (the client adds its own).
func NewClient(cfg *rest.Config) (kcpclientset.ClusterInterface, error) {
	base := rest.CopyConfig(cfg)
	host, err := BaseHost(cfg.Host)
	if err != nil {
		return nil, err
	}
	base.Host = host
	client, err := kcpclientset.NewForConfig(base)
	if err != nil {
		return nil, fmt.Errorf("cannot build kcp client: %w", err)
	}
	return client, nil
}

// NewResolver returns a resolver using client; the virtual workspace URLs
// it reports are mapped through rewrite.
func NewResolver(client kcpclientset.ClusterInterface, rewrite EndpointRewrite) *Resolver {
	return &Resolver{client: client, rewrite: rewrite, slices: newSliceWatches(kcpSliceListWatch(client), rewrite)}
}

// BaseHost strips a "/clusters/<path>" suffix from a kcp server URL.
func BaseHost(host string) (string, error) {
	u, err := url.Parse(host)
	if err != nil {
		return "", fmt.Errorf("invalid kcp server URL %q: %w", host, err)
	}
	if i := strings.Index(u.Path, "/clusters/"); i >= 0 {
		u.Path = u.Path[:i]
	}
	return u.String(), nil
}

// sliceListWait bounds how long a handshake waits for its workspace's
// slices to be listed before it reads its own (kcp slow to list, or the
// broker's credentials may not list them).
const sliceListWait = 3 * time.Second

// Resolve checks that the APIExport exists and returns its state.
func (r *Resolver) Resolve(ctx context.Context, ref config.APIExportRef) (ExportState, error) {
	// The export's slice from the workspace's watch (started here if no
	// engine of the workspace runs, shared with every handshake and
	// engine of the workspace): it says the export exists (kcp makes one
	// per export and deletes it with the export). A storm of a cold
	// broker's edges thus reads one list per workspace, not a slice per
	// edge.
	ws := r.slices.hold(ref.Workspace)
	defer r.slices.release(ref.Workspace, ws)
	slice, cluster, listed := r.slices.listedState(ctx, ws, ref.Name, sliceListWait)
	if listed && isSliceOf(slice, ref.Name) {
		if cluster == "" {
			var err error
			if cluster, err = r.logicalCluster(ctx, logicalcluster.NewPath(ref.Workspace)); err != nil {
				return ExportState{}, err
			}
			r.slices.learnedLogicalCluster(ref.Workspace, cluster)
		}
		return ExportState{LogicalCluster: cluster, VirtualWorkspaceURLs: endpointURLs(slice, r.rewrite)}, nil
	}
	// Not listed in time, or no slice (the export may be gone, or kcp has
	// not made its slice yet): read kcp.
	path := logicalcluster.NewPath(ref.Workspace)

	cluster, err := r.logicalCluster(ctx, path)
	if err != nil {
		return ExportState{}, err
	}
	state := ExportState{LogicalCluster: cluster}
	r.slices.learnedLogicalCluster(ref.Workspace, cluster)

	// The slice first: when it is there, so is the export (one read
	// instead of two); the export is read only without one.
	read, err := r.client.Cluster(path).ApisV1alpha1().APIExportEndpointSlices().Get(ctx, ref.Name, metav1.GetOptions{})
	switch {
	case err == nil && isSliceOf(read, ref.Name):
		state.VirtualWorkspaceURLs = endpointURLs(read, r.rewrite)
		return state, nil
	case err != nil && !apierrors.IsNotFound(err):
		return state, fmt.Errorf("cannot read APIExportEndpointSlice %s: %w", ref, err)
	}
	// No slice (kcp creates it shortly after the export): is the export
	// there?
	if _, err := r.client.Cluster(path).ApisV1alpha2().APIExports().Get(ctx, ref.Name, metav1.GetOptions{}); err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
			return state, &NotFoundError{What: fmt.Sprintf("APIExport %s", ref), Err: err}
		}
		return state, fmt.Errorf("cannot read APIExport %s: %w", ref, err)
	}
	return state, nil
}

// isSliceOf tells whether slice is the one kcp makes for the export named
// export (same name, pointing at it): a slice someone else made under that
// name proves nothing.
func isSliceOf(slice *apisv1alpha1.APIExportEndpointSlice, export string) bool {
	return slice != nil && slice.Name == export && slice.Spec.APIExport.Name == export
}

// logicalCluster is the logical cluster name of the workspace at path,
// read once for all the callers that ask while a read is in flight. A
// caller that joined a read whose starter's context ended (its handshake
// was cancelled) reads again under its own context rather than fail with
// someone else's cancellation; each such retry follows a distinct caller
// leaving, so it does not loop.
func (r *Resolver) logicalCluster(ctx context.Context, path logicalcluster.Path) (string, error) {
	for {
		ch := r.workspaces.DoChan(path.String(), func() (any, error) {
			cluster, err := r.readLogicalCluster(ctx, path)
			if err != nil && ctx.Err() != nil {
				return "", &starterGoneError{err: err}
			}
			return cluster, err
		})
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("cannot read workspace %q: %w", path, ctx.Err())
		case res := <-ch:
			var gone *starterGoneError
			switch {
			case errors.As(res.Err, &gone) && ctx.Err() == nil:
				continue
			case gone != nil:
				return "", gone.err
			case res.Err != nil:
				return "", res.Err
			}
			return res.Val.(string), nil
		}
	}
}

// starterGoneError is a shared read that failed because the context of the
// caller that started it ended.
type starterGoneError struct{ err error }

func (e *starterGoneError) Error() string { return e.err.Error() }
func (e *starterGoneError) Unwrap() error { return e.err }

// readLogicalCluster reads the LogicalCluster of the workspace at path.
func (r *Resolver) readLogicalCluster(ctx context.Context, path logicalcluster.Path) (string, error) {
	lc, err := r.client.Cluster(path).CoreV1alpha1().LogicalClusters().Get(ctx, "cluster", metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
			return "", &NotFoundError{What: fmt.Sprintf("workspace %q", path), Err: err}
		}
		return "", fmt.Errorf("cannot read workspace %q: %w", path, err)
	}
	return logicalcluster.From(lc).String(), nil
}

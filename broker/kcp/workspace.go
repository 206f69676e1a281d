package kcp

import (
	"context"
	"fmt"

	"github.com/kcp-dev/logicalcluster/v3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LogicalCluster resolves a workspace path (e.g. "root:org:team") to the
// logical cluster name of its workspace, reading the workspace's
// LogicalCluster object with the broker's kcp credentials. A missing or
// invisible workspace is a *NotFoundError.
func (r *Resolver) LogicalCluster(ctx context.Context, path string) (string, error) {
	lc, err := r.client.Cluster(logicalcluster.NewPath(path)).CoreV1alpha1().LogicalClusters().Get(ctx, "cluster", metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) {
			return "", &NotFoundError{What: fmt.Sprintf("workspace %q", path), Err: err}
		}
		return "", fmt.Errorf("cannot read workspace %q: %w", path, err)
	}
	return logicalcluster.From(lc).String(), nil
}

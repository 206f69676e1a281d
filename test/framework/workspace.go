package framework

import (
	"context"
	"fmt"
	"time"

	apisv1alpha2 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha2"
	tenancyv1alpha1 "github.com/kcp-dev/kcp/sdk/apis/tenancy/v1alpha1"
	kcpclientset "github.com/kcp-dev/kcp/sdk/client/clientset/versioned/cluster"
	"github.com/kcp-dev/logicalcluster/v3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/ferry-dev/ferry/broker/kcp"
)

// KCPClient returns a cluster-aware kcp clientset for cfg's server.
func KCPClient(cfg *rest.Config) (kcpclientset.ClusterInterface, error) {
	return kcp.NewClient(cfg)
}

// CreateWorkspace creates a universal workspace name under parent (e.g.
// "root") unless it exists, waits until it is ready and returns its path.
func CreateWorkspace(ctx context.Context, cfg *rest.Config, parent, name string) (logicalcluster.Path, error) {
	return CreateWorkspaceOn(ctx, cfg, parent, name, nil)
}

// CreateWorkspaceOn is CreateWorkspace with the workspace scheduled onto a
// shard whose labels match shardLabels (any shard when nil).
func CreateWorkspaceOn(ctx context.Context, cfg *rest.Config, parent, name string, shardLabels map[string]string) (logicalcluster.Path, error) {
	client, err := KCPClient(cfg)
	if err != nil {
		return logicalcluster.Path{}, err
	}
	parentPath := logicalcluster.NewPath(parent)
	ws := &tenancyv1alpha1.Workspace{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: tenancyv1alpha1.WorkspaceSpec{Type: &tenancyv1alpha1.WorkspaceTypeReference{
			Name: "universal", Path: "root",
		}},
	}
	if shardLabels != nil {
		ws.Spec.Location = &tenancyv1alpha1.WorkspaceLocation{Selector: &metav1.LabelSelector{MatchLabels: shardLabels}}
	}
	_, err = client.Cluster(parentPath).TenancyV1alpha1().Workspaces().Create(ctx, ws, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return logicalcluster.Path{}, fmt.Errorf("cannot create workspace %s:%s: %w", parent, name, err)
	}
	err = Eventually(ctx, 2*time.Minute, 250*time.Millisecond, func(ctx context.Context) (bool, string) {
		got, err := client.Cluster(parentPath).TenancyV1alpha1().Workspaces().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if got.Status.Phase != "Ready" {
			return false, fmt.Sprintf("workspace phase is %q", got.Status.Phase)
		}
		return true, ""
	})
	if err != nil {
		return logicalcluster.Path{}, fmt.Errorf("workspace %s:%s: %w", parent, name, err)
	}
	return parentPath.Join(name), nil
}

// CreateAPIExport creates an empty APIExport name in the workspace at path
// unless it exists.
func CreateAPIExport(ctx context.Context, cfg *rest.Config, path logicalcluster.Path, name string) error {
	client, err := KCPClient(cfg)
	if err != nil {
		return err
	}
	export := &apisv1alpha2.APIExport{ObjectMeta: metav1.ObjectMeta{Name: name}}
	_, err = client.Cluster(path).ApisV1alpha2().APIExports().Create(ctx, export, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("cannot create APIExport %s in %s: %w", name, path, err)
	}
	return nil
}

// BindAPIExport creates (or updates) an APIBinding named like the export in
// the consumer workspace, accepting every permission claim the export makes
// now, and waits until it is bound and ready.
func BindAPIExport(ctx context.Context, cfg *rest.Config, consumer, exportPath logicalcluster.Path, exportName string) error {
	client, err := KCPClient(cfg)
	if err != nil {
		return err
	}
	export, err := client.Cluster(exportPath).ApisV1alpha2().APIExports().Get(ctx, exportName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("cannot read APIExport %s|%s: %w", exportPath, exportName, err)
	}
	var claims []apisv1alpha2.AcceptablePermissionClaim
	for _, c := range export.Spec.PermissionClaims {
		claims = append(claims, apisv1alpha2.AcceptablePermissionClaim{
			ScopedPermissionClaim: apisv1alpha2.ScopedPermissionClaim{
				PermissionClaim: c, Selector: apisv1alpha2.PermissionClaimSelector{MatchAll: true},
			},
			State: apisv1alpha2.ClaimAccepted,
		})
	}
	bindings := client.Cluster(consumer).ApisV1alpha2().APIBindings()
	binding := &apisv1alpha2.APIBinding{
		ObjectMeta: metav1.ObjectMeta{Name: exportName},
		Spec: apisv1alpha2.APIBindingSpec{
			Reference:        apisv1alpha2.BindingReference{Export: &apisv1alpha2.ExportBindingReference{Path: exportPath.String(), Name: exportName}},
			PermissionClaims: claims,
		},
	}
	existing, err := bindings.Get(ctx, exportName, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		_, err = bindings.Create(ctx, binding, metav1.CreateOptions{})
	case err == nil:
		existing.Spec.PermissionClaims = claims
		_, err = bindings.Update(ctx, existing, metav1.UpdateOptions{})
	}
	if err != nil {
		return fmt.Errorf("cannot bind %s in %s: %w", exportName, consumer, err)
	}
	return Eventually(ctx, 2*time.Minute, 250*time.Millisecond, func(ctx context.Context) (bool, string) {
		b, err := bindings.Get(ctx, exportName, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		if b.Status.Phase != apisv1alpha2.APIBindingPhaseBound {
			return false, fmt.Sprintf("APIBinding phase %q, conditions %v", b.Status.Phase, b.Status.Conditions)
		}
		for _, c := range b.Status.Conditions {
			if c.Type == "Ready" && c.Status == "True" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("APIBinding not Ready: %v", b.Status.Conditions)
	})
}

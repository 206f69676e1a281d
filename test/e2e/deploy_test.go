package e2e

import (
	"context"
	"os"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/restmapper"

	"github.com/ferry-dev/ferry/test/framework"
)

// TestEdgeManifestIsAccepted applies deploy/edge/edge.yaml to the real
// service cluster: the namespace for real, everything else as a server-side
// dry run, so schema or validation mistakes in the manifest fail here.
func TestEdgeManifestIsAccepted(t *testing.T) {
	ctx := context.Background()
	f, err := os.Open("../../deploy/edge/edge.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	dc, err := discovery.NewDiscoveryClientForConfig(env.service.Config)
	if err != nil {
		t.Fatal(err)
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	dyn, err := dynamic.NewForConfig(env.service.Config)
	if err != nil {
		t.Fatal(err)
	}

	objs, err := framework.DecodeYAML(f)
	if err != nil {
		t.Fatal(err)
	}
	applied := 0
	for _, obj := range objs {
		gvk := obj.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			t.Fatalf("%s: %v", gvk, err)
		}
		ri := dyn.Resource(m.Resource).Namespace(obj.GetNamespace())
		opts := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}, FieldValidation: "Strict"}
		if gvk.Kind == "Namespace" {
			opts.DryRun = nil // namespaced objects need it to exist (the harness may have made it already)
		}
		if _, err := ri.Create(ctx, obj, opts); err != nil && !(gvk.Kind == "Namespace" && apierrors.IsAlreadyExists(err)) {
			t.Errorf("%s %s/%s rejected: %v", gvk.Kind, obj.GetNamespace(), obj.GetName(), err)
		}
		applied++
	}
	if applied != 7 {
		t.Errorf("applied %d objects, want 7 (Namespace, ServiceAccount, ClusterRole, ClusterRoleBinding, Role, RoleBinding, Deployment)", applied)
	}
}

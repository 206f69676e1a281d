package replication

import (
	"context"
	"slices"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/related"
)

// TestProjectedRelatedCopyInKCP: a service-origin entry projected onto
// another resource in kcp (a ConfigMap of the service cluster copied as a
// Secret) is watched, written and deleted with its primary under the
// projected resource, as the kind found in kcp — not under the service
// cluster's resource or kind, which the edge's report still names.
func TestProjectedRelatedCopyInKCP(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "settings", Origin: ferryv1alpha1.OriginService, Version: "v1", Resource: "configmaps",
		Projection: &ferryv1alpha1.RelatedResourceProjection{Resource: "secrets"},
		Object: &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
			Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: "spec.secretName"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	refs[0].ResolveKind("Secret") // what the publisher found in kcp
	res := thingsResource()
	res.Related = refs
	e := newEnv(t, res, thing("1", map[string]any{"secretName": "app-settings"}, nil))
	ctx := context.Background()
	err = e.m.WriteRelated(ctx, "pr", &ferryv1.RelatedObjectReport{
		RelatedTo: &ferryv1.RelatedTo{Primary: thingKey(), Identifier: "settings"},
		Resource:  &ferryv1.GroupVersionResource{Version: "v1", Resource: "configmaps"},
		State:     &ferryv1.RelatedObjectReport_Object{Object: []byte(`{"apiVersion":"v1","kind":"ConfigMap","data":{"k":"dg=="}}`)},
	})
	if err != nil {
		t.Fatal(err)
	}
	secretsGVR := schema.GroupVersionResource{Version: "v1", Resource: "secrets"}
	secrets := e.kcp.Resource(secretsGVR).Namespace("ns")
	written, err := secrets.Get(ctx, "app-settings", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the copy is not under the projected resource: %v", err)
	}
	if written.GetKind() != "Secret" || written.GetAPIVersion() != "v1" {
		t.Errorf("copy written as %s %s, want v1 Secret", written.GetAPIVersion(), written.GetKind())
	}
	if _, err := e.kcp.Resource(schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}).Namespace("ns").Get(ctx, "app-settings", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("a copy under the service cluster's resource in kcp: %v", err)
	}
	// kcp names the workspace on every object; the fake does not.
	written.SetAnnotations(map[string]string{"kcp.io/cluster": thingKey().GetCluster()})
	if _, err := secrets.Update(ctx, written, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the watch of the projected resource holds the copy", func() bool {
		e.m.mu.Lock()
		rw := e.m.relWatchers[secretsGVR]
		e.m.mu.Unlock()
		return rw != nil && slices.ContainsFunc(copiesOf(rw, "u-a", "settings"), func(c *unstructured.Unstructured) bool {
			return c.GetAnnotations()["kcp.io/cluster"] != ""
		})
	})
	if err := e.m.deleteRelatedCopies(ctx, "pr", thingKey()); err != nil {
		t.Fatal(err)
	}
	if _, err := secrets.Get(ctx, "app-settings", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the copy outlived its primary: %v", err)
	}
}

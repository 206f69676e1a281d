package publish

import (
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

// TestSchemaOnlyPublishingIgnoresNamingCollisions: a PublishedResource
// with synchronization disabled makes no local copy, so naming rules that
// could map two workspaces onto one copy (the defaults of a cluster-scoped
// resource) are no reason to refuse publishing its schema; with sync they
// are.
func TestSchemaOnlyPublishingIgnoresNamingCollisions(t *testing.T) {
	crd := &apiextensionsv1.CustomResourceDefinition{Spec: apiextensionsv1.CustomResourceDefinitionSpec{Scope: apiextensionsv1.ClusterScoped}}
	for _, tc := range []struct {
		name    string
		enabled *bool
		refused bool
	}{
		{name: "synced", refused: true},
		{name: "synced explicitly", enabled: ptrTo(true), refused: true},
		{name: "schema only", enabled: ptrTo(false)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pr := &ferryv1alpha1.PublishedResource{Spec: ferryv1alpha1.PublishedResourceSpec{
				Synchronization: &ferryv1alpha1.SynchronizationSpec{Enabled: tc.enabled},
			}}
			_, refusal := CompileRules(pr, crd)
			if tc.refused != (refusal != nil) {
				t.Fatalf("refusal %v, want refused=%v", refusal, tc.refused)
			}
			if refusal != nil && refusal.Reason != ferryv1alpha1.ReasonNamingInvalid {
				t.Fatalf("reason %s, want %s", refusal.Reason, ferryv1alpha1.ReasonNamingInvalid)
			}
		})
	}
}

func ptrTo[T any](v T) *T { return &v }

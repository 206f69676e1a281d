package publish

import (
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

func TestCopyShapeFollowsWhatShapesACopy(t *testing.T) {
	crd := &apiextensionsv1.CustomResourceDefinition{Spec: apiextensionsv1.CustomResourceDefinitionSpec{
		Group: "svc.example", Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: "Thing"}}}
	base := &ferryv1alpha1.PublishedResource{}
	mutated := base.DeepCopy()
	mutated.Spec.Mutation = &ferryv1alpha1.ResourceMutationSpec{Spec: []ferryv1alpha1.ResourceMutation{{}}}
	filtered := base.DeepCopy()
	filtered.Spec.Filter = &ferryv1alpha1.ResourceFilter{}
	if copyShape(base, crd) == copyShape(mutated, crd) {
		t.Error("a spec mutation does not change the shape")
	}
	if copyShape(base, crd) != copyShape(filtered, crd) {
		t.Error("a filter, which does not shape a copy, changes the shape")
	}
}

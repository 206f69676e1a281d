package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the API's group and version.
var GroupVersion = schema.GroupVersion{Group: "ferry.dev", Version: "v1alpha1"}

// AddToScheme registers the API's types.
func AddToScheme(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &PublishedResource{}, &PublishedResourceList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

// Package v1alpha1 is the ferry.dev/v1alpha1 API: the PublishedResource that
// service owners create in their service cluster to publish a CRD into kcp.
//
// +kubebuilder:object:generate=true
// +groupName=ferry.dev
package v1alpha1

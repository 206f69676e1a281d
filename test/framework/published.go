package framework

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

// PublishedResourceGVR is the PublishedResource's resource.
var PublishedResourceGVR = schema.GroupVersionResource{Group: "ferry.dev", Version: "v1alpha1", Resource: "publishedresources"}

// GetPublishedResource reads a PublishedResource from the service cluster.
func GetPublishedResource(ctx context.Context, cfg *rest.Config, name string) (*ferryv1alpha1.PublishedResource, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	u, err := dyn.Resource(PublishedResourceGVR).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	var pr ferryv1alpha1.PublishedResource
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.UnstructuredContent(), &pr); err != nil {
		return nil, err
	}
	return &pr, nil
}

// WaitPublishedCondition waits until the PublishedResource's Published
// condition has status and reason (reason "" matches any) for its current
// generation, and returns the object.
func WaitPublishedCondition(ctx context.Context, cfg *rest.Config, name string, status metav1.ConditionStatus, reason string, timeout time.Duration) (*ferryv1alpha1.PublishedResource, error) {
	return WaitCondition(ctx, cfg, name, ferryv1alpha1.ConditionPublished, status, reason, timeout)
}

// WaitCondition waits until PublishedResource name has condition condType
// with status (and reason, unless empty); the Published condition must
// also describe the current generation.
func WaitCondition(ctx context.Context, cfg *rest.Config, name, condType string, status metav1.ConditionStatus, reason string, timeout time.Duration) (*ferryv1alpha1.PublishedResource, error) {
	var got *ferryv1alpha1.PublishedResource
	err := Eventually(ctx, timeout, 100*time.Millisecond, func(ctx context.Context) (bool, string) {
		pr, err := GetPublishedResource(ctx, cfg, name)
		if err != nil {
			return false, err.Error()
		}
		for _, c := range pr.Status.Conditions {
			if c.Type != condType {
				continue
			}
			current := condType != ferryv1alpha1.ConditionPublished || c.ObservedGeneration == pr.Generation
			if c.Status == status && (reason == "" || c.Reason == reason) && current {
				got = pr
				return true, ""
			}
			return false, fmt.Sprintf("%s=%s reason %s (generation %d/%d): %s", condType, c.Status, c.Reason, c.ObservedGeneration, pr.Generation, c.Message)
		}
		return false, "no " + condType + " condition yet"
	})
	if err != nil {
		return nil, fmt.Errorf("PublishedResource %s: %w", name, err)
	}
	return got, nil
}

// ToUnstructured converts a typed object for Apply.
func ToUnstructured(obj runtime.Object) (*unstructured.Unstructured, error) {
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	return &unstructured.Unstructured{Object: m}, nil
}

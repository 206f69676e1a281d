package replication

import (
	"context"
	"errors"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"
)

// resourceNotServed is kcp's answer while its virtual workspace does not
// serve a resource (yet): right after kcp restarts, a 404 without the
// object's details.
var resourceNotServed = &apierrors.StatusError{ErrStatus: metav1.Status{Status: metav1.StatusFailure, Code: 404,
	Reason: metav1.StatusReasonNotFound, Message: "the server could not find the requested resource"}}

// TestA404ForTheResourceIsNotTheObjectGone: a finalizer release answered
// with kcp's "could not find the requested resource" (the virtual
// workspace does not serve the resource yet, e.g. after a kcp restart)
// used to count as released — the finalizer stayed on the object for good.
// Only a 404 that names the object means it is gone.
func TestA404ForTheResourceIsNotTheObjectGone(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      error
		released bool
	}{
		{name: "the object is gone", err: apierrors.NewNotFound(schema.GroupResource{Group: "g", Resource: "things"}, "a"), released: true},
		{name: "the resource is not served", err: resourceNotServed},
		{name: "a 404 without a Status body", err: apierrors.NewGenericServerResponse(404, "patch", schema.GroupResource{Group: "g", Resource: "things"}, "a", "", 0, true)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := thing("1", nil, nil)
			client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
				map[schema.GroupVersionResource]string{thingsGVR: "ThingList"})
			client.PrependReactor("patch", "things", func(k8stesting.Action) (bool, runtime.Object, error) { return true, nil, tc.err })
			err := patchFinalizers(context.Background(), client.Resource(thingsGVR).Namespace("ns"), obj, nil)
			if tc.released != (err == nil) {
				t.Fatalf("released: %v (err %v), want %v", err == nil, err, tc.released)
			}
			if err != nil && apierrors.IsNotFound(err) {
				t.Fatalf("a retryable failure reads as NotFound, which the report worker takes as final: %v", err)
			}
			if err != nil && errors.Is(err, ErrGone) {
				t.Fatalf("reads as gone: %v", err)
			}
		})
	}
}

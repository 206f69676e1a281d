package replication

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// applyError returns the error client-go's dynamic client returns for a
// server-side apply the API server answers with code and body.
func applyError(t *testing.T, code int, body string) error {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(code)
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	dyn, err := dynamic.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	obj := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "svc.example/v1", "kind": "Thing",
		"metadata": map[string]any{"name": "a", "namespace": "ns"}, "spec": map[string]any{"bogus": true}}}
	_, err = dyn.Resource(localGVR).Namespace("ns").Apply(context.Background(), "a", obj, metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
	if err == nil {
		t.Fatal("apply succeeded")
	}
	return err
}

// TestClassifyApplyErrors: the answers of the API server to a server-side
// apply, as client-go returns them. An object the schema refuses is a
// final rejection (applying it again repeats the same error); an outage is
// not.
func TestClassifyApplyErrors(t *testing.T) {
	for _, tc := range []struct {
		name      string
		code      int
		body      string
		want      ferryv1.ApplyErrorReason
		retryable bool
	}{
		{
			// kubernetes#122480, #139253: SSA with a field the schema does
			// not declare is answered 500 without a reason.
			name: "field not declared in schema (500)", code: http.StatusInternalServerError,
			body: `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"failed to create typed patch object (ns/a; svc.example/v1, Kind=Thing): .spec.bogus: field not declared in schema","code":500}`,
			want: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_REJECTED,
		},
		{
			name: "wrong type (500)", code: http.StatusInternalServerError,
			body: `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"failed to create typed patch object (ns/a; svc.example/v1, Kind=Thing): .spec.replicas: expected numeric (int or float), got string","code":500}`,
			want: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_REJECTED,
		},
		{
			// The same error once the API server classifies it (kubernetes#139255).
			name: "field not declared in schema (400)", code: http.StatusBadRequest,
			body: `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"failed to create typed patch object (ns/a; svc.example/v1, Kind=Thing): .spec.bogus: field not declared in schema","reason":"BadRequest","code":400}`,
			want: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_REJECTED,
		},
		{
			name: "schema validation (422)", code: http.StatusUnprocessableEntity,
			body: `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Thing.svc.example \"a\" is invalid: spec.size: Invalid value: 0: spec.size in body should be greater than or equal to 1","reason":"Invalid","details":{"name":"a","group":"svc.example","kind":"Thing","causes":[{"reason":"FieldValueInvalid","message":"Invalid value: 0: spec.size in body should be greater than or equal to 1","field":"spec.size"}]},"code":422}`,
			want: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_REJECTED,
		},
		{
			name: "API server failing (500)", code: http.StatusInternalServerError,
			body: `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"etcdserver: request timed out","reason":"InternalError","details":{"causes":[{"message":"etcdserver: request timed out"}]},"code":500}`,
			want: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_UNAVAILABLE, retryable: true,
		},
		{
			name: "unavailable (503)", code: http.StatusServiceUnavailable,
			body: `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"the server is currently unable to handle the request","reason":"ServiceUnavailable","code":503}`,
			want: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_UNAVAILABLE, retryable: true,
		},
		{
			name: "conflict (409)", code: http.StatusConflict,
			body: `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Operation cannot be fulfilled on things.svc.example \"a\": the object has been modified","reason":"Conflict","code":409}`,
			want: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT, retryable: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := applyError(t, tc.code, tc.body)
			if got := classify(err); got != tc.want {
				t.Errorf("classify(%v) = %v, want %v", err, got, tc.want)
			}
			if got := retryable(err); got != tc.retryable {
				t.Errorf("retryable(%v) = %v, want %v", err, got, tc.retryable)
			}
		})
	}
}

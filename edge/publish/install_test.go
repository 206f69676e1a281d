package publish

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
)

// TestWaitDiscovery: the CRD is established but discovery lists its
// resource only on the third request; the edge waits for it instead of
// failing to start its manager.
func TestWaitDiscovery(t *testing.T) {
	var calls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/apis/ferry.dev/v1alpha1" || calls.Add(1) < 3 {
			http.NotFound(w, r)
			return
		}
		_ = json.NewEncoder(w).Encode(&metav1.APIResourceList{GroupVersion: "ferry.dev/v1alpha1",
			APIResources: []metav1.APIResource{{Name: "publishedresources", Kind: "PublishedResource"}}})
	}))
	defer srv.Close()
	crd := &apiextensionsv1.CustomResourceDefinition{Spec: apiextensionsv1.CustomResourceDefinitionSpec{
		Group: "ferry.dev", Names: apiextensionsv1.CustomResourceDefinitionNames{Plural: "publishedresources"},
		Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1alpha1"}},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := waitDiscovery(ctx, &rest.Config{Host: srv.URL}, crd); err != nil {
		t.Fatal(err)
	}
	if calls.Load() < 3 {
		t.Fatalf("returned after %d discovery requests, before the resource was listed", calls.Load())
	}

	// Never listed: the error says what is missing.
	calls.Store(-1 << 20)
	short, cancel2 := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel2()
	if err := waitDiscovery(short, &rest.Config{Host: srv.URL}, crd); err == nil {
		t.Fatal("no error for a resource discovery never lists")
	}
}

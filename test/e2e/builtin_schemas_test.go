package e2e

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	crdvalidation "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"

	"github.com/ferry-dev/ferry/pkg/openapischema"
)

// TestBuiltinSchemasOfEveryKindConvert converts every kind of the service
// cluster's main built-in group versions (Pod, Deployment, Role, …) from
// its real OpenAPI v3 document, as the edge does for a PublishedResource
// naming it, and checks the result with the API server's own CRD
// validation (structural schema, list map keys, formats).
func TestBuiltinSchemasOfEveryKindConvert(t *testing.T) {
	kube, err := kubernetes.NewForConfig(env.service.Config)
	if err != nil {
		t.Fatal(err)
	}
	converted := 0
	for _, gv := range []schema.GroupVersion{
		{Version: "v1"}, {Group: "apps", Version: "v1"}, {Group: "batch", Version: "v1"},
		{Group: "rbac.authorization.k8s.io", Version: "v1"}, {Group: "networking.k8s.io", Version: "v1"},
		{Group: "policy", Version: "v1"}, {Group: "autoscaling", Version: "v2"}, {Group: "storage.k8s.io", Version: "v1"},
	} {
		path := "/openapi/v3/apis/" + gv.String()
		if gv.Group == "" {
			path = "/openapi/v3/api/" + gv.Version
		}
		doc, err := kube.Discovery().RESTClient().Get().AbsPath(path).Do(context.Background()).Raw()
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		var parsed struct {
			Components struct {
				Schemas map[string]struct {
					GVK []schema.GroupVersionKind `json:"x-kubernetes-group-version-kind"`
				} `json:"schemas"`
			} `json:"components"`
		}
		if err := json.Unmarshal(doc, &parsed); err != nil {
			t.Fatal(err)
		}
		for _, def := range parsed.Components.Schemas {
			for _, gvk := range def.GVK {
				if gvk.GroupVersion() != gv || strings.HasSuffix(gvk.Kind, "List") {
					continue
				}
				plural, namespaced, err := openapischema.ResourceOf(doc, gvk)
				if err != nil {
					continue // not a resource of its own (DeleteOptions, WatchEvent, …)
				}
				s, err := openapischema.Convert(doc, gvk)
				if err != nil {
					t.Errorf("%s: %v", gvk, err)
					continue
				}
				crd := openapischema.DescribeAsCRD(schema.GroupKind{Group: "builtin.example.com", Kind: gvk.Kind}, plural, namespaced,
					[]openapischema.Version{{Name: gvk.Version, Storage: true, Schema: s}})
				var internal apiextensionsinternal.CustomResourceDefinition
				if err := apiextensionsv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(crd, &internal, nil); err != nil {
					t.Fatal(err)
				}
				internal.Status.StoredVersions = []string{gvk.Version}
				if errs := crdvalidation.ValidateCustomResourceDefinition(context.Background(), &internal); len(errs) > 0 {
					t.Errorf("%s (%s): the API server would refuse its description: %v", gvk, plural, errs.ToAggregate())
					continue
				}
				converted++
			}
		}
	}
	if converted < 30 {
		t.Fatalf("converted %d kinds, want the main built-in ones", converted)
	}
	t.Logf("%d built-in kinds convert into valid CRD schemas", converted)
}

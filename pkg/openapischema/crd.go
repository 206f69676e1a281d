package openapischema

import (
	"encoding/json"
	"fmt"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Version is one served version of a built-in kind.
type Version struct {
	Name string
	// Storage marks the version the kind is published with as storage
	// (the cluster's preferred one).
	Storage bool
	Schema  *Schema
}

// DescribeAsCRD describes a built-in kind as the CRD a PublishedResource
// would name if a CRD defined it, so it is validated, sent and projected
// like one. The CRD is named like CRDs are (<plural>.<group>; <plural> in
// the core group).
func DescribeAsCRD(gk schema.GroupKind, plural string, namespaced bool, versions []Version) *apiextensionsv1.CustomResourceDefinition {
	name := plural
	if gk.Group != "" {
		name += "." + gk.Group
	}
	crd := &apiextensionsv1.CustomResourceDefinition{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: gk.Group,
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Kind: gk.Kind, ListKind: gk.Kind + "List", Plural: plural, Singular: strings.ToLower(gk.Kind),
			},
			Scope: apiextensionsv1.ClusterScoped,
		},
	}
	if namespaced {
		crd.Spec.Scope = apiextensionsv1.NamespaceScoped
	}
	for _, v := range versions {
		out := apiextensionsv1.CustomResourceDefinitionVersion{Name: v.Name, Served: true, Storage: v.Storage}
		if v.Schema != nil {
			out.Schema = &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: v.Schema.Props.DeepCopy()}
			if v.Schema.HasStatus {
				// Built-in kinds with a status field serve it as a status
				// subresource (Deployment, Namespace); ConfigMap and Role
				// have none.
				out.Subresources = &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}}
			}
		}
		crd.Spec.Versions = append(crd.Spec.Versions, out)
	}
	return crd
}

// ResourceOf reads gvk's plural and scope from the paths of doc (an OpenAPI
// v3 document of its group and version): the shortest path of a "get" of
// one gvk object, /…/<plural>/{name}, under /namespaces/{namespace}/ when
// the kind is namespaced. For offline use; a running edge asks discovery.
func ResourceOf(doc []byte, gvk schema.GroupVersionKind) (plural string, namespaced bool, err error) {
	var parsed struct {
		Paths map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(doc, &parsed); err != nil {
		return "", false, fmt.Errorf("the OpenAPI document of %s is not valid JSON: %w", gvk.GroupVersion(), err)
	}
	best := ""
	for path, ops := range parsed.Paths {
		var get struct {
			Action string `json:"x-kubernetes-action"`
			GVK    struct {
				Group, Version, Kind string
			} `json:"x-kubernetes-group-version-kind"`
		}
		raw, ok := ops["get"]
		if !ok || json.Unmarshal(raw, &get) != nil || get.Action != "get" {
			continue
		}
		if get.GVK.Group != gvk.Group || get.GVK.Version != gvk.Version || get.GVK.Kind != gvk.Kind || !strings.HasSuffix(path, "/{name}") {
			continue
		}
		if best == "" || len(path) < len(best) || len(path) == len(best) && path < best {
			best = path
		}
	}
	if best == "" {
		return "", false, fmt.Errorf("the OpenAPI document of %s has no path that reads a %s", gvk.GroupVersion(), gvk.Kind)
	}
	segments := strings.Split(strings.TrimSuffix(best, "/{name}"), "/")
	return segments[len(segments)-1], strings.Contains(best, "/namespaces/{namespace}/"), nil
}

package publish

import (
	"context"
	"fmt"
	"slices"
	"sync"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/openapi"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/openapischema"
	"github.com/ferry-dev/ferry/pkg/projection"
)

// Builtins describes kinds of the service cluster that no CRD defines
// (ConfigMap, rbac Role, …) as CRDs, from the schemas its OpenAPI v3
// discovery publishes, so they are published like CRDs: the broker gets the
// same Publish message and projects the kind into the APIExport's group.
// Safe for concurrent use.
type Builtins struct {
	// Mapper resolves a kind to its resource and scope.
	Mapper meta.RESTMapper
	// Reader reads CRDs live (not from a cache), so a CRD-defined kind the
	// cache does not show yet is never mistaken for a built-in one.
	Reader client.Reader
	// OpenAPI is the service cluster's OpenAPI v3 discovery.
	OpenAPI openapi.ClientWithContext

	mu sync.Mutex
	// docs caches converted schemas by the document's server-relative URL
	// (it carries a hash of the content) and kind.
	docs map[string]*openapischema.Schema
}

// CRDFor returns a CRD describing src's built-in kind with the versions src
// selects, or nil when the service cluster does not serve src's kind or a
// CRD defines it. A selected version the cluster does not serve is left
// out, so projecting the result says which one is missing.
func (b *Builtins) CRDFor(ctx context.Context, src ferryv1alpha1.SourceResource) (*apiextensionsv1.CustomResourceDefinition, error) {
	gk := schema.GroupKind{Group: src.APIGroup, Kind: src.Kind}
	mappings, err := b.Mapper.RESTMappings(gk)
	if meta.IsNoMatchError(err) || err == nil && len(mappings) == 0 {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cannot map kind %s: %w", gk, err)
	}
	plural := mappings[0].Resource.Resource
	if src.APIGroup != "" { // the core group has no CRDs
		var existing apiextensionsv1.CustomResourceDefinition
		err = b.Reader.Get(ctx, client.ObjectKey{Name: plural + "." + src.APIGroup}, &existing)
		switch {
		case err == nil:
			return nil, nil // a CRD's kind: the CRD cache shows it soon
		case !apierrors.IsNotFound(err):
			return nil, fmt.Errorf("cannot read CRD %s.%s: %w", plural, src.APIGroup, err)
		}
	}
	paths, err := b.OpenAPI.PathsWithContext(ctx)
	if err != nil {
		return nil, fmt.Errorf("cannot read the service cluster's OpenAPI v3 discovery: %w", err)
	}
	// The mapper lists the preferred version first: it is the storage
	// version when selected.
	preferred := mappings[0].Resource.Version
	var versions []openapischema.Version
	selected := projection.SelectedVersions(&src, nil)
	if len(selected) == 0 {
		// Neither version nor versions: every version the cluster serves,
		// as for a CRD.
		for _, m := range mappings {
			selected = append(selected, m.Resource.Version)
		}
	}
	for _, v := range selected {
		if !slices.ContainsFunc(mappings, func(m *meta.RESTMapping) bool { return m.Resource.Version == v }) {
			continue
		}
		s, err := b.schema(ctx, paths, schema.GroupVersionKind{Group: src.APIGroup, Version: v, Kind: src.Kind})
		if err != nil {
			return nil, err
		}
		versions = append(versions, openapischema.Version{Name: v, Storage: v == preferred, Schema: s})
	}
	if len(versions) == 0 {
		// None of the selected versions is served: projecting this says
		// which one is missing and which the cluster has.
		versions = []openapischema.Version{{Name: preferred, Storage: true}}
	}
	crd := openapischema.DescribeAsCRD(gk, plural, mappings[0].Scope.Name() == meta.RESTScopeNameNamespace, versions)
	return crd, nil
}

// schema returns gvk's converted schema from the discovery paths.
func (b *Builtins) schema(ctx context.Context, paths map[string]openapi.GroupVersionWithContext, gvk schema.GroupVersionKind) (*openapischema.Schema, error) {
	key := "api/" + gvk.Version
	if gvk.Group != "" {
		key = "apis/" + gvk.Group + "/" + gvk.Version
	}
	gv, ok := paths[key]
	if !ok {
		return nil, fmt.Errorf("the service cluster's OpenAPI v3 discovery has no document for %s", gvk.GroupVersion())
	}
	cacheKey := gv.ServerRelativeURL() + "#" + gvk.Kind
	b.mu.Lock()
	s, ok := b.docs[cacheKey]
	b.mu.Unlock()
	if ok {
		return s, nil
	}
	doc, err := gv.SchemaWithContext(ctx, runtime.ContentTypeJSON)
	if err != nil {
		return nil, fmt.Errorf("cannot read the OpenAPI v3 document of %s: %w", gvk.GroupVersion(), err)
	}
	s, err = openapischema.Convert(doc, gvk)
	if err != nil {
		return nil, err
	}
	b.mu.Lock()
	if b.docs == nil {
		b.docs = map[string]*openapischema.Schema{}
	}
	b.docs[cacheKey] = s
	b.mu.Unlock()
	return s, nil
}

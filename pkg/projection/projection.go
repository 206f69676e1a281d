// Package projection turns a service-cluster CRD and a PublishedResource's
// spec into the APIResourceSchema that kcp serves: the API group becomes the
// APIExport's, names, versions and scope follow the projection, and each
// selected version's schema is copied verbatim. The schema's name carries a
// hash of its content, so an unchanged input always yields the same name and
// a changed one a new schema (APIResourceSchemas are immutable).
//
// Both sides use it: the edge to validate a PublishedResource before sending
// it, the broker to build what it creates in kcp.
package projection

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	apisv1alpha1 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha1"
	apisv1alpha2 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha2"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

// Error is a projection failure with the PublishedResource condition reason
// it maps to (VersionNotFound or ProjectionInvalid).
type Error struct {
	Reason  string
	Message string
}

func (e *Error) Error() string { return e.Message }

func invalid(format string, args ...any) *Error {
	return &Error{Reason: ferryv1alpha1.ReasonProjectionInvalid, Message: fmt.Sprintf(format, args...)}
}

// hashLength is how many hex characters of the content hash name a schema.
const hashLength = 12

var versionPattern = regexp.MustCompile(`^v[0-9]+((alpha|beta)[0-9]+)?$`)

// Result is a projected resource.
type Result struct {
	// Schema is the APIResourceSchema to create in kcp.
	Schema *apisv1alpha1.APIResourceSchema
	// Resource is group, storage version and plural as served in kcp.
	Resource schema.GroupVersionResource
	// Kind is the kind as served in kcp.
	Kind string
	// VersionMap maps each selected source version to its kcp version.
	VersionMap map[string]string
}

// SelectedVersions returns the source versions spec selects: version,
// versions, or — when neither is set, as api-syncagent documents it —
// every version crd serves (nil for a kind without a CRD: the caller
// chooses).
func SelectedVersions(spec *ferryv1alpha1.SourceResource, crd *apiextensionsv1.CustomResourceDefinition) []string {
	switch {
	case spec.Version != "":
		return []string{spec.Version}
	case len(spec.Versions) > 0:
		return slices.Clone(spec.Versions)
	}
	if crd == nil {
		return nil
	}
	var served []string
	for _, v := range crd.Spec.Versions {
		if v.Served {
			served = append(served, v.Name)
		}
	}
	return served
}

// Project builds the APIResourceSchema for crd as published by spec in the
// API group group (the APIExport's name).
func Project(spec *ferryv1alpha1.PublishedResourceSpec, crd *apiextensionsv1.CustomResourceDefinition, group string) (*Result, error) {
	src := spec.Resource
	if crd.Spec.Group != src.APIGroup || crd.Spec.Names.Kind != src.Kind {
		return nil, &Error{Reason: ferryv1alpha1.ReasonCRDNotFound,
			Message: fmt.Sprintf("CRD %s defines %s.%s, not %s.%s", crd.Name, crd.Spec.Names.Kind, crd.Spec.Group, src.Kind, src.APIGroup)}
	}
	if p := spec.Projection; p != nil && (p.Group != "" || p.APIGroup != "") {
		return nil, invalid("projection.group is not supported: ferry serves every published resource in the API group of the APIExport (its name); remove it")
	}
	versions, err := selectVersions(&src, crd)
	if err != nil {
		return nil, err
	}
	proj := spec.Projection
	if proj == nil {
		proj = &ferryv1alpha1.ResourceProjection{}
	}
	versionMap, err := mapVersions(proj, versions)
	if err != nil {
		return nil, err
	}
	names, err := projectNames(proj, crd.Spec.Names)
	if err != nil {
		return nil, err
	}
	scope := crd.Spec.Scope
	if proj.Scope != "" {
		scope = apiextensionsv1.ResourceScope(proj.Scope)
	}
	if msgs := validation.IsDNS1123Subdomain(group); len(msgs) > 0 {
		return nil, invalid("API group %q is not valid: %s", group, strings.Join(msgs, "; "))
	}

	ars := &apisv1alpha1.APIResourceSchema{
		Spec: apisv1alpha1.APIResourceSchemaSpec{
			Group: group,
			Names: names,
			Scope: scope,
		},
	}
	storage := storageVersion(versions)
	for _, v := range versions {
		out := apisv1alpha1.APIResourceVersion{
			Name:                     versionMap[v.Name],
			Served:                   true,
			Storage:                  v.Name == storage,
			Deprecated:               v.Deprecated,
			DeprecationWarning:       v.DeprecationWarning,
			AdditionalPrinterColumns: v.AdditionalPrinterColumns,
		}
		if v.Subresources != nil {
			out.Subresources = *v.Subresources
		}
		if v.Schema != nil && v.Schema.OpenAPIV3Schema != nil {
			raw, err := json.Marshal(v.Schema.OpenAPIV3Schema)
			if err != nil {
				return nil, invalid("schema of version %s cannot be encoded: %v", v.Name, err)
			}
			out.Schema = runtime.RawExtension{Raw: raw}
		} else {
			return nil, invalid("version %s of CRD %s has no OpenAPI schema", v.Name, crd.Name)
		}
		ars.Spec.Versions = append(ars.Spec.Versions, out)
	}
	if len(ars.Spec.Versions) > 1 {
		// kcp cannot call the service cluster's conversion webhooks; versions
		// are served as they are stored, which needs compatible schemas.
		ars.Spec.Conversion = &apisv1alpha1.CustomResourceConversion{Strategy: apisv1alpha1.ConversionStrategyType(apiextensionsv1.NoneConverter)}
	}
	name, err := SchemaName(&ars.Spec)
	if err != nil {
		return nil, err
	}
	ars.Name = name
	ars.TypeMeta = metav1.TypeMeta{APIVersion: apisv1alpha1.SchemeGroupVersion.String(), Kind: "APIResourceSchema"}

	return &Result{
		Schema:     ars,
		Resource:   schema.GroupVersionResource{Group: group, Version: versionMap[storage], Resource: names.Plural},
		Kind:       names.Kind,
		VersionMap: versionMap,
	}, nil
}

// SchemaName is "v<hash>.<plural>.<group>", the hash covering the whole spec.
func SchemaName(spec *apisv1alpha1.APIResourceSchemaSpec) (string, error) {
	data, err := json.Marshal(spec)
	if err != nil {
		return "", invalid("schema cannot be encoded: %v", err)
	}
	sum := sha256.Sum256(data)
	name := "v" + hex.EncodeToString(sum[:])[:hashLength] + "." + spec.Names.Plural + "." + spec.Group
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return "", invalid("APIResourceSchema name %q is not valid: %s", name, strings.Join(msgs, "; "))
	}
	return name, nil
}

func selectVersions(src *ferryv1alpha1.SourceResource, crd *apiextensionsv1.CustomResourceDefinition) ([]apiextensionsv1.CustomResourceDefinitionVersion, error) {
	wanted := SelectedVersions(src, crd)
	if len(wanted) == 0 {
		return nil, &Error{Reason: ferryv1alpha1.ReasonVersionNotFound, Message: fmt.Sprintf("CRD %s serves no version", crd.Name)}
	}
	var have []string
	for _, v := range crd.Spec.Versions {
		have = append(have, v.Name)
	}
	var out []apiextensionsv1.CustomResourceDefinitionVersion
	for _, w := range wanted {
		i := slices.IndexFunc(crd.Spec.Versions, func(v apiextensionsv1.CustomResourceDefinitionVersion) bool { return v.Name == w })
		if i < 0 {
			return nil, &Error{Reason: ferryv1alpha1.ReasonVersionNotFound,
				Message: fmt.Sprintf("version %q not found in CRD %s (it has %s)", w, crd.Name, strings.Join(have, ", "))}
		}
		if !crd.Spec.Versions[i].Served {
			return nil, &Error{Reason: ferryv1alpha1.ReasonVersionNotFound,
				Message: fmt.Sprintf("version %q of CRD %s is not served", w, crd.Name)}
		}
		out = append(out, crd.Spec.Versions[i])
	}
	return out, nil
}

func mapVersions(proj *ferryv1alpha1.ResourceProjection, versions []apiextensionsv1.CustomResourceDefinitionVersion) (map[string]string, error) {
	m := make(map[string]string, len(versions))
	for _, v := range versions {
		m[v.Name] = v.Name
	}
	switch {
	case proj.Version != "" && len(proj.Versions) > 0:
		return nil, invalid("set at most one of projection.version and projection.versions")
	case proj.Version != "":
		if len(versions) != 1 {
			return nil, invalid("projection.version needs exactly one published version, %d are selected; use projection.versions", len(versions))
		}
		m[versions[0].Name] = proj.Version
	case len(proj.Versions) > 0:
		for from, to := range proj.Versions {
			if _, ok := m[from]; !ok {
				return nil, invalid("projection.versions renames %q, which is not a published version", from)
			}
			m[from] = to
		}
	}
	seen := map[string]string{}
	for from, to := range m {
		if !versionPattern.MatchString(to) {
			return nil, invalid("projected version %q is not a Kubernetes version name like v1 or v2beta1", to)
		}
		if other, dup := seen[to]; dup {
			return nil, invalid("versions %q and %q both project onto %q", other, from, to)
		}
		seen[to] = from
	}
	return m, nil
}

func projectNames(proj *ferryv1alpha1.ResourceProjection, src apiextensionsv1.CustomResourceDefinitionNames) (apiextensionsv1.CustomResourceDefinitionNames, error) {
	names := *src.DeepCopy()
	if proj.Kind != "" {
		plural, singular := meta.UnsafeGuessKindToResource(schema.GroupVersionKind{Kind: proj.Kind})
		names.Kind = proj.Kind
		names.ListKind = proj.Kind + "List"
		names.Singular = singular.Resource
		names.Plural = plural.Resource
	}
	if proj.Plural != "" {
		names.Plural = proj.Plural
	}
	if proj.ShortNames != nil {
		names.ShortNames = slices.Clone(proj.ShortNames)
	}
	if proj.Categories != nil {
		names.Categories = slices.Clone(proj.Categories)
	}
	if names.ListKind == "" {
		names.ListKind = names.Kind + "List"
	}
	if msgs := validation.IsDNS1123Label(names.Plural); len(msgs) > 0 {
		return names, invalid("plural %q is not a DNS label: %s", names.Plural, strings.Join(msgs, "; "))
	}
	if names.Singular != "" {
		if msgs := validation.IsDNS1123Label(names.Singular); len(msgs) > 0 {
			return names, invalid("singular %q is not a DNS label: %s", names.Singular, strings.Join(msgs, "; "))
		}
	}
	for _, s := range names.ShortNames {
		if msgs := validation.IsDNS1123Label(s); len(msgs) > 0 {
			return names, invalid("short name %q is not a DNS label: %s", s, strings.Join(msgs, "; "))
		}
	}
	return names, nil
}

// storageVersion is the CRD's storage version when it is published, else the
// first published version.
func storageVersion(versions []apiextensionsv1.CustomResourceDefinitionVersion) string {
	for _, v := range versions {
		if v.Storage {
			return v.Name
		}
	}
	return versions[0].Name
}

// ExportEntry is the APIExport's spec.resources entry that serves a
// projected resource (plural in group) from the schema named schemaName,
// stored as CRD-like objects in kcp.
func ExportEntry(group, plural, schemaName string) apisv1alpha2.ResourceSchema {
	return apisv1alpha2.ResourceSchema{
		Group: group, Name: plural, Schema: schemaName,
		Storage: apisv1alpha2.ResourceSchemaStorage{CRD: &apisv1alpha2.ResourceSchemaStorageCRD{}},
	}
}

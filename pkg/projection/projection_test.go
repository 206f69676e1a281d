package projection

import (
	"errors"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

const group = "demo.ferry.dev"

func version(name string, storage bool, field string) apiextensionsv1.CustomResourceDefinitionVersion {
	return apiextensionsv1.CustomResourceDefinitionVersion{
		Name: name, Served: true, Storage: storage,
		Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
			Type: "object",
			Properties: map[string]apiextensionsv1.JSONSchemaProps{
				"spec": {Type: "object", Properties: map[string]apiextensionsv1.JSONSchemaProps{field: {Type: "string"}}},
			},
		}},
		Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
	}
}

func crd() *apiextensionsv1.CustomResourceDefinition {
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "certificates.cert-manager.io"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "cert-manager.io",
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Kind: "Certificate", ListKind: "CertificateList", Plural: "certificates", Singular: "certificate",
				ShortNames: []string{"cert", "certs"}, Categories: []string{"cert-manager"},
			},
			Scope:    apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{version("v1", true, "secretName"), version("v1beta1", false, "oldName")},
		},
	}
}

func src(versions ...string) ferryv1alpha1.SourceResource {
	s := ferryv1alpha1.SourceResource{APIGroup: "cert-manager.io", Kind: "Certificate"}
	if len(versions) == 1 {
		s.Version = versions[0]
	} else {
		s.Versions = versions
	}
	return s
}

func TestProject(t *testing.T) {
	tests := []struct {
		name       string
		spec       ferryv1alpha1.PublishedResourceSpec
		wantKind   string
		wantPlural string
		wantShort  []string
		wantCats   []string
		wantScope  apiextensionsv1.ResourceScope
		wantVers   []string // in order; first is storage unless wantStorage
		wantStore  string
		wantReason string
	}{
		{
			name: "no projection keeps the CRD's names", spec: ferryv1alpha1.PublishedResourceSpec{Resource: src("v1")},
			wantKind: "Certificate", wantPlural: "certificates", wantShort: []string{"cert", "certs"}, wantCats: []string{"cert-manager"},
			wantScope: apiextensionsv1.NamespaceScoped, wantVers: []string{"v1"}, wantStore: "v1",
		},
		{
			name: "kind projection derives plural; short names and categories overridden",
			spec: ferryv1alpha1.PublishedResourceSpec{Resource: src("v1"), Projection: &ferryv1alpha1.ResourceProjection{
				Kind: "Zertifikat", Version: "v2", ShortNames: []string{"zert"}, Categories: []string{},
			}},
			wantKind: "Zertifikat", wantPlural: "zertifikats", wantShort: []string{"zert"}, wantCats: []string{},
			wantScope: apiextensionsv1.NamespaceScoped, wantVers: []string{"v2"}, wantStore: "v2",
		},
		{
			name: "explicit plural and scope change",
			spec: ferryv1alpha1.PublishedResourceSpec{Resource: src("v1"), Projection: &ferryv1alpha1.ResourceProjection{
				Kind: "Zertifikat", Plural: "zertifikate", Scope: ferryv1alpha1.ClusterScoped,
			}},
			wantKind: "Zertifikat", wantPlural: "zertifikate", wantShort: []string{"cert", "certs"}, wantCats: []string{"cert-manager"},
			wantScope: apiextensionsv1.ClusterScoped, wantVers: []string{"v1"}, wantStore: "v1",
		},
		{
			name: "two versions, renamed by map, storage follows the CRD",
			spec: ferryv1alpha1.PublishedResourceSpec{Resource: src("v1beta1", "v1"), Projection: &ferryv1alpha1.ResourceProjection{
				Versions: map[string]string{"v1beta1": "v1alpha1"},
			}},
			wantKind: "Certificate", wantPlural: "certificates", wantShort: []string{"cert", "certs"}, wantCats: []string{"cert-manager"},
			wantScope: apiextensionsv1.NamespaceScoped, wantVers: []string{"v1alpha1", "v1"}, wantStore: "v1",
		},
		{
			name:     "neither version nor versions publishes every served version (api-syncagent)",
			spec:     ferryv1alpha1.PublishedResourceSpec{Resource: src()},
			wantKind: "Certificate", wantPlural: "certificates", wantShort: []string{"cert", "certs"}, wantCats: []string{"cert-manager"},
			wantScope: apiextensionsv1.NamespaceScoped, wantVers: []string{"v1", "v1beta1"}, wantStore: "v1",
		},
		{
			name:       "projection.group is refused",
			spec:       ferryv1alpha1.PublishedResourceSpec{Resource: src("v1"), Projection: &ferryv1alpha1.ResourceProjection{Group: "other.example"}},
			wantReason: ferryv1alpha1.ReasonProjectionInvalid,
		},
		{name: "missing version", spec: ferryv1alpha1.PublishedResourceSpec{Resource: src("v3")}, wantReason: ferryv1alpha1.ReasonVersionNotFound},
		{
			name:       "projection.version with two versions",
			spec:       ferryv1alpha1.PublishedResourceSpec{Resource: src("v1", "v1beta1"), Projection: &ferryv1alpha1.ResourceProjection{Version: "v2"}},
			wantReason: ferryv1alpha1.ReasonProjectionInvalid,
		},
		{
			name:       "versions map names an unpublished version",
			spec:       ferryv1alpha1.PublishedResourceSpec{Resource: src("v1"), Projection: &ferryv1alpha1.ResourceProjection{Versions: map[string]string{"v1beta1": "v2"}}},
			wantReason: ferryv1alpha1.ReasonProjectionInvalid,
		},
		{
			name:       "two versions onto one",
			spec:       ferryv1alpha1.PublishedResourceSpec{Resource: src("v1", "v1beta1"), Projection: &ferryv1alpha1.ResourceProjection{Versions: map[string]string{"v1beta1": "v1"}}},
			wantReason: ferryv1alpha1.ReasonProjectionInvalid,
		},
		{
			name:       "invalid plural",
			spec:       ferryv1alpha1.PublishedResourceSpec{Resource: src("v1"), Projection: &ferryv1alpha1.ResourceProjection{Plural: "Not_Valid"}},
			wantReason: ferryv1alpha1.ReasonProjectionInvalid,
		},
		{
			name:       "invalid version name",
			spec:       ferryv1alpha1.PublishedResourceSpec{Resource: src("v1"), Projection: &ferryv1alpha1.ResourceProjection{Version: "version-one"}},
			wantReason: ferryv1alpha1.ReasonProjectionInvalid,
		},
		{
			name:       "CRD of another kind",
			spec:       ferryv1alpha1.PublishedResourceSpec{Resource: ferryv1alpha1.SourceResource{APIGroup: "cert-manager.io", Kind: "Issuer", Version: "v1"}},
			wantReason: ferryv1alpha1.ReasonCRDNotFound,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res, err := Project(&tt.spec, crd(), group)
			if tt.wantReason != "" {
				var pe *Error
				if !errors.As(err, &pe) || pe.Reason != tt.wantReason {
					t.Fatalf("want %s error, got %v", tt.wantReason, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			s := res.Schema.Spec
			if s.Group != group || s.Names.Kind != tt.wantKind || s.Names.Plural != tt.wantPlural || s.Scope != tt.wantScope {
				t.Errorf("got group %s kind %s plural %s scope %s", s.Group, s.Names.Kind, s.Names.Plural, s.Scope)
			}
			if strings.Join(s.Names.ShortNames, ",") != strings.Join(tt.wantShort, ",") || strings.Join(s.Names.Categories, ",") != strings.Join(tt.wantCats, ",") {
				t.Errorf("short names %v categories %v", s.Names.ShortNames, s.Names.Categories)
			}
			var got []string
			storage := ""
			for _, v := range s.Versions {
				got = append(got, v.Name)
				if v.Storage {
					if storage != "" {
						t.Errorf("two storage versions")
					}
					storage = v.Name
				}
				if len(v.Schema.Raw) == 0 || v.Subresources.Status == nil {
					t.Errorf("version %s lost its schema or status subresource", v.Name)
				}
			}
			if strings.Join(got, ",") != strings.Join(tt.wantVers, ",") || storage != tt.wantStore {
				t.Errorf("versions %v storage %s; want %v storage %s", got, storage, tt.wantVers, tt.wantStore)
			}
			if (len(s.Versions) > 1) != (s.Conversion != nil) {
				t.Errorf("multi-version schemas need a conversion strategy: %v", s.Conversion)
			}
			if res.Resource.Version != tt.wantStore || res.Resource.Resource != tt.wantPlural || res.Resource.Group != group {
				t.Errorf("served resource %v", res.Resource)
			}
			if !strings.HasSuffix(res.Schema.Name, "."+tt.wantPlural+"."+group) || !strings.HasPrefix(res.Schema.Name, "v") {
				t.Errorf("schema name %q", res.Schema.Name)
			}
		})
	}
}

func TestSchemaVerbatim(t *testing.T) {
	res, err := Project(&ferryv1alpha1.PublishedResourceSpec{Resource: src("v1beta1")}, crd(), group)
	if err != nil {
		t.Fatal(err)
	}
	if raw := string(res.Schema.Spec.Versions[0].Schema.Raw); !strings.Contains(raw, `"oldName"`) || strings.Contains(raw, "secretName") {
		t.Errorf("schema of v1beta1 not copied verbatim: %s", raw)
	}
}

func TestSchemaNameIsAContentHash(t *testing.T) {
	spec := ferryv1alpha1.PublishedResourceSpec{Resource: src("v1")}
	a, err := Project(&spec, crd(), group)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Project(&spec, crd(), group)
	if err != nil {
		t.Fatal(err)
	}
	if a.Schema.Name != b.Schema.Name {
		t.Fatalf("same input, different names: %s %s", a.Schema.Name, b.Schema.Name)
	}
	changed := crd()
	changed.Spec.Versions[0].Schema.OpenAPIV3Schema.Description = "changed"
	c, err := Project(&spec, changed, group)
	if err != nil {
		t.Fatal(err)
	}
	if c.Schema.Name == a.Schema.Name {
		t.Fatal("a changed schema kept its name")
	}
	// A change to a version that is not published does not matter.
	other := crd()
	other.Spec.Versions[1].Schema.OpenAPIV3Schema.Description = "changed"
	d, err := Project(&spec, other, group)
	if err != nil {
		t.Fatal(err)
	}
	if d.Schema.Name != a.Schema.Name {
		t.Fatal("a change to an unpublished version renamed the schema")
	}
}

func BenchmarkProject(b *testing.B) {
	spec := ferryv1alpha1.PublishedResourceSpec{Resource: src("v1"), Projection: &ferryv1alpha1.ResourceProjection{Kind: "Zertifikat"}}
	c := crd()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Project(&spec, c, group); err != nil {
			b.Fatal(err)
		}
	}
}

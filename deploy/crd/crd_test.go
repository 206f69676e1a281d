package crd

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"
)

// publishedResourceCRD decodes the embedded manifest into the internal
// type the API server validates.
func publishedResourceCRD(t *testing.T) *apiextensions.CustomResourceDefinition {
	t.Helper()
	var v1 apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(PublishedResource, &v1); err != nil {
		t.Fatalf("cannot decode the PublishedResource CRD: %v", err)
	}
	var out apiextensions.CustomResourceDefinition
	if err := apiextensionsv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(&v1, &out, nil); err != nil {
		t.Fatalf("cannot convert the PublishedResource CRD: %v", err)
	}
	return &out
}

// TestPublishedResourceCRDIsValid: the API server accepts the CRD, its CEL
// rules included (they compile and their estimated cost fits the budget).
func TestPublishedResourceCRDIsValid(t *testing.T) {
	crd := publishedResourceCRD(t)
	for _, v := range crd.Spec.Versions {
		if v.Storage {
			crd.Status.StoredVersions = []string{v.Name}
		}
	}
	if errs := validation.ValidateCustomResourceDefinition(context.Background(), crd); len(errs) > 0 {
		t.Fatalf("the API server would refuse the PublishedResource CRD: %v", errs.ToAggregate())
	}
}

// TestPublishedResourceTransitionRules evaluates the CRD's CEL rules on
// updates the way the API server does: once published, the projected
// resource cannot change; anything else, and anything before it is
// published, can.
func TestPublishedResourceTransitionRules(t *testing.T) {
	crd := publishedResourceCRD(t)
	// The internal type holds a schema all versions share at the top.
	if crd.Spec.Validation == nil || crd.Spec.Validation.OpenAPIV3Schema == nil {
		t.Fatal("the CRD has no schema")
	}
	structural, err := schema.NewStructural(crd.Spec.Validation.OpenAPIV3Schema)
	if err != nil {
		t.Fatal(err)
	}
	validator := cel.NewValidator(structural, true, celconfig.PerCallLimit)
	if validator == nil {
		t.Fatal("the CRD has no CEL rules")
	}

	const served = "widgets.export.example/v1"
	obj := func(projection map[string]any, servedResource string) map[string]any {
		spec := map[string]any{
			"resource":       map[string]any{"apiGroup": "example.com", "version": "v1", "kind": "Widget"},
			"deletionPolicy": "Orphan",
		}
		if projection != nil {
			spec["projection"] = projection
		}
		o := map[string]any{
			"apiVersion": "ferry.dev/v1alpha1", "kind": "PublishedResource",
			"metadata": map[string]any{"name": "widgets"},
			"spec":     spec,
		}
		if servedResource != "" {
			o["status"] = map[string]any{"servedResource": servedResource}
		} else {
			o["status"] = map[string]any{"observedGeneration": int64(1)}
		}
		return o
	}
	cases := []struct {
		name     string
		old, new map[string]any
		refused  bool
	}{
		{name: "published: plural", old: obj(nil, served), new: obj(map[string]any{"plural": "gadgets"}, served), refused: true},
		{name: "published: kind", old: obj(map[string]any{"kind": "Widget"}, served), new: obj(map[string]any{"kind": "Gadget"}, served), refused: true},
		{name: "published: scope", old: obj(nil, served), new: obj(map[string]any{"scope": "Cluster"}, served), refused: true},
		{name: "published: version", old: obj(nil, served), new: obj(map[string]any{"version": "v2"}, served), refused: true},
		{name: "published: versions", old: obj(map[string]any{"versions": map[string]any{"v1": "v1"}}, served),
			new: obj(map[string]any{"versions": map[string]any{"v1": "v2"}}, served), refused: true},
		{name: "published: projection removed", old: obj(map[string]any{"plural": "gadgets"}, served), new: obj(nil, served), refused: true},
		{name: "published: short names", old: obj(map[string]any{"plural": "gadgets"}, served),
			new: obj(map[string]any{"plural": "gadgets", "shortNames": []any{"gd"}}, served)},
		{name: "published: categories added", old: obj(nil, served), new: obj(map[string]any{"categories": []any{"all"}}, served)},
		{name: "published: unchanged", old: obj(map[string]any{"plural": "gadgets"}, served), new: obj(map[string]any{"plural": "gadgets"}, served)},
		{name: "published: status written", old: obj(nil, ""), new: obj(nil, served)},
		{name: "never published: plural", old: obj(nil, ""), new: obj(map[string]any{"plural": "gadgets"}, "")},
		{name: "never published, no status: kind", old: func() map[string]any { o := obj(nil, ""); delete(o, "status"); return o }(),
			new: func() map[string]any { o := obj(map[string]any{"kind": "Gadget"}, ""); delete(o, "status"); return o }()},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			errs, _ := validator.Validate(context.Background(), field.NewPath(""), structural, tc.new, tc.old, celconfig.RuntimeCELCostBudget)
			if !tc.refused {
				if len(errs) > 0 {
					t.Fatalf("refused: %v", errs.ToAggregate())
				}
				return
			}
			if len(errs) != 1 {
				t.Fatalf("got %d errors, want 1: %v", len(errs), errs.ToAggregate())
			}
			msg := errs[0].Error()
			for _, want := range []string{"spec.projection", "served as " + served, "deletionPolicy Orphan"} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q does not contain %q", msg, want)
				}
			}
			if errs[0].Type != field.ErrorTypeForbidden {
				t.Errorf("error type %s, want %s", errs[0].Type, field.ErrorTypeForbidden)
			}
		})
	}
}

package crd

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"
)

// admit evaluates the CRD's CEL rules on the creation of a PublishedResource
// with the given spec (YAML), the way the API server does; it returns the
// errors' messages.
func admit(t *testing.T, specYAML string) []string {
	t.Helper()
	crd := publishedResourceCRD(t)
	structural, err := schema.NewStructural(crd.Spec.Validation.OpenAPIV3Schema)
	if err != nil {
		t.Fatal(err)
	}
	var spec map[string]any
	if err := yaml.Unmarshal([]byte(specYAML), &spec); err != nil {
		t.Fatalf("bad test spec: %v", err)
	}
	obj := map[string]any{
		"apiVersion": "ferry.dev/v1alpha1", "kind": "PublishedResource",
		"metadata": map[string]any{"name": "x"},
		"spec":     spec,
	}
	errs, _ := cel.NewValidator(structural, true, celconfig.PerCallLimit).
		Validate(context.Background(), field.NewPath(""), structural, obj, nil, celconfig.RuntimeCELCostBudget)
	var out []string
	for _, e := range errs {
		out = append(out, e.Error())
	}
	return out
}

// TestAdmissionOfAncestorSpellings: the spellings of the seeds and of
// api-syncagent pass the CRD's rules, and what ferry cannot honour is
// refused with a message saying what to write instead.
func TestAdmissionOfAncestorSpellings(t *testing.T) {
	const resource = "resource: {apiGroup: example.com, version: v1, kind: Widget}\n"
	cases := []struct {
		name string
		spec string
		// want is a part of the one expected refusal; empty: accepted.
		want string
	}{
		{name: "filter.namespace as a name (seeds)", spec: resource + "filter: {namespace: my-app}"},
		{name: "filter.namespace as a selector", spec: resource + "filter: {namespace: {matchLabels: {env: prod}}}"},
		{name: "related entry without identifier (seeds' cert-manager example)", spec: resource +
			"related: [{origin: service, kind: Secret, reference: {name: {path: spec.secretName}}}]"},
		{name: "related entries of two kinds without identifier", spec: resource +
			"related: [{origin: service, kind: Secret, reference: {name: {path: a}}}, {origin: platform, kind: ConfigMap, reference: {name: {path: b}}}]"},
		{name: "two related entries of one kind without identifier", spec: resource +
			"related: [{origin: service, kind: Secret, reference: {name: {path: a}}}, {origin: kcp, kind: Secret, reference: {name: {path: b}}}]",
			want: "two spec.related entries have the same identifier (an unset identifier is the resource, e.g. secrets, or else the kind in lowercase, e.g. secret): set identifier"},
		{name: "an identifier equal to another entry's default", spec: resource +
			"related: [{origin: service, kind: Secret, reference: {name: {path: a}}}, {identifier: secret, origin: kcp, kind: ConfigMap, reference: {name: {path: b}}}]",
			want: "set identifier on the entries of the same kind"},
		{name: "two entries of one kind with identifiers", spec: resource +
			"related: [{identifier: a, origin: service, kind: Secret, reference: {name: {path: a}}}, {identifier: b, origin: kcp, kind: Secret, reference: {name: {path: b}}}]"},
		{name: "uppercase plural (seeds' Zertifikate)", spec: resource + "projection: {version: v1beta1, kind: Zertifikat, plural: Zertifikate, shortNames: [zerts]}",
			want: "kcp serves only lowercase resource names: write zertifikate"},
		{name: "plural that is no DNS label", spec: resource + "projection: {plural: my_things}",
			want: "projection.plural must be a lowercase DNS label (letters, digits and -, starting with a letter), e.g. my-things"},
		{name: "lowercase plural", spec: resource + "projection: {kind: Zertifikat, plural: zertifikate}"},
		{name: "projection.group (api-syncagent)", spec: resource + "projection: {group: other.example}",
			want: "projection.group is not supported: ferry serves every published resource in the API group of the APIExport"},
		{name: "projection.apiGroup", spec: resource + "projection: {apiGroup: other.example}",
			want: "projection.apiGroup is not supported"},
		{name: "a rudi mutation (seeds)", spec: resource + "mutation: {spec: [{rudi: {script: '(set! .metadata.name \"x\")'}}]}",
			want: "Rudi is not supported: write it as cel"},
		{name: "regex with \\1 (seeds)", spec: resource + "mutation: {spec: [{regex: {path: spec.x, pattern: '(.+)', replacement: 'foo-\\1'}}]}"},
		{name: "template mutation (seeds)", spec: resource + "mutation: {spec: [{template: {path: spec.x, template: '{{ .LocalObject.ObjectMeta.Namespace }}'}}]}"},
		{name: "resource without version (api-syncagent: all versions)", spec: "resource: {apiGroup: example.com, kind: Widget}"},
		{name: "resource with version and versions", spec: "resource: {apiGroup: example.com, kind: Widget, version: v1, versions: [v1]}",
			want: "set at most one of version and versions"},
		{name: "origin platform (seeds)", spec: resource +
			"related: [{identifier: tls, origin: platform, kind: Secret, reference: {name: {path: spec.secretName}}}]"},
		// Other values of filter.namespace (a number, a bad name) pass
		// admission — the API server allows no rule on a typeless field —
		// and are refused on the condition (NamespaceFilter.Validate).
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			errs := admit(t, tc.spec)
			if tc.want == "" {
				if len(errs) > 0 {
					t.Fatalf("refused: %v", errs)
				}
				return
			}
			if len(errs) != 1 || !strings.Contains(errs[0], tc.want) {
				t.Fatalf("errors %q, want one containing %q", errs, tc.want)
			}
		})
	}
}

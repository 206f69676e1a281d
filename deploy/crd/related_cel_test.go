package crd

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
)

// TestRelatedAdmission evaluates the CRD's CEL rules on spec.related
// entries the way the API server does on create: both spellings (ferry's
// kind + reference, api-syncagent's resource + object) are accepted, and
// every mix of them is refused with a message that says what to write.
func TestRelatedAdmission(t *testing.T) {
	crd := publishedResourceCRD(t)
	structural, err := schema.NewStructural(crd.Spec.Validation.OpenAPIV3Schema)
	if err != nil {
		t.Fatal(err)
	}
	validator := cel.NewValidator(structural, true, celconfig.PerCallLimit)
	ref := map[string]any{"name": map[string]any{"path": "spec.secretName"}}
	objRef := map[string]any{"reference": map[string]any{"path": "spec.secretName"}}
	tmpl := map[string]any{"template": map[string]any{"template": "{{ .Object.spec.secretName }}"}}
	sel := map[string]any{"selector": map[string]any{"matchLabels": map[string]any{"app": "db"},
		"rewrite": map[string]any{"template": map[string]any{"template": "{{ .Value }}"}}}}
	merge := func(ms ...map[string]any) map[string]any {
		out := map[string]any{}
		for _, m := range ms {
			for k, v := range m {
				out[k] = v
			}
		}
		return out
	}
	entry := func(fields map[string]any) map[string]any {
		return merge(map[string]any{"identifier": "creds", "origin": "service"}, fields)
	}
	cases := []struct {
		name    string
		entry   map[string]any
		wantErr string // empty: accepted
	}{
		{name: "ferry: kind and reference", entry: entry(map[string]any{"kind": "Secret", "reference": ref})},
		{name: "api-syncagent: resource and object.reference", entry: entry(map[string]any{"group": "", "version": "v1", "resource": "secrets", "object": objRef})},
		{name: "api-syncagent: object.template", entry: entry(map[string]any{"resource": "secrets", "object": tmpl})},
		{name: "api-syncagent: object.selector", entry: entry(map[string]any{"resource": "secrets", "object": sel})},
		{name: "api-syncagent: object with namespace", entry: entry(map[string]any{"resource": "secrets", "object": merge(objRef, map[string]any{"namespace": tmpl})})},
		{name: "kind with object", entry: entry(map[string]any{"kind": "Secret", "object": tmpl})},
		{name: "resource with reference", entry: entry(map[string]any{"resource": "secrets", "reference": ref})},
		{name: "kind and resource", entry: entry(map[string]any{"kind": "Secret", "resource": "secrets", "reference": ref}),
			wantErr: "set kind (e.g. Secret) or resource (the plural, e.g. secrets), not both"},
		{name: "neither kind nor resource", entry: entry(map[string]any{"reference": ref}),
			wantErr: "set kind (e.g. Secret) or resource (the plural, e.g. secrets) to name"},
		{name: "uppercase resource", entry: entry(map[string]any{"resource": "Secrets", "reference": ref}),
			wantErr: "resource is the lowercase plural"},
		{name: "reference and object", entry: entry(map[string]any{"kind": "Secret", "reference": ref, "object": objRef}),
			wantErr: "set reference (ferry's name/namespace paths) or object"},
		{name: "neither reference nor object", entry: entry(map[string]any{"kind": "Secret"}),
			wantErr: "to say where the related object is"},
		{name: "object with two locators", entry: entry(map[string]any{"kind": "Secret", "object": merge(objRef, tmpl)}),
			wantErr: "locate the related object (and its namespace) in exactly one way"},
		{name: "object with three locators", entry: entry(map[string]any{"kind": "Secret", "object": merge(objRef, tmpl, sel)}),
			wantErr: "in exactly one way"},
		{name: "object with no locator", entry: entry(map[string]any{"kind": "Secret", "object": map[string]any{"namespace": tmpl}}),
			wantErr: "in exactly one way"},
		{name: "namespace with two locators", entry: entry(map[string]any{"kind": "Secret", "object": merge(objRef, map[string]any{"namespace": merge(objRef, tmpl)})}),
			wantErr: "in exactly one way"},
		{name: "rewrite with regex and template", entry: entry(map[string]any{"resource": "secrets", "object": map[string]any{"selector": map[string]any{
			"matchLabels": map[string]any{"app": "db"},
			"rewrite":     map[string]any{"template": map[string]any{"template": "x"}, "regex": map[string]any{"pattern": "a", "replacement": "b"}}}}}),
			wantErr: "rewrite sets exactly one of regex"},
		{name: "selector with origin kcp", entry: map[string]any{"identifier": "creds", "origin": "kcp", "resource": "secrets", "object": sel},
			wantErr: "object.selector finds objects by their labels on the service cluster, so it needs origin: service"},
		{name: "namespace selector", entry: entry(map[string]any{"resource": "secrets", "object": merge(objRef, map[string]any{"namespace": sel})}),
			wantErr: "object.namespace.selector is not supported by ferry"},
		{name: "syncStatus with origin service", entry: entry(map[string]any{"kind": "Secret", "reference": ref, "syncStatus": true, "cleanup": false})},
		{name: "syncStatus with origin kcp", entry: map[string]any{"identifier": "creds", "origin": "kcp", "kind": "Secret", "reference": ref, "syncStatus": true},
			wantErr: "syncStatus carries the status of a service-origin related object into kcp"},
		{name: "identityHash", entry: entry(map[string]any{"resource": "things", "group": "other.example", "object": objRef, "identityHash": strings.Repeat("0a", 32)})},
		{name: "identityHash not a hash", entry: entry(map[string]any{"resource": "things", "group": "other.example", "object": objRef, "identityHash": "423ui5gfr8f237"}),
			wantErr: "identityHash is the other APIExport's status.identityHash: 64 lowercase hex characters"},
		{name: "identityHash in uppercase", entry: entry(map[string]any{"resource": "things", "group": "other.example", "object": objRef, "identityHash": strings.Repeat("0A", 32)}),
			wantErr: "64 lowercase hex characters"},
		{name: "identityHash of a core kind", entry: entry(map[string]any{"resource": "secrets", "object": objRef, "identityHash": strings.Repeat("0a", 32)}),
			wantErr: "kinds of the core group (secrets, configmaps) have no identity"},
		{name: "identityHash with an empty group", entry: entry(map[string]any{"kind": "Secret", "group": "", "reference": ref, "identityHash": strings.Repeat("0a", 32)}),
			wantErr: "set group or drop identityHash"},
		{name: "projection", entry: entry(map[string]any{"resource": "secrets", "object": objRef, "projection": map[string]any{"group": "api.example.com", "version": "v2"}})},
		{name: "projection of the resource only", entry: entry(map[string]any{"resource": "configmaps", "object": objRef, "projection": map[string]any{"resource": "secrets"}})},
		{name: "projection with kind", entry: entry(map[string]any{"kind": "Secret", "reference": ref, "projection": map[string]any{"group": "api.example.com"}}),
			wantErr: "projection needs the related resource on the origin side written as resource"},
		{name: "empty projection", entry: entry(map[string]any{"resource": "secrets", "object": objRef, "projection": map[string]any{}}),
			wantErr: "projection sets at least one of group, version and resource"},
		{name: "projection of empty strings", entry: entry(map[string]any{"resource": "secrets", "object": objRef, "projection": map[string]any{"group": "", "resource": ""}}),
			wantErr: "projection sets at least one of group, version and resource"},
		{name: "projection to an uppercase plural", entry: entry(map[string]any{"resource": "secrets", "object": objRef, "projection": map[string]any{"resource": "UserDatabases"}}),
			wantErr: "projection.resource is the lowercase plural"},
		{name: "projection to an invalid group", entry: entry(map[string]any{"resource": "secrets", "object": objRef, "projection": map[string]any{"group": "API.example.com"}}),
			wantErr: "projection.group is an API group in lowercase"},
		{name: "projection to an invalid version", entry: entry(map[string]any{"resource": "secrets", "object": objRef, "projection": map[string]any{"version": "V2"}}),
			wantErr: "projection.version is an API version in lowercase"},
		{name: "mutation", entry: entry(map[string]any{"resource": "secrets", "object": objRef, "mutation": map[string]any{"spec": []any{map[string]any{"delete": map[string]any{"path": "data.x"}}}}})},
		{name: "status mutation without syncStatus", entry: entry(map[string]any{"resource": "secrets", "object": objRef, "mutation": map[string]any{"status": []any{map[string]any{"delete": map[string]any{"path": "status.x"}}}}}),
			wantErr: "mutation.status rewrites the status carried with syncStatus"},
		{name: "status mutation with syncStatus", entry: entry(map[string]any{"resource": "secrets", "object": objRef, "syncStatus": true, "mutation": map[string]any{"status": []any{map[string]any{"delete": map[string]any{"path": "status.x"}}}}})},
		{name: "watch.labelSelector with origin service", entry: entry(map[string]any{"kind": "Secret", "reference": ref,
			"watch": map[string]any{"labelSelector": map[string]any{"matchLabels": map[string]any{"app.kubernetes.io/managed-by": "db-operator"}}}})},
		{name: "watch.labelSelector by expressions", entry: entry(map[string]any{"resource": "secrets", "object": sel,
			"watch": map[string]any{"labelSelector": map[string]any{"matchExpressions": []any{map[string]any{"key": "db", "operator": "Exists"}}}}})},
		{name: "watch.labelSelector with origin kcp", entry: map[string]any{"identifier": "creds", "origin": "kcp", "kind": "Secret", "reference": ref,
			"watch": map[string]any{"labelSelector": map[string]any{"matchLabels": map[string]any{"app": "db"}}}},
			wantErr: "watch narrows what the edge caches of a service-origin related kind on the service cluster; it needs origin: service"},
		{name: "watch.labelSelector with origin platform", entry: map[string]any{"identifier": "creds", "origin": "platform", "kind": "Secret", "reference": ref,
			"watch": map[string]any{"labelSelector": map[string]any{"matchLabels": map[string]any{"app": "db"}}}},
			wantErr: "it needs origin: service"},
		{name: "watch.labelSelector empty", entry: entry(map[string]any{"kind": "Secret", "reference": ref,
			"watch": map[string]any{"labelSelector": map[string]any{}}}),
			wantErr: "watch.labelSelector selects every object when it has neither matchLabels nor matchExpressions"},
		{name: "watch.labelSelector with empty lists", entry: entry(map[string]any{"kind": "Secret", "reference": ref,
			"watch": map[string]any{"labelSelector": map[string]any{"matchLabels": map[string]any{}, "matchExpressions": []any{}}}}),
			wantErr: "watch.labelSelector selects every object"},
		{name: "rewrite empty", entry: entry(map[string]any{"resource": "secrets", "object": map[string]any{"selector": map[string]any{
			"matchLabels": map[string]any{"app": "db"}, "rewrite": map[string]any{}}}}),
			wantErr: "rewrite sets exactly one of regex"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obj := map[string]any{
				"apiVersion": "ferry.dev/v1alpha1", "kind": "PublishedResource",
				"metadata": map[string]any{"name": "widgets"},
				"spec": map[string]any{
					"resource":       map[string]any{"apiGroup": "example.com", "version": "v1", "kind": "Widget"},
					"deletionPolicy": "Orphan",
					"related":        []any{tc.entry},
				},
			}
			errs, _ := validator.Validate(context.Background(), field.NewPath(""), structural, obj, nil, celconfig.RuntimeCELCostBudget)
			if tc.wantErr == "" {
				if len(errs) > 0 {
					t.Fatalf("refused: %v", errs.ToAggregate())
				}
				return
			}
			if len(errs) != 1 {
				t.Fatalf("got %d errors, want 1: %v", len(errs), errs.ToAggregate())
			}
			if msg := errs[0].Error(); !strings.Contains(msg, tc.wantErr) {
				t.Errorf("error %q does not contain %q", msg, tc.wantErr)
			}
		})
	}
}

// Package openapischema turns a built-in kind's OpenAPI v3 schema, as a
// Kubernetes API server publishes it (/openapi/v3/api/v1,
// /openapi/v3/apis/<group>/<version>), into a structural schema a
// CustomResourceDefinition or kcp APIResourceSchema can carry, so a
// built-in kind (ConfigMap, rbac Role, …) of the service cluster can be
// published like a CRD.
//
// The conversion resolves $refs (and the allOf wrappers kube-openapi puts
// around them), keeps what structural schemas allow (types, formats,
// properties, items, additionalProperties, required, enum, bounds,
// patterns, descriptions, scalar defaults and the x-kubernetes-* extensions
// CRDs accept), and drops the rest (object and array defaults, patch
// strategies, unions, the group-version-kind tags). The root's metadata
// becomes a plain object, as CRDs require; a node without a type that
// nothing else describes preserves unknown fields rather than pruning
// them.
package openapischema

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// refPrefix is where kube-openapi's v3 documents keep named schemas.
const refPrefix = "#/components/schemas/"

// maxDepth bounds nesting: a recursive type (none of the built-ins' object
// kinds has one, but an aggregated API may) stops there as an object that
// preserves unknown fields.
const maxDepth = 64

// Schema is a built-in kind's converted schema.
type Schema struct {
	// Props is the structural schema of the whole object.
	Props *apiextensionsv1.JSONSchemaProps
	// HasStatus tells whether the kind has a top-level status field, which
	// built-in kinds serve as a status subresource.
	HasStatus bool
}

// Convert finds gvk in doc (an OpenAPI v3 document of gvk's group and
// version) and converts its schema.
func Convert(doc []byte, gvk schema.GroupVersionKind) (*Schema, error) {
	var parsed struct {
		Components struct {
			Schemas map[string]map[string]any `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(doc, &parsed); err != nil {
		return nil, fmt.Errorf("the OpenAPI document of %s is not valid JSON: %w", gvk.GroupVersion(), err)
	}
	defs := parsed.Components.Schemas
	root, ok := "", false
	// Sorted: the result never depends on map order.
	names := make([]string, 0, len(defs))
	for n := range defs {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if namesKind(defs[n], gvk) {
			root, ok = n, true
			break
		}
	}
	if !ok {
		return nil, fmt.Errorf("the OpenAPI document of %s has no schema for kind %s", gvk.GroupVersion(), gvk.Kind)
	}
	c := converter{defs: defs}
	props, err := c.convert(defs[root], nil, 0)
	if err != nil {
		return nil, fmt.Errorf("schema of %s: %w", gvk, err)
	}
	// CRDs allow no schema for metadata beyond "an object" (the API server
	// validates it itself); apiVersion and kind are plain strings.
	if props.Properties == nil {
		props.Properties = map[string]apiextensionsv1.JSONSchemaProps{}
	}
	props.Type = "object"
	props.Properties["metadata"] = apiextensionsv1.JSONSchemaProps{Type: "object"}
	for _, f := range []string{"apiVersion", "kind"} {
		p := props.Properties[f]
		props.Properties[f] = apiextensionsv1.JSONSchemaProps{Type: "string", Description: p.Description}
	}
	_, hasStatus := props.Properties["status"]
	return &Schema{Props: props, HasStatus: hasStatus}, nil
}

// namesKind tells whether def is tagged as gvk's schema.
func namesKind(def map[string]any, gvk schema.GroupVersionKind) bool {
	tags, _ := def["x-kubernetes-group-version-kind"].([]any)
	for _, t := range tags {
		m, _ := t.(map[string]any)
		if m["group"] == gvk.Group && m["version"] == gvk.Version && m["kind"] == gvk.Kind {
			return true
		}
	}
	return false
}

type converter struct {
	defs map[string]map[string]any
}

// convert converts node; path is the chain of $refs being resolved (a
// repeat is a recursive type).
func (c *converter) convert(node map[string]any, path []string, depth int) (*apiextensionsv1.JSONSchemaProps, error) {
	if depth > maxDepth {
		return preserveUnknown(), nil
	}
	node, path, err := c.resolve(node, path)
	if err != nil {
		return nil, err
	}
	if node == nil {
		return preserveUnknown(), nil // a recursive type
	}
	out := &apiextensionsv1.JSONSchemaProps{}
	out.Type, _ = node["type"].(string)
	out.Format, _ = node["format"].(string)
	out.Description, _ = node["description"].(string)
	out.Pattern, _ = node["pattern"].(string)
	if b, ok := node["nullable"].(bool); ok {
		out.Nullable = b
	}
	for _, n := range []struct {
		key string
		to  **float64
	}{{"minimum", &out.Minimum}, {"maximum", &out.Maximum}, {"multipleOf", &out.MultipleOf}} {
		if f, ok := node[n.key].(float64); ok {
			*n.to = &f
		}
	}
	for _, n := range []struct {
		key string
		to  **int64
	}{{"minLength", &out.MinLength}, {"maxLength", &out.MaxLength}, {"minItems", &out.MinItems}, {"maxItems", &out.MaxItems},
		{"minProperties", &out.MinProperties}, {"maxProperties", &out.MaxProperties}} {
		if f, ok := node[n.key].(float64); ok {
			i := int64(f)
			*n.to = &i
		}
	}
	if b, ok := node["exclusiveMinimum"].(bool); ok {
		out.ExclusiveMinimum = b
	}
	if b, ok := node["exclusiveMaximum"].(bool); ok {
		out.ExclusiveMaximum = b
	}
	if b, ok := node["uniqueItems"].(bool); ok {
		out.UniqueItems = b
	}
	if req, ok := node["required"].([]any); ok {
		for _, r := range req {
			if s, ok := r.(string); ok {
				out.Required = append(out.Required, s)
			}
		}
	}
	if enum, ok := node["enum"].([]any); ok {
		for _, e := range enum {
			raw, err := json.Marshal(e)
			if err != nil {
				return nil, err
			}
			out.Enum = append(out.Enum, apiextensionsv1.JSON{Raw: raw})
		}
	}
	if d, ok := node["default"]; ok && isScalar(d) && inEnum(d, out.Enum) {
		// Object and array defaults ({} and [] in kube-openapi) are left
		// out: they would be applied to every object kcp stores, which
		// the built-in kind does not do. Scalar defaults are kept: list
		// map keys need them (a port's protocol). kube-openapi gives enum
		// strings the zero value "" as default, which their enum does not
		// allow: a default outside the enum is left out.
		raw, err := json.Marshal(d)
		if err != nil {
			return nil, err
		}
		out.Default = &apiextensionsv1.JSON{Raw: raw}
	}
	c.extensions(node, out)

	if props, ok := node["properties"].(map[string]any); ok {
		out.Properties = map[string]apiextensionsv1.JSONSchemaProps{}
		for name, p := range props {
			pm, _ := p.(map[string]any)
			conv, err := c.convert(pm, path, depth+1)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			out.Properties[name] = *conv
		}
	}
	if items, ok := node["items"].(map[string]any); ok {
		conv, err := c.convert(items, path, depth+1)
		if err != nil {
			return nil, fmt.Errorf("items: %w", err)
		}
		out.Items = &apiextensionsv1.JSONSchemaPropsOrArray{Schema: conv}
	}
	switch ap := node["additionalProperties"].(type) {
	case map[string]any:
		conv, err := c.convert(ap, path, depth+1)
		if err != nil {
			return nil, fmt.Errorf("additionalProperties: %w", err)
		}
		out.AdditionalProperties = &apiextensionsv1.JSONSchemaPropsOrBool{Allows: true, Schema: conv}
	case bool:
		if ap && out.Properties == nil {
			out.XPreserveUnknownFields = ptr(true)
		}
	}
	if one, ok := node["oneOf"].([]any); ok && out.Type == "" && stringOrNumber(one) {
		// resource.Quantity: a string or a number.
		out.XIntOrString = true
	}
	structural(out)
	return out, nil
}

// resolve follows node's $ref (directly, or as kube-openapi wraps it in an
// allOf of one, beside a description or default); nil for a recursive type.
func (c *converter) resolve(node map[string]any, path []string) (map[string]any, []string, error) {
	for range maxDepth {
		ref, _ := node["$ref"].(string)
		if ref == "" {
			if all, ok := node["allOf"].([]any); ok && len(all) == 1 {
				if m, ok := all[0].(map[string]any); ok {
					ref, _ = m["$ref"].(string)
				}
			}
		}
		if ref == "" {
			return node, path, nil
		}
		name, ok := strings.CutPrefix(ref, refPrefix)
		if !ok {
			return nil, nil, fmt.Errorf("unsupported $ref %q", ref)
		}
		def, ok := c.defs[name]
		if !ok {
			return nil, nil, fmt.Errorf("$ref %q names no schema of the document", ref)
		}
		if slices.Contains(path, name) {
			return nil, path, nil
		}
		// The referring node's description wins (it is the field's own).
		merged := make(map[string]any, len(def)+1)
		for k, v := range def {
			merged[k] = v
		}
		if d, ok := node["description"]; ok {
			merged["description"] = d
		}
		if d, ok := node["default"]; ok {
			merged["default"] = d
		}
		node, path = merged, append(slices.Clone(path), name)
	}
	return nil, nil, fmt.Errorf("$refs nested deeper than %d", maxDepth)
}

// extensions copies the x-kubernetes-* extensions CRD schemas accept.
func (c *converter) extensions(node map[string]any, out *apiextensionsv1.JSONSchemaProps) {
	if b, ok := node["x-kubernetes-int-or-string"].(bool); ok && b {
		out.XIntOrString = true
	}
	if b, ok := node["x-kubernetes-preserve-unknown-fields"].(bool); ok && b {
		out.XPreserveUnknownFields = ptr(true)
	}
	if b, ok := node["x-kubernetes-embedded-resource"].(bool); ok && b {
		out.XEmbeddedResource = true
	}
	if s, ok := node["x-kubernetes-list-type"].(string); ok {
		out.XListType = &s
	}
	if keys, ok := node["x-kubernetes-list-map-keys"].([]any); ok {
		for _, k := range keys {
			if s, ok := k.(string); ok {
				out.XListMapKeys = append(out.XListMapKeys, s)
			}
		}
	}
	if s, ok := node["x-kubernetes-map-type"].(string); ok {
		out.XMapType = &s
	}
}

// structural makes out a node of a structural schema: a type wherever one
// is needed, no format on int-or-string, list map keys required or
// defaulted.
func structural(out *apiextensionsv1.JSONSchemaProps) {
	if out.XIntOrString {
		out.Type, out.Format = "", ""
		return
	}
	if out.Type == "" {
		switch {
		case out.Properties != nil || out.AdditionalProperties != nil:
			out.Type = "object"
		case out.Items != nil:
			out.Type = "array"
		default:
			// Nothing says what it is (runtime.RawExtension and the
			// like): kept as it comes, not pruned.
			out.Type = "object"
			out.XPreserveUnknownFields = ptr(true)
		}
	}
	if out.Type == "object" && out.Properties == nil && out.AdditionalProperties == nil && out.XPreserveUnknownFields == nil {
		// An object with no declared fields (FieldsV1, RawExtension) keeps
		// its content: pruning would empty it.
		out.XPreserveUnknownFields = ptr(true)
	}
	if out.Type == "array" && out.Items == nil {
		out.Items = &apiextensionsv1.JSONSchemaPropsOrArray{Schema: preserveUnknown()}
	}
	if out.XListType != nil && *out.XListType == "map" && out.Items != nil && out.Items.Schema != nil {
		item := out.Items.Schema
		for _, k := range out.XListMapKeys {
			p, ok := item.Properties[k]
			if ok && p.Default == nil && !slices.Contains(item.Required, k) {
				// A map key must be required or defaulted in a CRD; the
				// built-in's API server defaults it in code instead.
				// Treated as a set of items then.
				out.XListType, out.XListMapKeys = ptr("atomic"), nil
				break
			}
		}
	}
}

// inEnum tells whether v is one of enum's values (any value when enum is
// empty).
func inEnum(v any, enum []apiextensionsv1.JSON) bool {
	if len(enum) == 0 {
		return true
	}
	raw, err := json.Marshal(v)
	if err != nil {
		return false
	}
	for _, e := range enum {
		if string(e.Raw) == string(raw) {
			return true
		}
	}
	return false
}

func isScalar(v any) bool {
	switch v.(type) {
	case string, float64, bool:
		return true
	}
	return false
}

// stringOrNumber tells whether one is [string, number|integer].
func stringOrNumber(one []any) bool {
	var types []string
	for _, o := range one {
		m, _ := o.(map[string]any)
		t, _ := m["type"].(string)
		types = append(types, t)
	}
	slices.Sort(types)
	return slices.Equal(types, []string{"integer", "string"}) || slices.Equal(types, []string{"number", "string"})
}

func preserveUnknown() *apiextensionsv1.JSONSchemaProps {
	return &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptr(true)}
}

func ptr[T any](v T) *T { return &v }

package openapischema

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// TestConvert converts kinds of a document shaped like kube-openapi's v3
// output: every result is a structural schema (as CRDs and
// APIResourceSchemas need), and each case's fields come out as the table
// says.
func TestConvert(t *testing.T) {
	doc, err := os.ReadFile("testdata/sample.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		gvk       schema.GroupVersionKind
		hasStatus bool
		// want maps a path (dot-separated properties, [] for items, {} for
		// additionalProperties) to the JSON of the expected node, compared
		// on the keys it names.
		want map[string]string
		// absent are paths that must not exist.
		absent []string
		err    string
	}{
		{name: "ConfigMap", gvk: schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"},
			want: map[string]string{
				"":              `{"type":"object","description":"ConfigMap holds configuration data for pods to consume."}`,
				"metadata":      `{"type":"object"}`,
				"apiVersion":    `{"type":"string","description":"APIVersion defines the versioned schema."}`,
				"immutable":     `{"type":"boolean"}`,
				"data":          `{"type":"object"}`,
				"data.{}":       `{"type":"string","default":""}`,
				"binaryData.{}": `{"type":"string","format":"byte"}`,
			},
			absent: []string{"status", "metadata.name"},
		},
		{name: "rbac Role, through allOf $refs", gvk: schema.GroupVersionKind{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "Role"},
			want: map[string]string{
				"rules":             `{"type":"array","x-kubernetes-list-type":"atomic"}`,
				"rules.[]":          `{"type":"object","required":["verbs"]}`,
				"rules.[].verbs.[]": `{"type":"string","default":""}`,
			},
		},
		{name: "quantities, int-or-string, list maps, raw extensions, recursion", gvk: schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Workload"}, hasStatus: true,
			want: map[string]string{
				"spec":                        `{"type":"object"}`,
				"spec.memory":                 `{"x-kubernetes-int-or-string":true,"description":"Quantity is a fixed-point representation of a number."}`,
				"spec.maxUnavailable":         `{"x-kubernetes-int-or-string":true}`,
				"spec.ports":                  `{"type":"array","x-kubernetes-list-type":"map","x-kubernetes-list-map-keys":["containerPort","protocol"]}`,
				"spec.ports.[].containerPort": `{"type":"integer","format":"int32","minimum":1,"maximum":65535}`,
				"spec.ports.[].protocol":      `{"type":"string","default":"TCP"}`,
				// kube-openapi's "" default of an enum string it does
				// not allow: left out.
				"spec.ports.[].effect": `{"type":"string","enum":["NoExecute","NoSchedule"],"default":null}`,
				// ip is neither required nor defaulted: not a valid map key
				// in a CRD, so the list is atomic.
				"spec.hosts":      `{"type":"array","x-kubernetes-list-type":"atomic"}`,
				"spec.template":   `{"type":"object","x-kubernetes-preserve-unknown-fields":true}`,
				"spec.selector":   `{"type":"object","x-kubernetes-map-type":"atomic"}`,
				"spec.policy":     `{"type":"string","enum":["Always","Never"],"default":"Always"}`,
				"spec.next":       `{"type":"object","x-kubernetes-preserve-unknown-fields":true}`,
				"spec.tags.[]":    `{"type":"object","x-kubernetes-preserve-unknown-fields":true}`,
				"status.replicas": `{"type":"integer","format":"int32"}`,
			},
		},
		{name: "a kind the document lacks", gvk: schema.GroupVersionKind{Version: "v1", Kind: "Secret"}, err: "has no schema for kind Secret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Convert(doc, tc.gvk)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.HasStatus != tc.hasStatus {
				t.Errorf("HasStatus %v, want %v", got.HasStatus, tc.hasStatus)
			}
			assertStructural(t, got.Props)
			for path, want := range tc.want {
				node := lookup(got.Props, path)
				if node == nil {
					t.Errorf("%q: missing", path)
					continue
				}
				var wantMap map[string]any
				if err := json.Unmarshal([]byte(want), &wantMap); err != nil {
					t.Fatal(err)
				}
				raw, _ := json.Marshal(node)
				var gotMap map[string]any
				_ = json.Unmarshal(raw, &gotMap)
				for k, v := range wantMap {
					gv, _ := json.Marshal(gotMap[k])
					wv, _ := json.Marshal(v)
					if string(gv) != string(wv) {
						t.Errorf("%q.%s = %s, want %s", path, k, gv, wv)
					}
				}
			}
			for _, path := range tc.absent {
				if lookup(got.Props, path) != nil {
					t.Errorf("%q: present, want it absent", path)
				}
			}
			if raw, _ := json.Marshal(got.Props); strings.Contains(string(raw), "patch") || strings.Contains(string(raw), "group-version-kind") {
				t.Errorf("patch strategies or kind tags kept: %s", raw)
			}
		})
	}
}

// assertStructural fails unless props is a structural schema by the API
// server's own rules.
func assertStructural(t *testing.T, props *apiextensionsv1.JSONSchemaProps) {
	t.Helper()
	var internal apiextensions.JSONSchemaProps
	if err := apiextensionsv1.Convert_v1_JSONSchemaProps_To_apiextensions_JSONSchemaProps(props, &internal, nil); err != nil {
		t.Fatal(err)
	}
	s, err := structuralschema.NewStructural(&internal)
	if err != nil {
		t.Fatalf("not structural: %v", err)
	}
	if errs := structuralschema.ValidateStructural(field.NewPath("schema"), s); len(errs) > 0 {
		t.Fatalf("not structural: %v", errs.ToAggregate())
	}
}

// lookup follows a path of TestConvert's form.
func lookup(p *apiextensionsv1.JSONSchemaProps, path string) *apiextensionsv1.JSONSchemaProps {
	if path == "" {
		return p
	}
	for _, part := range strings.Split(path, ".") {
		switch {
		case p == nil:
			return nil
		case part == "[]":
			if p.Items == nil {
				return nil
			}
			p = p.Items.Schema
		case part == "{}":
			if p.AdditionalProperties == nil {
				return nil
			}
			p = p.AdditionalProperties.Schema
		default:
			next, ok := p.Properties[part]
			if !ok {
				return nil
			}
			p = &next
		}
	}
	return p
}

// TestResourceOf reads plural and scope from a document's paths: the
// plain read of one object, not its list or a subresource.
func TestResourceOf(t *testing.T) {
	doc, err := os.ReadFile("testdata/sample.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		gvk        schema.GroupVersionKind
		plural     string
		namespaced bool
		err        string
	}{
		{gvk: schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}, plural: "configmaps", namespaced: true},
		{gvk: schema.GroupVersionKind{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "Role"}, plural: "roles", namespaced: true},
		{gvk: schema.GroupVersionKind{Group: "apps", Version: "v1", Kind: "Workload"}, plural: "workloads"},
		{gvk: schema.GroupVersionKind{Version: "v1", Kind: "Secret"}, err: "no path that reads a Secret"},
	} {
		t.Run(tc.gvk.Kind, func(t *testing.T) {
			plural, namespaced, err := ResourceOf(doc, tc.gvk)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || plural != tc.plural || namespaced != tc.namespaced {
				t.Fatalf("%q namespaced=%v (%v), want %q namespaced=%v", plural, namespaced, err, tc.plural, tc.namespaced)
			}
		})
	}
}

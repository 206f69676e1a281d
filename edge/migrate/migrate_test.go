package migrate

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/ferry-dev/ferry/deploy/crd"
)

var update = flag.Bool("update", false, "rewrite the golden files")

func converter(t *testing.T) *Converter {
	t.Helper()
	var def apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(crd.PublishedResource, &def); err != nil {
		t.Fatal(err)
	}
	c, err := NewConverter(&def)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestGolden converts the documents of testdata/*.yaml and compares the
// output (documents with their change comments) with testdata/*.golden.
func TestGolden(t *testing.T) {
	inputs, err := filepath.Glob("testdata/*.yaml")
	if err != nil || len(inputs) == 0 {
		t.Fatalf("no inputs: %v", err)
	}
	c := converter(t)
	for _, in := range inputs {
		t.Run(filepath.Base(in), func(t *testing.T) {
			f, err := os.Open(in)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			docs, err := ReadDocuments(f)
			if err != nil {
				t.Fatal(err)
			}
			var results []Result
			for _, d := range docs {
				r, err := c.Convert(d)
				if err != nil {
					t.Fatal(err)
				}
				results = append(results, r)
			}
			var out bytes.Buffer
			if err := Write(&out, results); err != nil {
				t.Fatal(err)
			}
			golden := strings.TrimSuffix(in, ".yaml") + ".golden"
			if *update {
				if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(want, out.Bytes()) {
				t.Errorf("output differs from %s (run with -update after checking):\n%s", golden, out.String())
			}
		})
	}
}

func TestConvert(t *testing.T) {
	c := converter(t)
	tests := []struct {
		name      string
		doc       string
		wantErr   string
		wantLossy []string // paths
		wantPath  map[string]any
		wantJSON  string // a part of the result, as JSON
	}{{
		name:    "not a PublishedResource",
		doc:     "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: x}",
		wantErr: `ConfigMap "x" is not a PublishedResource`,
	}, {
		name:    "unknown apiVersion",
		doc:     "apiVersion: example.com/v1\nkind: PublishedResource\nmetadata: {name: x}",
		wantErr: "has apiVersion example.com/v1; ferry migrates syncagent.kcp.io/v1alpha1 and services.kdp.k8c.io/v1alpha1",
	}, {
		name: "nothing lossy",
		doc:  "apiVersion: syncagent.kcp.io/v1alpha1\nkind: PublishedResource\nmetadata: {name: x}\nspec: {resource: {apiGroup: g, kind: K, version: v1}}",
	}, {
		name:      "rudi dropped, regex kept",
		doc:       "apiVersion: services.kdp.k8c.io/v1alpha1\nkind: PublishedResource\nmetadata: {name: x}\nspec: {resource: {apiGroup: g, kind: K, version: v1}, mutation: {spec: [{rudi: {script: s}}, {delete: {path: spec.a}}]}}",
		wantLossy: []string{"spec.mutation.spec[0].rudi"},
	}, {
		name:      "related fields ferry refuses",
		doc:       "apiVersion: syncagent.kcp.io/v1alpha1\nkind: PublishedResource\nmetadata: {name: x}\nspec: {resource: {apiGroup: g, kind: K, version: v1}, related: [{identifier: a, origin: service, resource: things, object: {reference: {path: spec.s}}, mutation: {status: [{rudi: {script: s}}]}}]}",
		wantLossy: []string{"spec.related[0].mutation.status[0].rudi"},
	}, {
		name:     "related mutation carried over",
		doc:      "apiVersion: syncagent.kcp.io/v1alpha1\nkind: PublishedResource\nmetadata: {name: x}\nspec: {resource: {apiGroup: g, kind: K, version: v1}, related: [{identifier: a, origin: kcp, kind: Secret, object: {reference: {path: spec.users.#.name}}, mutation: {spec: [{regex: {path: data.x, pattern: a, replacement: b}}]}}]}",
		wantJSON: `"mutation":{"spec":[{"regex":{"path":"data.x","pattern":"a","replacement":"b"}}]}`,
	}, {
		name:      "related status mutation needs syncStatus",
		doc:       "apiVersion: syncagent.kcp.io/v1alpha1\nkind: PublishedResource\nmetadata: {name: x}\nspec: {resource: {apiGroup: g, kind: K, version: v1}, related: [{identifier: a, origin: kcp, kind: Secret, object: {reference: {path: spec.s}}, mutation: {status: [{delete: {path: status.x}}]}}]}",
		wantLossy: []string{"spec.related[0].mutation.status"},
	}, {
		name:     "related identityHash carried over",
		doc:      "apiVersion: syncagent.kcp.io/v1alpha1\nkind: PublishedResource\nmetadata: {name: x}\nspec: {resource: {apiGroup: g, kind: K, version: v1}, related: [{identifier: a, origin: kcp, group: other.example.com, resource: things, identityHash: abc, object: {reference: {path: spec.s}}}]}",
		wantPath: map[string]any{"identityHash": "abc"},
	}, {
		name:      "top-level junk",
		doc:       "apiVersion: syncagent.kcp.io/v1alpha1\nkind: PublishedResource\nmetadata: {name: x}\nspec: {resource: {apiGroup: g, kind: K, version: v1}}\nextra: 1",
		wantLossy: []string{"extra"},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var doc map[string]any
			if err := yaml.Unmarshal([]byte(tt.doc), &doc); err != nil {
				t.Fatal(err)
			}
			r, err := c.Convert(doc)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var lossy []string
			for _, ch := range r.Changes {
				if ch.Kind == Lossy {
					lossy = append(lossy, ch.Path)
				}
			}
			if strings.Join(lossy, ",") != strings.Join(tt.wantLossy, ",") {
				t.Errorf("lossy %v, want %v", lossy, tt.wantLossy)
			}
			if r.Lossy() != (len(tt.wantLossy) > 0) {
				t.Errorf("Lossy() = %v", r.Lossy())
			}
			if tt.wantJSON != "" {
				data, err := json.Marshal(r.Object)
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(string(data), tt.wantJSON) {
					t.Errorf("result %s lacks %s", data, tt.wantJSON)
				}
			}
			if r.Object["apiVersion"] != "ferry.dev/v1alpha1" {
				t.Errorf("apiVersion %v", r.Object["apiVersion"])
			}
			// wantPath: fields of the first related entry, as written.
			for k, want := range tt.wantPath {
				spec, _ := r.Object["spec"].(map[string]any)
				related, _ := spec["related"].([]any)
				if len(related) == 0 {
					t.Fatalf("no spec.related in %v", r.Object)
				}
				if got := related[0].(map[string]any)[k]; got != want {
					t.Errorf("spec.related[0].%s = %v, want %v", k, got, want)
				}
			}
		})
	}
}

// TestAdoption: with an Adoption, api-syncagent's PublishedResources take
// over its copies (spec.adopt, and its namespaces allowed); the servlet's
// are left as they are (the servlet's copies carry no labels to prove them).
func TestAdoption(t *testing.T) {
	c := converter(t)
	c.Adopt(Adoption{AgentName: "old", StateNamespace: "state"})
	for _, tc := range []struct {
		doc       string
		wantAdopt bool
	}{
		{doc: "apiVersion: syncagent.kcp.io/v1alpha1\nkind: PublishedResource\nmetadata: {name: x}\nspec: {resource: {apiGroup: g, kind: K, version: v1}, naming: {namespace: kube-system}}", wantAdopt: true},
		{doc: "apiVersion: services.kdp.k8c.io/v1alpha1\nkind: PublishedResource\nmetadata: {name: x}\nspec: {resource: {apiGroup: g, kind: K, version: v1}}"},
	} {
		var doc map[string]any
		if err := yaml.Unmarshal([]byte(tc.doc), &doc); err != nil {
			t.Fatal(err)
		}
		r, err := c.Convert(doc)
		if err != nil {
			t.Fatal(err)
		}
		spec := r.Object["spec"].(map[string]any)
		adopt, ok := spec["adopt"].(map[string]any)
		if ok != tc.wantAdopt {
			t.Fatalf("%s: spec.adopt %v, want set %v", r.From, spec["adopt"], tc.wantAdopt)
		}
		if !ok {
			continue
		}
		if adopt["from"] != "APISyncAgent" || adopt["agentName"] != "old" || adopt["stateNamespace"] != "state" {
			t.Errorf("spec.adopt = %v", adopt)
		}
		n := spec["naming"].(map[string]any)
		if n["allowExistingNamespaces"] != true || n["namespace"] != "kube-system" {
			t.Errorf("spec.naming = %v, want the rule kept and existing namespaces allowed", n)
		}
	}
}

// TestConvertCarriesRelatedProjection: a related entry's projection is
// ferry's too now; it is carried over as written, not dropped as lossy.
func TestConvertCarriesRelatedProjection(t *testing.T) {
	c := converter(t)
	var doc map[string]any
	if err := yaml.Unmarshal([]byte("apiVersion: syncagent.kcp.io/v1alpha1\nkind: PublishedResource\nmetadata: {name: x}\n"+
		"spec: {resource: {apiGroup: g, kind: K, version: v1}, related: [{identifier: db, origin: service, group: db.corp.example, version: v1alpha1, resource: userdatabases, "+
		"projection: {group: api.example.com, version: v2}, object: {reference: {path: spec.db}}}]}"), &doc); err != nil {
		t.Fatal(err)
	}
	r, err := c.Convert(doc)
	if err != nil {
		t.Fatal(err)
	}
	if r.Lossy() {
		t.Errorf("lossy: %v", r.Changes)
	}
	spec, _ := r.Object["spec"].(map[string]any)
	rel, _ := spec["related"].([]any)
	if len(rel) != 1 {
		t.Fatalf("related = %v", spec["related"])
	}
	p, _ := rel[0].(map[string]any)["projection"].(map[string]any)
	if p["group"] != "api.example.com" || p["version"] != "v2" {
		t.Errorf("projection = %v, want group api.example.com and version v2", p)
	}
}

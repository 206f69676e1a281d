package mutation

import (
	"crypto/sha3"
	"encoding/hex"
	"reflect"
	"strings"
	"testing"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/templating"
)

func object() map[string]any {
	return map[string]any{
		"metadata": map[string]any{"name": "db1", "namespace": "team-a"},
		"spec":     map[string]any{"secretName": "db1-creds", "size": int64(2), "debug": true},
	}
}

func TestApply(t *testing.T) {
	tests := []struct {
		name    string
		muts    []ferryv1alpha1.ResourceMutation
		objs    Objects
		check   map[string]any // path → value (nil = absent)
		wantErr string
	}{
		{
			name:  "delete",
			muts:  []ferryv1alpha1.ResourceMutation{{Delete: &ferryv1alpha1.DeleteMutation{Path: "spec.debug"}}},
			check: map[string]any{"debug": nil},
		},
		{
			name:  "regex rewrite",
			muts:  []ferryv1alpha1.ResourceMutation{{Regex: &ferryv1alpha1.RegexMutation{Path: "spec.secretName", Pattern: "^(.*)-creds$", Replacement: "local-$1"}}},
			check: map[string]any{"secretName": "local-db1"},
		},
		{
			name:  "regex replacement written as the ancestors do (\\1)",
			muts:  []ferryv1alpha1.ResourceMutation{{Regex: &ferryv1alpha1.RegexMutation{Path: "spec.secretName", Pattern: "^(.*)-creds$", Replacement: `local-\1`}}},
			check: map[string]any{"secretName": "local-db1"},
		},
		{
			name:  "regex with empty pattern injects a static value",
			muts:  []ferryv1alpha1.ResourceMutation{{Regex: &ferryv1alpha1.RegexMutation{Path: "spec.region", Replacement: "eu-west"}}},
			check: map[string]any{"region": "eu-west"},
		},
		{
			name: "template sees the object and the remote",
			muts: []ferryv1alpha1.ResourceMutation{{Template: &ferryv1alpha1.TemplateMutation{
				Path: "spec.owner", Template: "{{ .Remote.metadata.namespace }}/{{ .Object.metadata.name }}",
			}}},
			objs:  Objects{Remote: map[string]any{"metadata": map[string]any{"namespace": "kcp-ns"}}},
			check: map[string]any{"owner": "kcp-ns/db1"},
		},
		{
			name: "the seeds' template: the local namespace through the typed view",
			muts: []ferryv1alpha1.ResourceMutation{{Template: &ferryv1alpha1.TemplateMutation{
				Path: "spec.owner", Template: "{{ .LocalObject.ObjectMeta.Namespace }}",
			}}},
			objs:  Objects{Local: map[string]any{"metadata": map[string]any{"namespace": "local-ns"}}},
			check: map[string]any{"owner": "local-ns"},
		},
		{
			name: "the seeds' template before the local copy exists: the copy being written",
			muts: []ferryv1alpha1.ResourceMutation{{Template: &ferryv1alpha1.TemplateMutation{
				Path: "spec.owner", Template: "{{ .LocalObject.ObjectMeta.Namespace }}",
			}}},
			check: map[string]any{"owner": "team-a"},
		},
		{
			name: "api-syncagent's data and functions, output trimmed",
			muts: []ferryv1alpha1.ResourceMutation{{Template: &ferryv1alpha1.TemplateMutation{
				Path: "spec.secretName", Template: " {{ .Object.metadata.name }}-{{ .Value | sha3short 6 }}\n",
			}}},
			check: map[string]any{"secretName": "db1-" + sha3hex("db1-creds")[:6]},
		},
		{
			name:  "cel computes from self",
			muts:  []ferryv1alpha1.ResourceMutation{{CEL: &ferryv1alpha1.CELMutation{Path: "spec.size", Expression: "self * 10"}}},
			check: map[string]any{"size": int64(20)},
		},
		{
			name:  "cel builds a string from the object",
			muts:  []ferryv1alpha1.ResourceMutation{{CEL: &ferryv1alpha1.CELMutation{Path: "spec.label", Expression: `object.metadata.name + "-" + string(object.spec.size)`}}},
			check: map[string]any{"label": "db1-2"},
		},
		{
			name: "steps run in order",
			muts: []ferryv1alpha1.ResourceMutation{
				{Regex: &ferryv1alpha1.RegexMutation{Path: "spec.secretName", Pattern: "creds", Replacement: "secret"}},
				{CEL: &ferryv1alpha1.CELMutation{Path: "spec.secretName", Expression: "self.upperAscii()"}},
			},
			check: map[string]any{"secretName": "DB1-SECRET"},
		},
		{
			name:    "regex on a path that matches nothing",
			muts:    []ferryv1alpha1.ResourceMutation{{Regex: &ferryv1alpha1.RegexMutation{Path: "spec.nothing", Pattern: "a", Replacement: "b"}}},
			wantErr: "spec.mutation.spec[0].regex (path spec.nothing)",
		},
		{
			name:    "cel runtime error",
			muts:    []ferryv1alpha1.ResourceMutation{{CEL: &ferryv1alpha1.CELMutation{Path: "spec.x", Expression: "object.spec.missing + 1"}}},
			wantErr: "spec.mutation.spec[0].cel",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, err := Compile("spec.mutation.spec", tt.muts)
			if err != nil {
				t.Fatal(err)
			}
			obj := object()
			err = m.Apply(obj, tt.objs)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("want an error mentioning %q, got %v", tt.wantErr, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			spec := obj["spec"].(map[string]any)
			for k, want := range tt.check {
				got, found := spec[k]
				if want == nil {
					if found {
						t.Errorf("spec.%s = %v, want it gone", k, got)
					}
					continue
				}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("spec.%s = %#v, want %#v", k, got, want)
				}
			}
		})
	}
}

func sha3hex(s string) string {
	sum := sha3.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestCheck: template mutations that fail on every object are refused at
// publish time; one reading a field the sample lacks is not.
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name, template, wantErr string
	}{
		{name: "seeds", template: "{{ .LocalObject.ObjectMeta.Namespace }}"},
		{name: "a field the sample lacks", template: "{{ .Object.spec.secretName }}"},
		{name: "data that does not exist", template: "{{ .LocalObj.metadata.name }}", wantErr: "spec.mutation.spec[0].template.template"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := Compile("spec.mutation.spec", []ferryv1alpha1.ResourceMutation{{Template: &ferryv1alpha1.TemplateMutation{Path: "spec.x", Template: tc.template}}})
			if err != nil {
				t.Fatal(err)
			}
			err = m.Check(templating.SampleData("example.com/v1", "Widget", true))
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Check = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestCompileErrors(t *testing.T) {
	tests := []struct {
		name string
		mut  ferryv1alpha1.ResourceMutation
		want string
	}{
		{name: "nothing set", mut: ferryv1alpha1.ResourceMutation{}, want: "exactly one"},
		{name: "two set", mut: ferryv1alpha1.ResourceMutation{Delete: &ferryv1alpha1.DeleteMutation{Path: "a"}, CEL: &ferryv1alpha1.CELMutation{Path: "a", Expression: "1"}}, want: "exactly one"},
		{name: "bad regex", mut: ferryv1alpha1.ResourceMutation{Regex: &ferryv1alpha1.RegexMutation{Path: "a", Pattern: "(unclosed"}}, want: "regex.pattern"},
		{name: "bad template", mut: ferryv1alpha1.ResourceMutation{Template: &ferryv1alpha1.TemplateMutation{Path: "a", Template: "{{ .X "}}, want: "template.template"},
		{name: "CEL type error", mut: ferryv1alpha1.ResourceMutation{CEL: &ferryv1alpha1.CELMutation{Path: "a", Expression: `1 + "a"`}}, want: "cel.expression"},
		{name: "bad path", mut: ferryv1alpha1.ResourceMutation{Delete: &ferryv1alpha1.DeleteMutation{Path: "a..b"}}, want: "delete.path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Compile("spec.mutation.spec", []ferryv1alpha1.ResourceMutation{tt.mut})
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "spec.mutation.spec[0]") {
				t.Fatalf("want an error at spec.mutation.spec[0] mentioning %q, got %v", tt.want, err)
			}
		})
	}
}

func FuzzRegexMutation(f *testing.F) {
	f.Add("spec.secretName", "(.*)-creds", "x-$1")
	f.Add("spec", "", "static")
	f.Fuzz(func(t *testing.T, path, pattern, replacement string) {
		m, err := Compile("m", []ferryv1alpha1.ResourceMutation{{Regex: &ferryv1alpha1.RegexMutation{Path: path, Pattern: pattern, Replacement: replacement}}})
		if err != nil {
			return
		}
		_ = m.Apply(object(), Objects{})
	})
}

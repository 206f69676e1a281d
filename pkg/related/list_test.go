package related

import (
	"reflect"
	"strings"
	"testing"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/mutation"
	"github.com/ferry-dev/ferry/pkg/templating"
)

func TestLocateList(t *testing.T) {
	objectRef := func(path string, re *ferryv1alpha1.RegexReplacement) ferryv1alpha1.RelatedResourceSpec {
		return ferryv1alpha1.RelatedResourceSpec{Origin: ferryv1alpha1.OriginService, Resource: "secrets",
			Object: &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
				Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: path, Regex: re}}}}
	}
	users := func(names ...any) map[string]any {
		items := make([]any, 0, len(names))
		for _, n := range names {
			items = append(items, map[string]any{"name": n})
		}
		return map[string]any{"metadata": map[string]any{"name": "db", "namespace": "team-a"},
			"spec": map[string]any{"users": items, "names": names}}
	}
	tests := []struct {
		name      string
		spec      ferryv1alpha1.RelatedResourceSpec
		obj       map[string]any
		wantNames []string
		wantErr   string
	}{
		{name: "ferry's reference, items' field", spec: spec(ferryv1alpha1.ResourceLocator{Path: "spec.users.#.name"}, nil),
			obj: users("alice", "bob"), wantNames: []string{"alice", "bob"}},
		{name: "api-syncagent's object.reference with a regex on each", spec: objectRef("spec.users.#.name",
			&ferryv1alpha1.RegexReplacement{Pattern: "^(.*)$", Replacement: `\1-creds`}),
			obj: users("alice", "bob"), wantNames: []string{"alice-creds", "bob-creds"}},
		{name: "a list of strings", spec: objectRef("spec.names.#", nil), obj: users("a", "b", "c"), wantNames: []string{"a", "b", "c"}},
		{name: "no list: no objects", spec: objectRef("spec.others.#.name", nil), obj: users(), wantNames: []string{}},
		{name: "an empty list", spec: objectRef("spec.users.#.name", nil), obj: users(), wantNames: []string{}},
		{name: "one name twice", spec: objectRef("spec.users.#.name", nil), obj: users("a", "b", "a"),
			wantErr: `gives "a" for items 0 and 2; each item must name its own object`},
		{name: "an invalid name", spec: objectRef("spec.users.#.name", nil), obj: users("a", "B_"),
			wantErr: `gives "B_" for item 1, which is not a valid name`},
		{name: "an empty name", spec: objectRef("spec.users.#.name", nil), obj: users("a", ""),
			wantErr: `gives an empty name for item 1`},
		{name: "an item without the field", spec: objectRef("spec.users.#.name", nil),
			obj:     map[string]any{"metadata": map[string]any{"namespace": "x"}, "spec": map[string]any{"users": []any{map[string]any{"nick": "a"}}}},
			wantErr: `related "secrets": object.reference: spec.users.#.name: item 0`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			refs, err := Compile([]ferryv1alpha1.RelatedResourceSpec{tt.spec})
			if err != nil {
				t.Fatalf("Compile: %v", err)
			}
			ref := refs[0]
			if !ref.IsList() {
				t.Fatal("IsList = false")
			}
			if _, _, err := ref.Locate(tt.obj, Env{Side: ferryv1alpha1.OriginService}); err == nil {
				t.Error("Locate of a list reference: no error")
			}
			ns, names, err := ref.LocateList(tt.obj, Env{Side: ferryv1alpha1.OriginService})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ns != tt.obj["metadata"].(map[string]any)["namespace"] || !reflect.DeepEqual(names, tt.wantNames) {
				t.Errorf("LocateList = %s %#v, want %#v", ns, names, tt.wantNames)
			}
		})
	}
	refs, err := Compile([]ferryv1alpha1.RelatedResourceSpec{spec(ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}, nil)})
	if err != nil {
		t.Fatal(err)
	}
	if refs[0].IsList() {
		t.Error("a path without # is a list")
	}
	if _, _, err := refs[0].LocateList(primary(), Env{}); err == nil {
		t.Error("LocateList of a scalar reference: no error")
	}
}

func TestMutate(t *testing.T) {
	s := spec(ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}, nil)
	s.SyncStatus = true
	s.Mutation = &ferryv1alpha1.ResourceMutationSpec{
		Spec: []ferryv1alpha1.ResourceMutation{
			{Regex: &ferryv1alpha1.RegexMutation{Path: "data.user", Pattern: "^(.*)$", Replacement: `\1-x`}},
			{CEL: &ferryv1alpha1.CELMutation{Path: "metadata.labels.from", Expression: "'service'"}},
			{Delete: &ferryv1alpha1.DeleteMutation{Path: "data.internal"}},
		},
		Status: []ferryv1alpha1.ResourceMutation{{Delete: &ferryv1alpha1.DeleteMutation{Path: "status.secretRef"}}},
	}
	refs, err := Compile([]ferryv1alpha1.RelatedResourceSpec{s})
	if err != nil {
		t.Fatal(err)
	}
	ref := refs[0]
	if !ref.Mutates() {
		t.Fatal("Mutates = false")
	}
	obj := map[string]any{"data": map[string]any{"user": "u", "internal": "i"}}
	if err := ref.MutateContent(obj, mutation.Objects{Local: obj}); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"data": map[string]any{"user": "u-x"}, "metadata": map[string]any{"labels": map[string]any{"from": "service"}}}
	if !reflect.DeepEqual(obj, want) {
		t.Errorf("MutateContent = %v, want %v", obj, want)
	}
	st := map[string]any{"status": map[string]any{"ready": true, "secretRef": "x"}}
	if err := ref.MutateStatus(st, mutation.Objects{Local: st}); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(st, map[string]any{"status": map[string]any{"ready": true}}) {
		t.Errorf("MutateStatus = %v", st)
	}
	bad := map[string]any{"data": map[string]any{"user": map[string]any{}}}
	if err := ref.MutateContent(bad, mutation.Objects{Local: bad}); err == nil || !strings.Contains(err.Error(), `related "creds": mutation.spec[0].regex`) {
		t.Errorf("a step that cannot apply: error = %v", err)
	}

	plain, err := Compile([]ferryv1alpha1.RelatedResourceSpec{spec(ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}, nil)})
	if err != nil {
		t.Fatal(err)
	}
	if plain[0].Mutates() || plain[0].MutateContent(obj, mutation.Objects{Local: obj}) != nil || plain[0].MutateStatus(st, mutation.Objects{Local: st}) != nil {
		t.Error("an entry without mutation mutates")
	}
}

func TestCheckMutation(t *testing.T) {
	for _, tc := range []struct {
		template string
		wantErr  string
	}{
		{template: "{{ .Object.metadata.name }}-x"},
		{template: "{{ .NoSuchField }}", wantErr: "mutation.spec[0].template"},
	} {
		s := spec(ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}, nil)
		s.Mutation = &ferryv1alpha1.ResourceMutationSpec{Spec: []ferryv1alpha1.ResourceMutation{
			{Template: &ferryv1alpha1.TemplateMutation{Path: "metadata.labels.x", Template: tc.template}}}}
		refs, err := Compile([]ferryv1alpha1.RelatedResourceSpec{s})
		if err != nil {
			t.Fatal(err)
		}
		err = refs[0].CheckMutation(templating.SampleData("v1", "Secret", true))
		if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%s: error %v, want %q", tc.template, err, tc.wantErr)
		}
	}
}

package fieldpath

import (
	"reflect"
	"strings"
	"testing"
)

func TestParseList(t *testing.T) {
	tests := []struct {
		path    string
		list    bool
		str     string
		wantErr string
	}{
		{path: "spec.secretName", str: "spec.secretName"},
		{path: "spec.users.#.name", list: true, str: "spec.users.#.name"},
		{path: ".spec.names.#", list: true, str: "spec.names.#"},
		{path: "spec.users.#.keys.#.name", wantErr: "more than one"},
		{path: "#.name", wantErr: "starts with"},
		{path: "spec..name", wantErr: "empty segment"},
		{path: "", wantErr: "empty path"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			p, err := ParseList(tt.path)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("want an error with %q, got %v", tt.wantErr, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.IsList() != tt.list || p.String() != tt.str {
				t.Errorf("got list=%v %q, want list=%v %q", p.IsList(), p.String(), tt.list, tt.str)
			}
		})
	}
}

func TestListGetStrings(t *testing.T) {
	o := map[string]any{"spec": map[string]any{
		"secretName": "creds",
		"users":      []any{map[string]any{"name": "alice"}, map[string]any{"name": "bob", "age": int64(3)}},
		"names":      []any{"a", "b", int64(7)},
		"ragged":     []any{map[string]any{"name": "alice"}, map[string]any{"nick": "bob"}},
		"deep":       []any{map[string]any{"name": map[string]any{"x": "y"}}},
		"notAList":   map[string]any{"name": "x"},
		"empty":      []any{},
		"null":       nil,
	}}
	tests := []struct {
		path    string
		want    []string
		wantErr string
	}{
		{path: "spec.secretName", want: []string{"creds"}},
		{path: "spec.users.#.name", want: []string{"alice", "bob"}},
		{path: "spec.names.#", want: []string{"a", "b", "7"}},
		{path: "spec.missing.#.name", want: nil},
		{path: "spec.empty.#.name", want: []string{}},
		{path: "spec.null.#.name", want: nil},
		{path: "spec.users.#.age", wantErr: "item 0"},
		{path: "spec.ragged.#.name", wantErr: "item 1"},
		{path: "spec.deep.#.name", wantErr: "not a string"},
		{path: "spec.users.#", wantErr: "not a string"},
		{path: "spec.notAList.#.name", wantErr: "not a list"},
		{path: "spec.names.#.name", wantErr: "not an object"},
		{path: "spec.users", wantErr: "not a string"},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			p, err := ParseList(tt.path)
			if err != nil {
				t.Fatal(err)
			}
			got, err := p.GetStrings(o)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("want an error with %q, got %v (%v)", tt.wantErr, err, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %#v, want %#v", got, tt.want)
			}
		})
	}
}

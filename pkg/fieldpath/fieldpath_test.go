package fieldpath

import (
	"errors"
	"reflect"
	"testing"
)

func obj() map[string]any {
	return map[string]any{
		"spec": map[string]any{
			"secretName": "creds",
			"size":       int64(3),
			"ports":      []any{map[string]any{"name": "http"}, map[string]any{"name": "https"}},
		},
	}
}

func TestGet(t *testing.T) {
	tests := []struct {
		path    string
		want    any
		wantErr error
	}{
		{path: "spec.secretName", want: "creds"},
		{path: ".spec.size", want: int64(3)},
		{path: "spec.ports.1.name", want: "https"},
		{path: "spec.ports.7.name", wantErr: ErrNotFound},
		{path: "spec.missing", wantErr: ErrNotFound},
		{path: "spec.secretName.deeper", wantErr: ErrNotFound},
	}
	for _, tt := range tests {
		p, err := Parse(tt.path)
		if err != nil {
			t.Fatal(err)
		}
		got, err := p.Get(obj())
		if tt.wantErr != nil {
			if !errors.Is(err, tt.wantErr) {
				t.Errorf("%s: want %v, got %v", tt.path, tt.wantErr, err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("%s: got %v, %v; want %v", tt.path, got, err, tt.want)
		}
	}
}

func TestParseRejects(t *testing.T) {
	for _, s := range []string{"", "spec..x", "spec."} {
		if _, err := Parse(s); err == nil {
			t.Errorf("Parse(%q) accepted", s)
		}
	}
}

func TestSetAndDelete(t *testing.T) {
	o := obj()
	for path, v := range map[string]any{"spec.secretName": "other", "spec.new.deep": "x", "spec.ports.0.name": "h2"} {
		p, _ := Parse(path)
		if err := p.Set(o, v); err != nil {
			t.Fatalf("Set %s: %v", path, err)
		}
		if got, _ := p.Get(o); got != v {
			t.Errorf("after Set %s got %v", path, got)
		}
	}
	p, _ := Parse("spec.size")
	if err := p.Delete(o); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Get(o); !errors.Is(err, ErrNotFound) {
		t.Errorf("spec.size still there")
	}
	missing, _ := Parse("nope.nothing")
	if err := missing.Delete(o); err != nil {
		t.Errorf("deleting a missing path: %v", err)
	}
	bad, _ := Parse("spec.ports.9")
	if err := bad.Set(o, "x"); err == nil {
		t.Error("setting beyond a list's end was accepted")
	}
}

func FuzzPath(f *testing.F) {
	f.Add("spec.ports.0.name")
	f.Add("a..b")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := Parse(s)
		if err != nil {
			return
		}
		o := obj()
		_, _ = p.Get(o)
		_ = p.Set(o, "v")
		_ = p.Delete(o)
	})
}

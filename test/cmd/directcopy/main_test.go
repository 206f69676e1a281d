package main

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"
)

func TestParseGVR(t *testing.T) {
	for in, want := range map[string]schema.GroupVersionResource{
		"a.example.com/v1/things": {Group: "a.example.com", Version: "v1", Resource: "things"},
		"/v1/configmaps":          {Version: "v1", Resource: "configmaps"},
	} {
		got, err := parseGVR(in)
		if err != nil || got != want {
			t.Errorf("parseGVR(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "things", "g/v", "g//things", "g/v/", "g/v/things/x"} {
		if _, err := parseGVR(in); err == nil {
			t.Errorf("parseGVR(%q) succeeded", in)
		}
	}
}

func TestParseExport(t *testing.T) {
	path, name, err := parseExport("root:e2e-provider/direct.bench.ferry.dev")
	if err != nil || path != "root:e2e-provider" || name != "direct.bench.ferry.dev" {
		t.Errorf("got %q %q %v", path, name, err)
	}
	for _, in := range []string{"", "root", "root/", "/name", "root/a/b"} {
		if _, _, err := parseExport(in); err == nil {
			t.Errorf("parseExport(%q) succeeded", in)
		}
	}
}

func TestParseOptions(t *testing.T) {
	full := []string{
		"--kcp-kubeconfig", "kcp.kubeconfig", "--apiexport", "root:p/x.dev", "--resource", "x.dev/v1/things",
		"--kubeconfig", "svc.kubeconfig", "--local-resource", "l.dev/v1/things", "--local-kind", "Thing",
	}
	o, err := parseOptions(full)
	if err != nil {
		t.Fatal(err)
	}
	if o.workers != 4 || o.finalizer != "directcopy.ferry.dev/copy" || o.exportPath != "root:p" || o.localResource.Group != "l.dev" {
		t.Errorf("unexpected options %+v", o)
	}
	// Every required flag is named when missing.
	for i := 0; i < len(full); i += 2 {
		args := append(append([]string{}, full[:i]...), full[i+2:]...)
		_, err := parseOptions(args)
		if err == nil || !strings.Contains(err.Error(), full[i]) {
			t.Errorf("without %s: error %v does not name it", full[i], err)
		}
	}
	for _, extra := range [][]string{{"--workers", "0"}, {"--resource", "bad"}, {"--bogus"}, {"stray"}} {
		if _, err := parseOptions(append(append([]string{}, full...), extra...)); err == nil {
			t.Errorf("%v accepted", extra)
		}
	}
	// An empty finalizer is the copy without one.
	if o, err := parseOptions(append(append([]string{}, full...), "--finalizer", "")); err != nil || o.finalizer != "" {
		t.Errorf(`--finalizer "": %+v, %v`, o, err)
	}
	if _, err := parseOptions([]string{"-h"}); !errors.Is(err, pflag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
}

func TestClusterKey(t *testing.T) {
	u := &unstructured.Unstructured{}
	u.SetName("a")
	u.SetNamespace("default")
	u.SetAnnotations(map[string]string{"kcp.io/cluster": "2abc"})
	key, err := clusterKey(u)
	if err != nil || key != "2abc|default/a" {
		t.Errorf("clusterKey = %q, %v", key, err)
	}
	key, err = clusterKey(cache.DeletedFinalStateUnknown{Key: "x|ns/b", Obj: u})
	if err != nil || key != "x|ns/b" {
		t.Errorf("tombstone key = %q, %v", key, err)
	}
	if _, err := clusterKey("not an object"); err == nil {
		t.Error("a string has a key")
	}
}

func TestSpecHash(t *testing.T) {
	a, err := specHash(map[string]any{"x": int64(1), "y": map[string]any{"b": "2", "a": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := specHash(map[string]any{"y": map[string]any{"a": "1", "b": "2"}, "x": int64(1)})
	c, _ := specHash(map[string]any{"x": int64(2)})
	if a != b || a == c || len(a) != 32 {
		t.Errorf("hashes %q %q %q", a, b, c)
	}
}

func TestMergePatch(t *testing.T) {
	got := mergePatch(
		map[string]any{"phase": "ready", "nested": map[string]any{"a": "1"}, "list": []any{"x"}},
		map[string]any{"phase": "old", "gone": "x", "nested": map[string]any{"a": "0", "b": "2"}, "list": []any{"y", "z"}},
	)
	want := map[string]any{"phase": "ready", "gone": nil, "nested": map[string]any{"a": "1", "b": nil}, "list": []any{"x"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("mergePatch = %v, want %v", got, want)
	}
	if got := mergePatch(map[string]any{"a": "1"}, nil); !reflect.DeepEqual(got, map[string]any{"a": "1"}) {
		t.Errorf("over nothing: %v", got)
	}
}

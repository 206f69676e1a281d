package main

import (
	"bytes"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-dev/ferry/edge/publish"
)

var updateGolden = flag.Bool("update", false, "rewrite the golden files of the render tests")

// TestRender compares `ferry-edge render` output with golden files
// (go test -run TestRender -update rewrites them) and checks that a
// PublishedResource the edge would refuse is refused with its condition's
// reason and message.
func TestRender(t *testing.T) {
	examples := filepath.Join("..", "..", "..", "deploy", "examples")
	td := filepath.Join("testdata", "render")
	openapiDoc := filepath.Join("..", "..", "..", "pkg", "openapischema", "testdata", "sample.json")
	for _, tc := range []struct {
		name string
		args []string
		// golden is the expected output's file in testdata/render ("" for a refusal).
		golden string
		// reason and message are a refusal's Published condition.
		reason, message string
		// failure is part of another error's text.
		failure string
	}{
		{name: "the demo", golden: "demo.golden", args: []string{
			"-f", filepath.Join(examples, "database-publishedresource.yaml"), "--crd", filepath.Join(examples, "database-crd.yaml"),
			"--object", filepath.Join(examples, "database-object.yaml"), "--agent-name", "databases-eu",
		}},
		{name: "the demo without an object", golden: "demo-no-object.golden", args: []string{
			"-f", filepath.Join(examples, "database-publishedresource.yaml"), "--crd", filepath.Join(examples, "database-crd.yaml"), "--export", "demo.ferry.dev",
		}},
		{name: "naming, mutations, two versions, cluster-scoped", golden: "widget.golden", args: []string{
			"-f", filepath.Join(td, "widget-pr.yaml"), "--crd", filepath.Join(td, "widget-crd.yaml"),
			"--object", filepath.Join(td, "widget-object.yaml"), "--workspace-path", "root:org:team-blue",
		}},
		{name: "schema only", golden: "widget-schema-only.golden", args: []string{
			"-f", filepath.Join(td, "widget-schema-only-pr.yaml"), "--crd", filepath.Join(td, "widget-crd.yaml"),
			"--object", filepath.Join(td, "widget-object.yaml"), "--export", "widgets.example.org",
		}},
		{name: "a built-in kind through its OpenAPI document", golden: "configmap.golden", args: []string{
			"-f", filepath.Join(td, "configmap-pr.yaml"), "--openapi", openapiDoc,
			"--object", filepath.Join(td, "configmap-object.yaml"), "--cluster", "2x9gq1cwbd4ayn2p",
		}},
		{name: "a built-in kind no document describes", failure: "no --openapi document has a schema for /v1, Kind=ConfigMap (the service cluster's is at /openapi/v3/api/v1)", args: []string{
			"-f", filepath.Join(td, "configmap-pr.yaml"), "--openapi", filepath.Join(td, "widget-crd.yaml"), "--export", "settings.example.org",
		}},
		{name: "both a CRD and an OpenAPI document", failure: "one of --crd (a CRD) and --openapi (a built-in kind) is required", args: []string{
			"-f", filepath.Join(td, "configmap-pr.yaml"), "--openapi", openapiDoc, "--crd", filepath.Join(td, "widget-crd.yaml"), "--export", "settings.example.org",
		}},
		{name: "a version the CRD lacks", reason: "VersionNotFound", message: `version "v2" not found in CRD widgets.render.example.com (it has v1alpha1, v1)`, args: []string{
			"-f", filepath.Join(td, "widget-bad-version-pr.yaml"), "--crd", filepath.Join(td, "widget-crd.yaml"), "--export", "widgets.example.org",
		}},
		{name: "one projected version for two", reason: "ProjectionInvalid", message: "projection.version needs exactly one published version, 2 are selected; use projection.versions", args: []string{
			"-f", filepath.Join(td, "widget-bad-projection-pr.yaml"), "--crd", filepath.Join(td, "widget-crd.yaml"), "--export", "widgets.example.org",
		}},
		{name: "naming that maps workspaces together", reason: "NamingInvalid", message: "spec.naming can map objects of different workspaces onto one local object", args: []string{
			"-f", filepath.Join(td, "widget-bad-naming-pr.yaml"), "--crd", filepath.Join(td, "widget-crd.yaml"), "--export", "widgets.example.org",
		}},
		{name: "another kind's CRD", reason: "CRDNotFound", message: "CRD databases.demo.example.com defines Database.demo.example.com, not Widget.render.example.com", args: []string{
			"-f", filepath.Join(td, "widget-pr.yaml"), "--crd", filepath.Join(examples, "database-crd.yaml"), "--export", "widgets.example.org",
		}},
		{name: "a misspelt field", failure: `unknown field "projektion"`, args: []string{
			"-f", filepath.Join(td, "widget-typo-pr.yaml"), "--crd", filepath.Join(td, "widget-crd.yaml"), "--export", "widgets.example.org",
		}},
		{name: "an object of another kind", failure: "the sample object is a demo.ferry.dev/v1 ManagedDatabase, but the PublishedResource serves kind Gadget in widgets.example.org/v1, v1beta1", args: []string{
			"-f", filepath.Join(td, "widget-pr.yaml"), "--crd", filepath.Join(td, "widget-crd.yaml"),
			"--object", filepath.Join(examples, "database-object.yaml"), "--export", "widgets.example.org",
		}},
		{name: "the CRD where the PublishedResource belongs", failure: "is a apiextensions.k8s.io/v1 CustomResourceDefinition, not a ferry.dev/v1alpha1 PublishedResource", args: []string{
			"-f", filepath.Join(td, "widget-crd.yaml"), "--crd", filepath.Join(td, "widget-crd.yaml"), "--export", "widgets.example.org",
		}},
		{name: "no export", failure: "--export is required without --object", args: []string{
			"-f", filepath.Join(td, "widget-pr.yaml"), "--crd", filepath.Join(td, "widget-crd.yaml"),
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			err := runRender(tc.args, &out)
			if tc.golden == "" {
				if err == nil {
					t.Fatalf("rendered, want a refusal:\n%s", out.String())
				}
				var refusal *publish.Refusal
				switch {
				case tc.reason != "":
					if !errors.As(err, &refusal) || refusal.Reason != tc.reason || !strings.Contains(refusal.Message, tc.message) {
						t.Fatalf("error %q, want reason %s with message %q", err, tc.reason, tc.message)
					}
				case !strings.Contains(err.Error(), tc.failure):
					t.Fatalf("error %q, want it to contain %q", err, tc.failure)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join(td, tc.golden)
			if *updateGolden {
				if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (go test -run TestRender -update writes it)", err)
			}
			if got := out.String(); got != string(want) {
				t.Fatalf("output differs from %s (go test -run TestRender -update rewrites it):\n%s", golden, got)
			}
		})
	}
}

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const lossyPR = `apiVersion: syncagent.kcp.io/v1alpha1
kind: PublishedResource
metadata: {name: lossy}
spec:
  resource: {apiGroup: g, kind: K, version: v1}
  mutation: {spec: [{rudi: {script: s}}]}
`

const cleanPR = `apiVersion: services.kdp.k8c.io/v1alpha1
kind: PublishedResource
metadata: {name: clean}
spec:
  resource: {apiGroup: g, kind: K, version: v1}
`

func TestRunMigrate(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a.yaml"), []byte(cleanPR), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ignored.txt"), []byte("not yaml: ["), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		args       []string
		stdin      string
		wantErr    string
		wantStdout []string
		wantStderr []string
	}{
		{name: "directory", args: []string{"-f", dir}, wantStdout: []string{"apiVersion: ferry.dev/v1alpha1", "name: clean"}, wantStderr: []string{"1 PublishedResource(s) converted, 0 with lossy changes"}},
		{name: "stdin lossy converts", args: []string{"-f", "-"}, stdin: lossyPR, wantStdout: []string{"#   lossy   spec.mutation.spec[0].rudi"}, wantStderr: []string{"lossy   spec.mutation.spec[0].rudi"}},
		{name: "check lossy fails", args: []string{"-f", "-", "--check"}, stdin: lossyPR, wantErr: "cannot be carried over"},
		{name: "check clean passes", args: []string{"-f", "-", "--check"}, stdin: cleanPR},
		{name: "not a PublishedResource", args: []string{"-f", "-"}, stdin: "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n", wantErr: `Secret "s" is not a PublishedResource`},
		{name: "empty", args: []string{"-f", "-"}, stdin: "", wantErr: "no PublishedResources found"},
		{name: "missing file", args: []string{"-f", filepath.Join(dir, "nope.yaml")}, wantErr: "no such file"},
		{name: "positional", args: []string{"x.yaml"}, wantErr: "files are given with -f"},
		{name: "check and output", args: []string{"-f", "-", "--check", "-o", "x"}, wantErr: "--check writes nothing"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := runMigrate(tt.args, strings.NewReader(tt.stdin), &stdout, &stderr)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("%v\nstderr: %s", err, stderr.String())
			}
			for _, w := range tt.wantStdout {
				if !strings.Contains(stdout.String(), w) {
					t.Errorf("stdout lacks %q:\n%s", w, stdout.String())
				}
			}
			for _, w := range tt.wantStderr {
				if !strings.Contains(stderr.String(), w) {
					t.Errorf("stderr lacks %q:\n%s", w, stderr.String())
				}
			}
		})
	}
}

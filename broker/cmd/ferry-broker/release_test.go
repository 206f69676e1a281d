package main

import (
	"strings"
	"testing"
)

// TestReleaseFinalizersFlags: bad input stops the command with a message
// naming every problem, before anything reaches kcp.
func TestReleaseFinalizersFlags(t *testing.T) {
	cases := []struct {
		name string
		args []string
		want []string
	}{
		{name: "nothing", args: nil, want: []string{"--kcp-kubeconfig is required", `--apiexport "": want WORKSPACE/NAME`, `--edge "" is not an edge name`}},
		{name: "export without a name", args: []string{"--kcp-kubeconfig", "k", "--apiexport", "root:org/", "--edge", "edge"},
			want: []string{`--apiexport "root:org/": want WORKSPACE/NAME`}},
		{name: "edge name that names no finalizer", args: []string{"--kcp-kubeconfig", "k", "--apiexport", "root:org/x.example.com", "--edge", "Not_A_Label"},
			want: []string{`--edge "Not_A_Label" is not an edge name`}},
		{name: "unreadable kubeconfig", args: []string{"--kcp-kubeconfig", "/nonexistent/kubeconfig", "--apiexport", "root:org/x.example.com", "--edge", "edge"},
			want: []string{"--kcp-kubeconfig /nonexistent/kubeconfig"}},
		{name: "unknown flag", args: []string{"--config", "c.yaml"}, want: []string{"unknown flag: --config"}},
		{name: "virtual workspace URL rewrite with a path", args: []string{"--kcp-kubeconfig", "k", "--apiexport", "root:org/x.example.com", "--edge", "edge",
			"--virtual-workspace-url-rewrite", "https://shard-1=https://kcp.example.com/clusters/root"},
			want: []string{`--virtual-workspace-url-rewrite: invalid virtual workspace URL rewrite "https://shard-1=https://kcp.example.com/clusters/root"`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := runRelease(tc.args)
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

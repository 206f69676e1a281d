package kcp

import (
	"slices"
	"strings"
	"testing"

	apisv1alpha1 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestParseEndpointRewrite(t *testing.T) {
	const shard1 = "https://shard-1.kcp.svc:6443/services/apiexport/root:org/export"
	tests := []struct {
		name     string
		entries  []string
		endpoint string
		want     string
		wantErr  string
	}{
		{name: "none keeps the URL", endpoint: shard1, want: shard1},
		{name: "scheme and host replaced, path kept", entries: []string{"https://shard-1.kcp.svc:6443=https://kcp.example.com:8443"}, endpoint: shard1,
			want: "https://kcp.example.com:8443/services/apiexport/root:org/export"},
		{name: "another shard's URL is kept", entries: []string{"https://shard-2.kcp.svc:6443=https://kcp.example.com:8443"}, endpoint: shard1, want: shard1},
		{name: "host compared without case, trailing slash allowed", entries: []string{"https://Shard-1.kcp.svc:6443/=http://10.0.0.2:6443/"}, endpoint: shard1,
			want: "http://10.0.0.2:6443/services/apiexport/root:org/export"},
		{name: "the port is part of the host", entries: []string{"https://shard-1.kcp.svc=https://kcp.example.com"}, endpoint: shard1, want: shard1},
		{name: "no =", entries: []string{"https://kcp.example.com:8443"}, wantErr: "want FROM=TO"},
		{name: "no scheme", entries: []string{"kcp.example.com:8443=https://x"}, wantErr: "FROM"},
		{name: "other scheme", entries: []string{"https://a=ftp://kcp.example.com"}, wantErr: "the scheme must be https or http"},
		{name: "no host", entries: []string{"https://a=https://"}, wantErr: "a host is required"},
		{name: "path would be dropped", entries: []string{"https://a=https://kcp.example.com/prefix"}, wantErr: "only a scheme and host[:port]"},
		{name: "query would be dropped", entries: []string{"https://a?x=1=https://b"}, wantErr: "only a scheme and host[:port]"},
		{name: "credentials", entries: []string{"https://a=https://user:pw@kcp.example.com"}, wantErr: "only a scheme and host[:port]"},
		{name: "not a URL", entries: []string{"https://a=https://kcp example.com:x"}, wantErr: "TO"},
		{name: "one FROM twice", entries: []string{"https://a=https://b", "https://a=https://c"}, wantErr: "rewritten twice"},
		// The paths are the same on every shard: two shards mapped to one
		// host would be one endpoint, and one shard would not be watched.
		{name: "two shards onto one host", entries: []string{"https://a=https://front", "https://b=https://front"}, wantErr: "would both become https://front"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseEndpointRewrite(tt.entries)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseEndpointRewrite(%q) = %q, %v; want an error saying %q", tt.entries, r, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseEndpointRewrite(%q): %v", tt.entries, err)
			}
			if got := r.Apply(tt.endpoint); got != tt.want {
				t.Errorf("Apply(%q) = %q, want %q", tt.endpoint, got, tt.want)
			}
		})
	}
}

func sliceWith(urls ...string) *apisv1alpha1.APIExportEndpointSlice {
	s := &apisv1alpha1.APIExportEndpointSlice{ObjectMeta: metav1.ObjectMeta{Name: "export"}}
	for _, u := range urls {
		s.Status.APIExportEndpoints = append(s.Status.APIExportEndpoints, apisv1alpha1.APIExportEndpoint{URL: u})
	}
	return s
}

func TestEndpointURLs(t *testing.T) {
	rewrite, err := ParseEndpointRewrite([]string{"https://shard-1:6443=https://kcp-1.example.com", "https://shard-2:6443=https://kcp-2.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		slice   *apisv1alpha1.APIExportEndpointSlice
		rewrite EndpointRewrite
		want    []string
	}{
		{name: "no slice", slice: nil, want: nil},
		{name: "no endpoints", slice: sliceWith(), want: nil},
		{name: "one", slice: sliceWith("https://a/vw"), want: []string{"https://a/vw"}},
		{name: "sorted and deduplicated, empty dropped", slice: sliceWith("https://b/vw", "", "https://a/vw", "https://b/vw"), want: []string{"https://a/vw", "https://b/vw"}},
		{name: "each shard rewritten on its own, others kept", slice: sliceWith("https://shard-2:6443/vw", "https://shard-1:6443/vw", "https://shard-3:6443/vw"), rewrite: rewrite,
			want: []string{"https://kcp-1.example.com/vw", "https://kcp-2.example.com/vw", "https://shard-3:6443/vw"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := endpointURLs(tt.slice, tt.rewrite); !slices.Equal(got, tt.want) {
				t.Errorf("endpointURLs = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestEndpointReporter: the slice watch reports the full, sorted URL list
// on its first observation and on every change of the set (not on a
// reordering), and an empty list when the slice goes.
func TestEndpointReporter(t *testing.T) {
	var reports [][]string
	var exists []bool
	r := newEndpointReporter(EndpointRewrite{}, func(vw VirtualWorkspace) {
		reports = append(reports, vw.URLs)
		exists = append(exists, vw.Exists)
	})
	steps := []struct {
		name string
		obj  any
		want [][]string // reports made by this step
		// wantExists is Exists of the step's report, when it makes one.
		wantExists bool
	}{
		{name: "first observation, unsorted with a duplicate", obj: sliceWith("https://b/vw", "https://a/vw", "https://b/vw"), want: [][]string{{"https://a/vw", "https://b/vw"}}, wantExists: true},
		{name: "reordered: same set", obj: sliceWith("https://a/vw", "https://b/vw")},
		{name: "a shard added", obj: sliceWith("https://c/vw", "https://a/vw", "https://b/vw"), want: [][]string{{"https://a/vw", "https://b/vw", "https://c/vw"}}, wantExists: true},
		{name: "two shards drained", obj: sliceWith("https://c/vw"), want: [][]string{{"https://c/vw"}}, wantExists: true},
		{name: "every shard drained: the slice stays", obj: sliceWith(), want: [][]string{nil}, wantExists: true},
		{name: "slice deleted", obj: nil, want: [][]string{nil}, wantExists: false},
		{name: "still none", obj: nil},
	}
	for _, st := range steps {
		reports, exists = nil, nil
		r.observe(st.obj)
		if !slices.EqualFunc(reports, st.want, slices.Equal) {
			t.Errorf("%s: reported %q, want %q", st.name, reports, st.want)
		}
		if len(exists) == 1 && exists[0] != st.wantExists {
			t.Errorf("%s: reported the slice existing: %t, want %t", st.name, exists[0], st.wantExists)
		}
	}
}

func TestEndpointReporterFirstObservationOfNone(t *testing.T) {
	var reports [][]string
	newEndpointReporter(EndpointRewrite{}, func(vw VirtualWorkspace) { reports = append(reports, vw.URLs) }).observe(nil)
	if len(reports) != 1 || len(reports[0]) != 0 {
		t.Errorf("reported %q, want one empty report (the URLs are known to be none)", reports)
	}
}

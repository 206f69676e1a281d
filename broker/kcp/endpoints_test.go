package kcp

import (
	"slices"
	"testing"

	apisv1alpha1 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func TestParseEndpointRewrite(t *testing.T) {
	tests := []struct {
		name, base, endpoint, want string
		wantErr                    bool
	}{
		{name: "none keeps the URL", base: "", endpoint: "https://shard-1.kcp.svc:6443/services/apiexport/root:org/export", want: "https://shard-1.kcp.svc:6443/services/apiexport/root:org/export"},
		{name: "scheme and host replaced, path kept", base: "https://kcp.example.com:8443", endpoint: "https://shard-1.kcp.svc:6443/services/apiexport/root:org/export", want: "https://kcp.example.com:8443/services/apiexport/root:org/export"},
		{name: "trailing slash allowed", base: "https://kcp.example.com/", endpoint: "http://10.0.0.2:6443/services/apiexport/x/y", want: "https://kcp.example.com/services/apiexport/x/y"},
		{name: "no scheme", base: "kcp.example.com:8443", wantErr: true},
		{name: "other scheme", base: "ftp://kcp.example.com", wantErr: true},
		{name: "no host", base: "https://", wantErr: true},
		{name: "path would be dropped", base: "https://kcp.example.com/prefix", wantErr: true},
		{name: "query would be dropped", base: "https://kcp.example.com?x=1", wantErr: true},
		{name: "credentials", base: "https://user:pw@kcp.example.com", wantErr: true},
		{name: "not a URL", base: "https://kcp example.com:x", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ParseEndpointRewrite(tt.base)
			if tt.wantErr {
				if err == nil {
					t.Fatalf("ParseEndpointRewrite(%q) accepted it as %q", tt.base, r)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseEndpointRewrite(%q): %v", tt.base, err)
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
	rewrite, err := ParseEndpointRewrite("https://front-proxy:8443")
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
		// Two shards serve the same path: through the front-proxy they are
		// one endpoint.
		{name: "rewritten, then deduplicated", slice: sliceWith("https://shard-2:6443/vw/2", "https://shard-1:6443/vw/1", "https://shard-3:6443/vw/1"), rewrite: rewrite,
			want: []string{"https://front-proxy:8443/vw/1", "https://front-proxy:8443/vw/2"}},
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
	r := newEndpointReporter(EndpointRewrite{}, func(urls []string) { reports = append(reports, urls) })
	steps := []struct {
		name string
		obj  any
		want [][]string // reports made by this step
	}{
		{name: "first observation, unsorted with a duplicate", obj: sliceWith("https://b/vw", "https://a/vw", "https://b/vw"), want: [][]string{{"https://a/vw", "https://b/vw"}}},
		{name: "reordered: same set", obj: sliceWith("https://a/vw", "https://b/vw")},
		{name: "a shard added", obj: sliceWith("https://c/vw", "https://a/vw", "https://b/vw"), want: [][]string{{"https://a/vw", "https://b/vw", "https://c/vw"}}},
		{name: "two shards drained", obj: sliceWith("https://c/vw"), want: [][]string{{"https://c/vw"}}},
		{name: "slice deleted", obj: nil, want: [][]string{nil}},
		{name: "still none", obj: sliceWith()},
	}
	for _, st := range steps {
		reports = nil
		r.observe(st.obj)
		if !slices.EqualFunc(reports, st.want, slices.Equal) {
			t.Errorf("%s: reported %q, want %q", st.name, reports, st.want)
		}
	}
}

func TestEndpointReporterFirstObservationOfNone(t *testing.T) {
	var reports [][]string
	newEndpointReporter(EndpointRewrite{}, func(urls []string) { reports = append(reports, urls) }).observe(nil)
	if len(reports) != 1 || len(reports[0]) != 0 {
		t.Errorf("reported %q, want one empty report (the URLs are known to be none)", reports)
	}
}

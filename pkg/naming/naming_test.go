package naming

import (
	"crypto/sha3"
	"encoding/hex"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

func TestHash(t *testing.T) {
	// sha1("default") = 7505d64a54e061b7acd54ccd58b49dc43500b635
	if got := Hash("default"); got != "7505d64a54e061b7acd5" {
		t.Fatalf("Hash(default) = %s", got)
	}
	if len(Hash("")) != HashLength {
		t.Fatal("hash of the empty string has the wrong length")
	}
}

func TestLocal(t *testing.T) {
	remote := Remote{ClusterName: "1084s8ceexsehjm2", Namespace: "team-a", Name: "my-cert", WorkspacePath: "root:org:team"}
	long := strings.Repeat("x", 300)
	tests := []struct {
		name       string
		naming     *ferryv1alpha1.ResourceNaming
		remote     Remote
		namespaced bool
		wantNS     string
		wantName   string
		wantErr    string
	}{
		{
			name: "defaults", remote: remote, namespaced: true,
			wantNS: "1084s8ceexsehjm2", wantName: Hash("team-a") + "-" + Hash("my-cert"),
		},
		{
			name: "cluster-scoped local resource has no namespace", remote: remote, namespaced: false,
			wantNS: "", wantName: Hash("team-a") + "-" + Hash("my-cert"),
		},
		{
			name:   "placeholders, longer ones not eaten by shorter ones",
			naming: &ferryv1alpha1.ResourceNaming{Namespace: "ws-$remoteClusterName", Name: "$remoteNamespace-$remoteName-$remoteNameHash"},
			remote: remote, namespaced: true,
			wantNS: "ws-1084s8ceexsehjm2", wantName: "team-a-my-cert-" + Hash("my-cert"),
		},
		{
			name:   "Go templates",
			naming: &ferryv1alpha1.ResourceNaming{Namespace: "{{ .ClusterName }}", Name: `{{ .Namespace }}-{{ hash .Name | printf "%.8s" }}`},
			remote: remote, namespaced: true,
			wantNS: "1084s8ceexsehjm2", wantName: "team-a-" + Hash("my-cert")[:8],
		},
		{
			name:   "too long names are shortened",
			naming: &ferryv1alpha1.ResourceNaming{Namespace: "$remoteName", Name: "$remoteName"},
			remote: Remote{ClusterName: "c", Name: long}, namespaced: true,
			wantNS: Shorten(long, 63), wantName: Shorten(long, 253),
		},
		{
			name:   "invalid result names the rule",
			naming: &ferryv1alpha1.ResourceNaming{Name: "UPPER-$remoteName"},
			remote: remote, namespaced: true, wantErr: "spec.naming.name",
		},
		{
			name: "api-syncagent's template naming (.Object, sha3short)",
			naming: &ferryv1alpha1.ResourceNaming{
				Namespace: "{{ .ClusterName }}-{{ .Object.metadata.namespace | sha3short }}",
				Name:      "{{ .Object.metadata.name }}-{{ .ClusterPath | sha3short 6 }}",
			},
			remote: remote, namespaced: true,
			wantNS:   "1084s8ceexsehjm2-" + sha3hex("team-a")[:20],
			wantName: "my-cert-" + sha3hex("root:org:team")[:6],
		},
		{
			name:   "the seeds' typed view of the kcp object",
			naming: &ferryv1alpha1.ResourceNaming{Name: "{{ .RemoteObject.ObjectMeta.Namespace }}-{{ .RemoteObject.ObjectMeta.Name }}"},
			remote: remote, namespaced: true,
			wantNS: "1084s8ceexsehjm2", wantName: "team-a-my-cert",
		},
		{
			name:   "template referring to a missing field",
			naming: &ferryv1alpha1.ResourceNaming{Name: "{{ .Nope }}"},
			remote: remote, namespaced: true, wantErr: "Nope",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rules, err := Compile(tt.naming)
			if err != nil {
				t.Fatal(err)
			}
			ns, name, err := rules.Local(tt.remote, tt.namespaced)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("want an error mentioning %q, got %v", tt.wantErr, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ns != tt.wantNS || name != tt.wantName {
				t.Errorf("got %q/%q, want %q/%q", ns, name, tt.wantNS, tt.wantName)
			}
		})
	}
}

func sha3hex(s string) string {
	sum := sha3.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestLocalOfReadsTheObject: with the kcp object at hand, templates read
// its content (.Object.spec…).
func TestLocalOfReadsTheObject(t *testing.T) {
	rules, err := Compile(&ferryv1alpha1.ResourceNaming{Name: "{{ .Object.spec.tier }}-{{ .Name }}"})
	if err != nil {
		t.Fatal(err)
	}
	obj := map[string]any{"metadata": map[string]any{"name": "a"}, "spec": map[string]any{"tier": "gold"}}
	_, name, err := rules.LocalOf(Remote{ClusterName: "c", Namespace: "n", Name: "a"}, obj, true)
	if err != nil || name != "gold-a" {
		t.Fatalf("LocalOf = %q, %v; want gold-a", name, err)
	}
}

// TestCheck: a naming template that fails on every object is refused at
// publish time, one that reads a field a sample lacks is not.
func TestCheck(t *testing.T) {
	for _, tc := range []struct {
		name, rule, wantErr string
	}{
		{name: "placeholders", rule: "$remoteClusterName-$remoteName"},
		{name: "api-syncagent", rule: "{{ .ClusterName }}-{{ .Object.metadata.namespace | sha3short }}"},
		{name: "a field the sample lacks", rule: "{{ .Object.spec.tier }}"},
		{name: "data that does not exist", rule: "{{ .Cluster }}", wantErr: "spec.naming.name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rules, err := Compile(&ferryv1alpha1.ResourceNaming{Name: tc.rule})
			if err != nil {
				t.Fatal(err)
			}
			err = rules.Check("example.com/v1", "Widget", true)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Check = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestCompileRejectsBrokenTemplate(t *testing.T) {
	if _, err := Compile(&ferryv1alpha1.ResourceNaming{Name: "{{ .Name "}); err == nil || !strings.Contains(err.Error(), "spec.naming.name") {
		t.Fatalf("want a template error naming the field, got %v", err)
	}
}

func TestDefaultNamingDoesNotCollide(t *testing.T) {
	rules, err := Compile(nil)
	if err != nil {
		t.Fatal(err)
	}
	// Pairs that a naive "namespace-name" join would map onto one name.
	pairs := [][2]Remote{
		{{ClusterName: "c", Namespace: "a-b", Name: "c"}, {ClusterName: "c", Namespace: "a", Name: "b-c"}},
		{{ClusterName: "c", Namespace: "", Name: "x"}, {ClusterName: "c", Namespace: "x", Name: ""}},
	}
	for _, p := range pairs {
		_, n1, err1 := rules.Local(p[0], true)
		_, n2, err2 := rules.Local(p[1], true)
		if err1 != nil || err2 != nil || n1 == n2 {
			t.Errorf("%+v and %+v both map to %q (%v %v)", p[0], p[1], n1, err1, err2)
		}
	}
	// Different workspaces never share a namespace.
	ns1, _, _ := rules.Local(Remote{ClusterName: "one", Namespace: "n", Name: "x"}, true)
	ns2, _, _ := rules.Local(Remote{ClusterName: "two", Namespace: "n", Name: "x"}, true)
	if ns1 == ns2 {
		t.Error("two workspaces share a local namespace")
	}
}

func TestShorten(t *testing.T) {
	a := strings.Repeat("a", 100) + "1"
	b := strings.Repeat("a", 100) + "2"
	sa, sb := Shorten(a, 63), Shorten(b, 63)
	if len(sa) != 63 || len(sb) != 63 || sa == sb {
		t.Fatalf("shortened names must be 63 long and distinct: %q %q", sa, sb)
	}
	if Shorten("short", 63) != "short" {
		t.Error("a name that fits must stay as it is")
	}
	if got := Shorten(strings.Repeat("a", 41)+"-"+strings.Repeat("b", 30), 63); strings.Contains(got, "--") {
		t.Errorf("shortening must not leave a dangling separator: %q", got)
	}
}

func TestLabelsRoundTrip(t *testing.T) {
	remote := Remote{ClusterName: "c1", Namespace: "ns", Name: strings.Repeat("n", 200), UID: "u1", WorkspacePath: "root:a"}
	labels, annotations := Labels("edge", remote), Annotations(remote)
	for k, v := range labels {
		if len(v) > 63 {
			t.Errorf("label %s value %q exceeds 63 characters", k, v)
		}
	}
	got, ok := RemoteFrom(labels, annotations)
	if !ok || got != remote {
		t.Fatalf("RemoteFrom = %+v, %v; want %+v", got, ok, remote)
	}
	labels[LabelNameHash] = Hash("something else") // tampered
	if _, ok := RemoteFrom(labels, annotations); ok {
		t.Error("tampered labels were trusted")
	}
	if _, ok := RemoteFrom(map[string]string{}, annotations); ok {
		t.Error("missing labels were trusted")
	}
}

func FuzzShorten(f *testing.F) {
	f.Add("abc", 10)
	f.Add(strings.Repeat("z", 300), 63)
	f.Fuzz(func(t *testing.T, s string, limit int) {
		if limit < HashLength+2 || limit > 1000 {
			return
		}
		got := Shorten(s, limit)
		if len(got) > limit {
			t.Fatalf("Shorten(%q, %d) = %q, longer than the limit", s, limit, got)
		}
		if len(s) <= limit && got != s {
			t.Fatalf("Shorten changed a name that fits: %q → %q", s, got)
		}
	})
}

func BenchmarkLocalDefault(b *testing.B) {
	rules, err := Compile(nil)
	if err != nil {
		b.Fatal(err)
	}
	remote := Remote{ClusterName: "1084s8ceexsehjm2", Namespace: "team-a", Name: "my-cert"}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := rules.Local(remote, true); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkLocalTemplate(b *testing.B) {
	rules, err := Compile(&ferryv1alpha1.ResourceNaming{Name: "{{ .Namespace }}-{{ .Name }}"})
	if err != nil {
		b.Fatal(err)
	}
	remote := Remote{ClusterName: "1084s8ceexsehjm2", Namespace: "team-a", Name: "my-cert"}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := rules.Local(remote, true); err != nil {
			b.Fatal(err)
		}
	}
}

func TestSeparatesWorkspaces(t *testing.T) {
	for _, tc := range []struct {
		name           string
		naming         *ferryv1alpha1.ResourceNaming
		namespaced     bool
		allowExisting  bool
		wantSeparating bool
	}{
		{name: "defaults", namespaced: true, wantSeparating: true},
		{name: "defaults, cluster-scoped copies", wantSeparating: false},
		{name: "cluster name in the name", naming: &ferryv1alpha1.ResourceNaming{Name: "$remoteClusterName-$remoteName"}, wantSeparating: true},
		{name: "template on the cluster name", naming: &ferryv1alpha1.ResourceNaming{Name: "{{ hash .ClusterName }}-{{ .Name }}"}, wantSeparating: true},
		{name: "remote namespace, per-workspace namespaces", naming: &ferryv1alpha1.ResourceNaming{Namespace: "$remoteNamespace"},
			namespaced: true, wantSeparating: true},
		{name: "remote namespace onto existing namespaces", naming: &ferryv1alpha1.ResourceNaming{Namespace: "$remoteNamespace"},
			namespaced: true, allowExisting: true, wantSeparating: false},
		{name: "static namespace, remote name", naming: &ferryv1alpha1.ResourceNaming{Namespace: "shared", Name: "$remoteName"},
			namespaced: true, wantSeparating: false},
		{name: "static namespace, cluster in the name", naming: &ferryv1alpha1.ResourceNaming{Namespace: "shared", Name: "$remoteClusterName-$remoteNameHash"},
			namespaced: true, wantSeparating: true},
		{name: "cluster name in the namespace of cluster-scoped copies", naming: &ferryv1alpha1.ResourceNaming{Namespace: "$remoteClusterName", Name: "$remoteName"},
			wantSeparating: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Compile(tc.naming)
			if err != nil {
				t.Fatal(err)
			}
			if got := r.SeparatesWorkspaces(tc.namespaced, tc.allowExisting); got != tc.wantSeparating {
				t.Fatalf("SeparatesWorkspaces = %v, want %v", got, tc.wantSeparating)
			}
		})
	}
}

// TestOwnerLabelValues: the kcp resource and PublishedResource labels are
// readable where label values allow it and hashed where they do not.
func TestOwnerLabelValues(t *testing.T) {
	long := strings.Repeat("g", 60) + ".example.com"
	for _, tc := range []struct {
		gr   schema.GroupResource
		want string
	}{
		{gr: schema.GroupResource{Group: "kcp.example", Resource: "things"}, want: "things.kcp.example"},
		{gr: schema.GroupResource{Resource: "configmaps"}, want: "configmaps"},
		{gr: schema.GroupResource{Group: long, Resource: "things"}, want: Hash("things." + long)},
	} {
		if got := ResourceLabelValue(tc.gr); got != tc.want {
			t.Errorf("ResourceLabelValue(%v) = %q, want %q", tc.gr, got, tc.want)
		}
		if errs := validation.IsValidLabelValue(ResourceLabelValue(tc.gr)); len(errs) != 0 {
			t.Errorf("ResourceLabelValue(%v) is no label value: %v", tc.gr, errs)
		}
	}
	if got := PublishedResourceLabelValue("pr"); got != "pr" {
		t.Errorf("PublishedResourceLabelValue(pr) = %q", got)
	}
	if got := PublishedResourceLabelValue(strings.Repeat("p", 64)); got != Hash(strings.Repeat("p", 64)) {
		t.Errorf("a 64-character name is not hashed: %q", got)
	}
	if got, want := CopySelector("nora", schema.GroupResource{Group: "kcp.example", Resource: "things"}),
		"ferry.dev/agent=nora,ferry.dev/remote-resource=things.kcp.example"; got != want {
		t.Errorf("CopySelector = %q, want %q", got, want)
	}
}

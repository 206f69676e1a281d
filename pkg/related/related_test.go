package related

import (
	"strings"
	"testing"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

func spec(name ferryv1alpha1.ResourceLocator, ns *ferryv1alpha1.ResourceLocator) ferryv1alpha1.RelatedResourceSpec {
	return ferryv1alpha1.RelatedResourceSpec{
		Identifier: "creds", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
		Reference: ferryv1alpha1.RelatedResourceReference{Name: name, Namespace: ns},
	}
}

func primary() map[string]any {
	return map[string]any{
		"metadata": map[string]any{"name": "db", "namespace": "team-a", "uid": "1234"},
		"spec":     map[string]any{"secretName": "db-creds", "port": int64(5432), "empty": "", "nested": map[string]any{"ns": "vault"}},
	}
}

func TestLocate(t *testing.T) {
	tests := []struct {
		name          string
		spec          ferryv1alpha1.RelatedResourceSpec
		obj           map[string]any
		wantNamespace string
		wantName      string
		wantErr       string
	}{
		{name: "path, namespace of the primary", spec: spec(ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}, nil),
			wantNamespace: "team-a", wantName: "db-creds"},
		{name: "regex rewrite", spec: spec(ferryv1alpha1.ResourceLocator{Path: "spec.secretName",
			Regex: &ferryv1alpha1.RegexReplacement{Pattern: "^(.*)-creds$", Replacement: "$1-tls"}}, nil),
			wantNamespace: "team-a", wantName: "db-tls"},
		{name: "regex rewrite written as the ancestors do (\\1)", spec: spec(ferryv1alpha1.ResourceLocator{Path: "spec.secretName",
			Regex: &ferryv1alpha1.RegexReplacement{Pattern: "^(.*)-creds$", Replacement: `\1-tls`}}, nil),
			wantNamespace: "team-a", wantName: "db-tls"},
		{name: "static namespace", spec: spec(ferryv1alpha1.ResourceLocator{Path: "spec.secretName"},
			&ferryv1alpha1.ResourceLocator{Path: "metadata.uid", Regex: &ferryv1alpha1.RegexReplacement{Replacement: "kube-system"}}),
			wantNamespace: "kube-system", wantName: "db-creds"},
		{name: "static value needs no field", spec: spec(ferryv1alpha1.ResourceLocator{Path: "spec.missing",
			Regex: &ferryv1alpha1.RegexReplacement{Replacement: "fixed"}}, nil),
			wantNamespace: "team-a", wantName: "fixed"},
		{name: "namespace from a path", spec: spec(ferryv1alpha1.ResourceLocator{Path: "metadata.name"},
			&ferryv1alpha1.ResourceLocator{Path: "spec.nested.ns"}),
			wantNamespace: "vault", wantName: "db"},
		{name: "number formatted", spec: spec(ferryv1alpha1.ResourceLocator{Path: "spec.port"}, nil),
			wantNamespace: "team-a", wantName: "5432"},
		{name: "path matches nothing", spec: spec(ferryv1alpha1.ResourceLocator{Path: "spec.missing"}, nil),
			wantErr: `related "creds": reference.name: spec.missing: path matches nothing`},
		{name: "empty value", spec: spec(ferryv1alpha1.ResourceLocator{Path: "spec.empty"}, nil),
			wantErr: `reference.name (path spec.empty) is empty`},
		{name: "not a string", spec: spec(ferryv1alpha1.ResourceLocator{Path: "spec.nested"}, nil),
			wantErr: `spec.nested holds map[string]interface {}, not a string`},
		{name: "invalid name", spec: spec(ferryv1alpha1.ResourceLocator{Path: "spec.secretName",
			Regex: &ferryv1alpha1.RegexReplacement{Pattern: "-", Replacement: "_"}}, nil),
			wantErr: `gives "db_creds", which is not a valid name`},
		{name: "invalid namespace", spec: spec(ferryv1alpha1.ResourceLocator{Path: "spec.secretName"},
			&ferryv1alpha1.ResourceLocator{Path: "spec.secretName", Regex: &ferryv1alpha1.RegexReplacement{Pattern: "^", Replacement: "A."}}),
			wantErr: `which is not a valid namespace`},
		{name: "cluster-scoped primary without namespace", spec: spec(ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}, nil),
			obj:     map[string]any{"metadata": map[string]any{"name": "x"}, "spec": map[string]any{"secretName": "s"}},
			wantErr: "the primary object has no namespace; set reference.namespace"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			refs, err := Compile([]ferryv1alpha1.RelatedResourceSpec{tt.spec})
			if err != nil {
				t.Fatalf("Compile: %v", err)
			}
			obj := tt.obj
			if obj == nil {
				obj = primary()
			}
			ns, name, err := refs[0].Locate(obj)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if ns != tt.wantNamespace || name != tt.wantName {
				t.Errorf("Locate = %s/%s, want %s/%s", ns, name, tt.wantNamespace, tt.wantName)
			}
		})
	}
}

func TestCompileErrors(t *testing.T) {
	good := spec(ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}, nil)
	tests := []struct {
		name    string
		mutate  func(*ferryv1alpha1.RelatedResourceSpec)
		wantErr string
	}{
		{name: "bad regex", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Reference.Name.Regex = &ferryv1alpha1.RegexReplacement{Pattern: "(unclosed", Replacement: "x"}
		}, wantErr: "spec.related[creds]: reference.name.regex.pattern: error parsing regexp"},
		{name: "bad namespace regex", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Reference.Namespace = &ferryv1alpha1.ResourceLocator{Path: "metadata.name", Regex: &ferryv1alpha1.RegexReplacement{Pattern: "[", Replacement: "x"}}
		}, wantErr: "reference.namespace.regex.pattern"},
		{name: "empty pattern and replacement", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Reference.Name.Regex = &ferryv1alpha1.RegexReplacement{}
		}, wantErr: "an empty pattern needs a replacement"},
		{name: "empty path segment", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) { s.Reference.Name.Path = "spec..name" },
			wantErr: "reference.name.path"},
		{name: "bad origin", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) { s.Origin = "cloud" },
			wantErr: `origin "cloud"`},
		{name: "bad identifier", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) { s.Identifier = "Creds" },
			wantErr: `identifier "Creds"`},
		{name: "no kind", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) { s.Kind = "" }, wantErr: "kind is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := good
			tt.mutate(&s)
			_, err := Compile([]ferryv1alpha1.RelatedResourceSpec{s})
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
	if _, err := Compile([]ferryv1alpha1.RelatedResourceSpec{good, good}); err == nil || !strings.Contains(err.Error(), `spec.related[0] (kind Secret, identifier set) and spec.related[1] (kind Secret, identifier set) both have the identifier "creds": set identifier`) {
		t.Errorf("duplicate identifiers: error = %v", err)
	}
}

// TestDefaultIdentifier: an entry without identifier (the seeds'
// cert-manager example) is keyed by its kind in lowercase; two such entries
// of one kind are refused naming both.
func TestDefaultIdentifier(t *testing.T) {
	s := spec(ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}, nil)
	s.Identifier = ""
	refs, err := Compile([]ferryv1alpha1.RelatedResourceSpec{s})
	if err != nil {
		t.Fatal(err)
	}
	if refs[0].Identifier != "secret" {
		t.Errorf("identifier %q, want secret", refs[0].Identifier)
	}
	named := spec(ferryv1alpha1.ResourceLocator{Path: "spec.other"}, nil)
	named.Identifier = "secret"
	_, err = Compile([]ferryv1alpha1.RelatedResourceSpec{s, named})
	if err == nil || !strings.Contains(err.Error(), `spec.related[0] (kind Secret, identifier by default) and spec.related[1] (kind Secret, identifier set) both have the identifier "secret": set identifier on them`) {
		t.Errorf("duplicate default identifier: %v", err)
	}
}

// TestOriginPlatform: the seeds' "platform" is kcp, and the compiled entry
// says kcp, so every comparison of Reference.Origin treats it as kcp.
func TestOriginPlatform(t *testing.T) {
	for _, origin := range []ferryv1alpha1.RelatedResourceOrigin{"platform", "kcp", "service"} {
		s := spec(ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}, nil)
		s.Origin = origin
		refs, err := Compile([]ferryv1alpha1.RelatedResourceSpec{s})
		if err != nil {
			t.Fatalf("origin %s: %v", origin, err)
		}
		want := origin
		if origin == "platform" {
			want = ferryv1alpha1.OriginKCP
		}
		if refs[0].Origin != want {
			t.Errorf("origin %s compiles to %s, want %s", origin, refs[0].Origin, want)
		}
	}
}

func TestResourceDefaults(t *testing.T) {
	s := spec(ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}, nil)
	s.Kind = "ConfigMap"
	refs, err := Compile([]ferryv1alpha1.RelatedResourceSpec{s})
	if err != nil {
		t.Fatal(err)
	}
	if got := refs[0].Resource.String(); got != "/v1, Resource=configmaps" {
		t.Errorf("Resource = %s", got)
	}
	if refs[0].HasNamespace() {
		t.Error("HasNamespace = true without reference.namespace")
	}
}

// FuzzLocate checks that no pattern, replacement or object value makes
// Compile or Locate panic, and that a located name is always valid.
func FuzzLocate(f *testing.F) {
	f.Add("spec.secretName", "^(.*)$", "$1-x", "db-creds")
	f.Add("spec.secretName", "", "static", "")
	f.Add("spec..x", "(", "", "v")
	f.Add("spec.list.0", "a+", "b", "aaa")
	f.Fuzz(func(t *testing.T, path, pattern, replacement, value string) {
		s := spec(ferryv1alpha1.ResourceLocator{Path: path}, nil)
		if pattern != "" || replacement != "" {
			s.Reference.Name.Regex = &ferryv1alpha1.RegexReplacement{Pattern: pattern, Replacement: replacement}
		}
		refs, err := Compile([]ferryv1alpha1.RelatedResourceSpec{s})
		if err != nil {
			return
		}
		obj := map[string]any{
			"metadata": map[string]any{"namespace": "ns"},
			"spec":     map[string]any{"secretName": value, "list": []any{value}},
		}
		ns, name, err := refs[0].Locate(obj)
		if err != nil {
			return
		}
		if ns != "ns" || name == "" || len(name) > 253 {
			t.Fatalf("Locate = %q/%q", ns, name)
		}
	})
}

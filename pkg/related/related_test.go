package related

import (
	"crypto/sha3"
	"encoding/hex"
	"strings"
	"testing"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

func spec(name ferryv1alpha1.ResourceLocator, ns *ferryv1alpha1.ResourceLocator) ferryv1alpha1.RelatedResourceSpec {
	return ferryv1alpha1.RelatedResourceSpec{
		Identifier: "creds", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
		Reference: &ferryv1alpha1.RelatedResourceReference{Name: name, Namespace: ns},
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
			ns, name, err := refs[0].Locate(obj, Env{Side: ferryv1alpha1.OriginKCP, ClusterName: "abc"})
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
		{name: "no kind", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) { s.Kind = "" }, wantErr: "set kind (e.g. Secret) or resource"},
		{name: "syncStatus with origin kcp", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) { s.Origin, s.SyncStatus = ferryv1alpha1.OriginKCP, true },
			wantErr: "syncStatus: only a service-origin related object's status"},
		{name: "identityHash not a hash", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) { s.Group, s.IdentityHash = "other.example.com", "abc" },
			wantErr: "identityHash: the other APIExport's status.identityHash is 64 lowercase hex characters"},
		{name: "identityHash of a core kind", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) { s.IdentityHash = strings.Repeat("ab", 32) },
			wantErr: "identityHash: kinds of the core group have no identity"},
		{name: "mutation with a bad regex", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Mutation = &ferryv1alpha1.ResourceMutationSpec{Spec: []ferryv1alpha1.ResourceMutation{
				{Regex: &ferryv1alpha1.RegexMutation{Path: "data.x", Pattern: "(", Replacement: "y"}}}}
		}, wantErr: "spec.related[creds]: mutation.spec[0].regex"},
		{name: "mutation with a bad CEL expression", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Mutation = &ferryv1alpha1.ResourceMutationSpec{Spec: []ferryv1alpha1.ResourceMutation{
				{CEL: &ferryv1alpha1.CELMutation{Path: "data.x", Expression: "object.("}}}}
		}, wantErr: "mutation.spec[0].cel"},
		{name: "mutation with a rudi step", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Mutation = &ferryv1alpha1.ResourceMutationSpec{Spec: []ferryv1alpha1.ResourceMutation{{Rudi: &ferryv1alpha1.RudiMutation{}}}}
		}, wantErr: "mutation.spec[0].rudi: Rudi is not supported"},
		{name: "status mutation without syncStatus", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Mutation = &ferryv1alpha1.ResourceMutationSpec{Status: []ferryv1alpha1.ResourceMutation{
				{Delete: &ferryv1alpha1.DeleteMutation{Path: "status.secret"}}}}
		}, wantErr: "mutation.status: a related object's status travels only with syncStatus"},
		{name: "list path for origin kcp", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Origin, s.Reference.Name.Path = ferryv1alpha1.OriginKCP, "spec.users.#.name"
		}, wantErr: "supports for origin service only so far"},
		{name: "list path with two #", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) { s.Reference.Name.Path = "spec.a.#.b.#.c" },
			wantErr: "reference.name.path: path \"spec.a.#.b.#.c\" has more than one"},
		{name: "list path starting with #", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) { s.Reference.Name.Path = "#.name" },
			wantErr: "starts with"},
		{name: "list path with a static name", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Reference.Name = ferryv1alpha1.ResourceLocator{Path: "spec.users.#.name", Regex: &ferryv1alpha1.RegexReplacement{Replacement: "x"}}
		}, wantErr: "gives every item the same static name"},
		{name: "list path for the namespace", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Reference.Namespace = &ferryv1alpha1.ResourceLocator{Path: "spec.users.#.ns"}
		}, wantErr: "reference.namespace.path \"spec.users.#.ns\" lists several values"},
		{name: "list path for object.namespace", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Reference = nil
			s.Object = &ferryv1alpha1.RelatedResourceObject{
				RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: "spec.users.#.name"}},
				Namespace:                 &ferryv1alpha1.RelatedResourceObjectSpec{Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: "spec.users.#.ns"}}}
		}, wantErr: "object.namespace.reference.path"},
		{name: "projection with kind", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Projection = &ferryv1alpha1.RelatedResourceProjection{Group: "x"}
		}, wantErr: "projection: name the origin side's resource"},
		{name: "empty projection", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Kind, s.Resource, s.Projection = "", "secrets", &ferryv1alpha1.RelatedResourceProjection{}
		}, wantErr: "projection: set at least one of group, version and resource"},
		{name: "projection to an uppercase plural", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Kind, s.Resource, s.Projection = "", "secrets", &ferryv1alpha1.RelatedResourceProjection{Resource: "Secrets"}
		}, wantErr: "projection.resource \"Secrets\": the lowercase plural"},
		{name: "projection to an invalid group", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Kind, s.Resource, s.Projection = "", "secrets", &ferryv1alpha1.RelatedResourceProjection{Group: "a_b"}
		}, wantErr: "projection.group \"a_b\""},
		{name: "uppercase resource", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) { s.Kind, s.Resource = "", "Secrets" },
			wantErr: `resource "Secrets": the lowercase plural`},
		{name: "reference and object", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Object = &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
				Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: "spec.secretName"}}}
		}, wantErr: "set reference or object, not both"},
		{name: "neither reference nor object", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) { s.Reference = nil },
			wantErr: "set reference or object to say where"},
		{name: "two locators in object", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Reference = nil
			s.Object = &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
				Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: "spec.secretName"},
				Template:  &ferryv1alpha1.TemplateExpression{Template: "x"}}}
		}, wantErr: "object: set exactly one of reference, template and selector"},
		{name: "no locator in object.namespace", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Reference = nil
			s.Object = &ferryv1alpha1.RelatedResourceObject{
				RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{Template: &ferryv1alpha1.TemplateExpression{Template: "x"}},
				Namespace:                 &ferryv1alpha1.RelatedResourceObjectSpec{}}
		}, wantErr: "object.namespace: set exactly one of reference, template and selector"},
		{name: "bad template", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Reference = nil
			s.Object = &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
				Template: &ferryv1alpha1.TemplateExpression{Template: "{{ .Object"}}}
		}, wantErr: "object.template is not a valid template"},
		{name: "bad object regex", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Reference = nil
			s.Object = &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
				Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: "spec.secretName", Regex: &ferryv1alpha1.RegexReplacement{Pattern: "("}}}}
		}, wantErr: "object.reference.regex.pattern"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := *good.DeepCopy()
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
		ns, name, err := refs[0].Locate(obj, Env{Side: ferryv1alpha1.OriginService})
		if err != nil {
			return
		}
		if ns != "ns" || name == "" || len(name) > 253 {
			t.Fatalf("Locate = %q/%q", ns, name)
		}
	})
}

// objectSpec is an entry in api-syncagent's spelling: resource and object.
func objectSpec(name ferryv1alpha1.RelatedResourceObjectSpec, ns *ferryv1alpha1.RelatedResourceObjectSpec) ferryv1alpha1.RelatedResourceSpec {
	return ferryv1alpha1.RelatedResourceSpec{
		Identifier: "creds", Origin: ferryv1alpha1.OriginService, Resource: "secrets", Version: "v1",
		Object: &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: name, Namespace: ns},
	}
}

func objRef(path string, re *ferryv1alpha1.RegexReplacement) ferryv1alpha1.RelatedResourceObjectSpec {
	return ferryv1alpha1.RelatedResourceObjectSpec{Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: path, Regex: re}}
}

func objTmpl(text string) ferryv1alpha1.RelatedResourceObjectSpec {
	return ferryv1alpha1.RelatedResourceObjectSpec{Template: &ferryv1alpha1.TemplateExpression{Template: text}}
}

// TestLocateObjectSpelling: api-syncagent's object.{reference,template}
// and object.namespace locate the same objects ferry's spelling does, and
// templates see the side and the workspace.
func TestLocateObjectSpelling(t *testing.T) {
	kcp := Env{Side: ferryv1alpha1.OriginKCP, ClusterName: "2x4k", ClusterPath: "root:team"}
	svc := Env{Side: ferryv1alpha1.OriginService, ClusterName: "2x4k"}
	tests := []struct {
		name          string
		spec          ferryv1alpha1.RelatedResourceSpec
		env           Env
		wantNamespace string
		wantName      string
		wantErr       string
	}{
		{name: "reference", spec: objectSpec(objRef("spec.secretName", nil), nil), env: kcp, wantNamespace: "team-a", wantName: "db-creds"},
		{name: "reference with regex", spec: objectSpec(objRef("spec.secretName", &ferryv1alpha1.RegexReplacement{Pattern: "-creds$", Replacement: "-tls"}), nil),
			env: kcp, wantNamespace: "team-a", wantName: "db-tls"},
		{name: "template", spec: objectSpec(objTmpl("{{ .Object.spec.secretName }}"), nil), env: svc, wantNamespace: "team-a", wantName: "db-creds"},
		{name: "template by side, kcp", spec: objectSpec(objTmpl(`{{ if eq .Side "kcp" }}in-kcp{{ else }}local{{ end }}`), nil),
			env: kcp, wantNamespace: "team-a", wantName: "in-kcp"},
		{name: "template by side, service", spec: objectSpec(objTmpl(`{{ if eq .Side "kcp" }}in-kcp{{ else }}local{{ end }}`), nil),
			env: svc, wantNamespace: "team-a", wantName: "local"},
		{name: "template with workspace and hash", spec: objectSpec(objTmpl(`{{ .ClusterName }}-{{ sha3short .Object.metadata.name 8 }}`), nil),
			env: kcp, wantNamespace: "team-a", wantName: "2x4k-" + sha3short8("db")},
		{name: "namespace by reference", spec: objectSpec(objRef("metadata.name", nil), ptr(objRef("spec.nested.ns", nil))),
			env: kcp, wantNamespace: "vault", wantName: "db"},
		{name: "namespace by template", spec: objectSpec(objRef("metadata.name", nil), ptr(objTmpl("{{ .ClusterPath | replace \":\" \"-\" }}"))),
			env: kcp, wantNamespace: "root-team", wantName: "db"},
		{name: "template output trimmed", spec: objectSpec(objTmpl("  {{ .Object.spec.secretName }}\n"), nil), env: kcp, wantNamespace: "team-a", wantName: "db-creds"},
		{name: "template missing key", spec: objectSpec(objTmpl("{{ .Object.spec.nope.deeper }}"), nil), env: kcp, wantErr: `related "creds": object.template`},
		{name: "template empty", spec: objectSpec(objTmpl(`{{ "" }}`), nil), env: kcp, wantErr: "object.template gives an empty name"},
		{name: "template invalid name", spec: objectSpec(objTmpl("Not_Valid"), nil), env: kcp, wantErr: `object.template gives "Not_Valid", which is not a valid name`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			refs, err := Compile([]ferryv1alpha1.RelatedResourceSpec{tt.spec})
			if err != nil {
				t.Fatalf("Compile: %v", err)
			}
			ns, name, err := refs[0].Locate(primary(), tt.env)
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

func ptr[T any](v T) *T { return &v }

func sha3short8(s string) string {
	sum := sha3.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:8]
}

// TestResourceSpelling: an entry naming the resource claims exactly that
// resource in kcp, and takes the kind the edge resolves; one naming the
// kind guesses the plural. A .ClusterPath template is flagged so the edge
// can require workspace paths.
func TestResourceSpelling(t *testing.T) {
	s := objectSpec(objRef("spec.secretName", nil), nil)
	s.Group, s.Version, s.Resource = "example.com", "v2", "widgetsecrets"
	refs, err := Compile([]ferryv1alpha1.RelatedResourceSpec{s})
	if err != nil {
		t.Fatal(err)
	}
	r := refs[0]
	if !r.ByResource || r.Resource.String() != "example.com/v2, Resource=widgetsecrets" || r.Kind.Kind != "" {
		t.Fatalf("Reference = %+v", r)
	}
	r.ResolveKind("WidgetSecret")
	if r.Kind.String() != "example.com/v2, Kind=WidgetSecret" {
		t.Errorf("Kind = %s", r.Kind)
	}
	if r.UsesClusterPath() {
		t.Error("UsesClusterPath without a template")
	}
	// Sent to the broker with the kind the edge resolved: both are set.
	s.Kind = "WidgetSecret"
	if refs, err = Compile([]ferryv1alpha1.RelatedResourceSpec{s}); err != nil || refs[0].Resource.Resource != "widgetsecrets" || refs[0].Kind.Kind != "WidgetSecret" {
		t.Fatalf("Compile with kind and resource = %+v, %v", refs, err)
	}
	p := objectSpec(objRef("metadata.name", nil), ptr(objTmpl("{{ .ClusterPath }}")))
	if refs, err = Compile([]ferryv1alpha1.RelatedResourceSpec{p}); err != nil || !refs[0].UsesClusterPath() {
		t.Errorf("UsesClusterPath = false for a namespace template reading .ClusterPath (%v)", err)
	}
}

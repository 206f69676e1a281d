package related

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

func selectorSpec(match map[string]string, rewrite ferryv1alpha1.RelatedResourceSelectorRewrite) ferryv1alpha1.RelatedResourceSpec {
	return ferryv1alpha1.RelatedResourceSpec{
		Identifier: "certs", Origin: ferryv1alpha1.OriginService, Resource: "secrets", Version: "v1",
		Object: &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
			Selector: &ferryv1alpha1.RelatedResourceObjectSelector{LabelSelector: metav1.LabelSelector{MatchLabels: match}, Rewrite: rewrite},
		}},
	}
}

func regexRewrite(pattern, replacement string) ferryv1alpha1.RelatedResourceSelectorRewrite {
	return ferryv1alpha1.RelatedResourceSelectorRewrite{Regex: &ferryv1alpha1.RegexReplacement{Pattern: pattern, Replacement: replacement}}
}

func templateRewrite(text string) ferryv1alpha1.RelatedResourceSelectorRewrite {
	return ferryv1alpha1.RelatedResourceSelectorRewrite{Template: &ferryv1alpha1.TemplateExpression{Template: text}}
}

// TestSelector: matchLabels keys and values are templates over the local
// primary; a key that renders empty is left out; a selector that selects
// everything is refused.
func TestSelector(t *testing.T) {
	svc := Env{Side: ferryv1alpha1.OriginService, ClusterName: "2x4k"}
	tests := []struct {
		name      string
		match     map[string]string
		matches   labels.Set
		nomatches labels.Set
		wantErr   string
	}{
		{name: "static", match: map[string]string{"app": "db"}, matches: labels.Set{"app": "db", "x": "y"}, nomatches: labels.Set{"app": "web"}},
		{name: "value from the primary", match: map[string]string{"owner": "{{ .LocalObject.metadata.name }}"},
			matches: labels.Set{"owner": "db"}, nomatches: labels.Set{"owner": "other"}},
		{name: "workspace", match: map[string]string{"ws": "{{ .ClusterName }}", "app": "db"},
			matches: labels.Set{"ws": "2x4k", "app": "db"}, nomatches: labels.Set{"app": "db"}},
		{name: "empty key left out", match: map[string]string{`{{ "" }}`: "x", "app": "db"}, matches: labels.Set{"app": "db"}},
		{name: "everything", match: map[string]string{`{{ "" }}`: "x"}, wantErr: "selects everything"},
		{name: "missing key", match: map[string]string{"owner": "{{ .LocalObject.spec.nope.x }}"}, wantErr: `related "certs": object.selector`},
		{name: "invalid value", match: map[string]string{"owner": "not valid!"}, wantErr: "object.selector"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			refs, err := Compile([]ferryv1alpha1.RelatedResourceSpec{selectorSpec(tt.match, regexRewrite("", "x"))})
			if err != nil {
				t.Fatal(err)
			}
			if !refs[0].IsSelector() {
				t.Fatal("IsSelector = false")
			}
			sel, err := refs[0].Selector(primary(), svc)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !sel.Matches(tt.matches) {
				t.Errorf("%s does not match %v", sel, tt.matches)
			}
			if tt.nomatches != nil && sel.Matches(tt.nomatches) {
				t.Errorf("%s matches %v", sel, tt.nomatches)
			}
		})
	}
}

// TestRewrite: the found name becomes the kcp name by a regex (both $1
// groups and a static value) or a template over .Value and .RelatedObject.
func TestRewrite(t *testing.T) {
	found := map[string]any{"metadata": map[string]any{"labels": map[string]any{"slot": "a"}}}
	tests := []struct {
		name    string
		rewrite ferryv1alpha1.RelatedResourceSelectorRewrite
		value   string
		want    string
		wantErr string
	}{
		{name: "regex", rewrite: regexRewrite("^x9f3-(.+)$", "db-$1"), value: "x9f3-cert", want: "db-cert"},
		{name: "regex without a match keeps the name", rewrite: regexRewrite("^zz-(.+)$", "$1"), value: "cert", want: "cert"},
		{name: "template over the value", rewrite: templateRewrite("{{ .Value | trimPrefix \"x9f3-\" }}-copy"), value: "x9f3-cert", want: "cert-copy"},
		{name: "template over the found object", rewrite: templateRewrite("{{ .Object.metadata.name }}-{{ .RelatedObject.metadata.labels.slot }}"), value: "x", want: "db-a"},
		{name: "invalid name", rewrite: templateRewrite("Not_Valid"), value: "x", wantErr: `gives "Not_Valid" for x, which is not a valid name`},
		{name: "empty name", rewrite: regexRewrite("^.*$", ""), value: "x", wantErr: "gives an empty name for x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			refs, err := Compile([]ferryv1alpha1.RelatedResourceSpec{selectorSpec(map[string]string{"app": "db"}, tt.rewrite)})
			if err != nil {
				t.Fatal(err)
			}
			got, err := refs[0].Rewrite(found, primary(), tt.value, Env{Side: ferryv1alpha1.OriginService})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("Rewrite = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// TestSelectorCompileErrors: a selector for origin kcp, a namespace
// selector, a rewrite with both or neither way and a bad expression are
// refused with what to write instead; Locate of a selector entry fails.
func TestSelectorCompileErrors(t *testing.T) {
	good := selectorSpec(map[string]string{"app": "db"}, regexRewrite("a", "b"))
	tests := []struct {
		name    string
		mutate  func(*ferryv1alpha1.RelatedResourceSpec)
		wantErr string
	}{
		{name: "origin kcp", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) { s.Origin = ferryv1alpha1.OriginKCP },
			wantErr: "needs origin service|for origin kcp locate the object by reference or template"},
		{name: "namespace selector", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Object.Namespace = &ferryv1alpha1.RelatedResourceObjectSpec{Selector: s.Object.Selector}
		}, wantErr: "object.namespace.selector: namespaces cannot be selected by labels"},
		{name: "rewrite both", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Object.Selector.Rewrite.Template = &ferryv1alpha1.TemplateExpression{Template: "x"}
		}, wantErr: "rewrite: set exactly one of regex and template"},
		{name: "rewrite neither", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) { s.Object.Selector.Rewrite.Regex = nil },
			wantErr: "rewrite: set exactly one of regex and template"},
		{name: "bad rewrite regex", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) { s.Object.Selector.Rewrite.Regex.Pattern = "(" },
			wantErr: "rewrite.regex.pattern"},
		{name: "bad expression", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Object.Selector.MatchExpressions = []metav1.LabelSelectorRequirement{{Key: "app", Operator: "Near"}}
		}, wantErr: "object.selector.matchExpressions"},
		{name: "bad label template", mutate: func(s *ferryv1alpha1.RelatedResourceSpec) {
			s.Object.Selector.MatchLabels = map[string]string{"app": "{{"}
		},
			wantErr: "is not a valid template"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := *good.DeepCopy()
			tt.mutate(&s)
			_, err := Compile([]ferryv1alpha1.RelatedResourceSpec{s})
			ok := false
			for _, want := range strings.Split(tt.wantErr, "|") {
				ok = ok || err != nil && strings.Contains(err.Error(), want)
			}
			if !ok {
				t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
			}
		})
	}
	refs, err := Compile([]ferryv1alpha1.RelatedResourceSpec{good})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := refs[0].Locate(primary(), Env{}); err == nil || !strings.Contains(err.Error(), "selects its objects by labels") {
		t.Errorf("Locate of a selector entry: %v", err)
	}
}

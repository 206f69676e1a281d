package v1alpha1

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestNamespaceFilterJSON(t *testing.T) {
	cases := []struct {
		name     string
		in       string
		wantName string
		wantSel  bool
		wantErr  string // from Validate
	}{
		{name: "a namespace name (seeds)", in: `"my-app"`, wantName: "my-app"},
		{name: "a label selector", in: `{"matchLabels":{"env":"prod"}}`, wantSel: true},
		{name: "an expression selector", in: `{"matchExpressions":[{"key":"env","operator":"Exists"}]}`, wantSel: true},
		{name: "a number", in: `42`, wantErr: "spec.filter.namespace is 42: write a kcp namespace name"},
		{name: "a list", in: `["a"]`, wantErr: `spec.filter.namespace is ["a"]`},
		{name: "an invalid name", in: `"My_App"`, wantErr: `"My_App": write a kcp namespace name`},
		{name: "an empty name", in: `""`, wantErr: `spec.filter.namespace is ""`},
		{name: "an unknown key", in: `{"matchLabel":{"a":"b"}}`, wantErr: "matchLabel"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var f ResourceFilter
			if err := json.Unmarshal([]byte(`{"namespace":`+tc.in+`}`), &f); err != nil {
				t.Fatalf("decoding must never fail: %v", err)
			}
			err := f.Namespace.Validate()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Validate() = %v, want %q", err, tc.wantErr)
				}
				if _, ok := f.Namespace.NamespaceName(); ok {
					t.Error("an invalid filter names a namespace")
				}
			} else if err != nil {
				t.Fatalf("Validate() = %v", err)
			}
			name, _ := f.Namespace.NamespaceName()
			if name != tc.wantName {
				t.Errorf("NamespaceName() = %q, want %q", name, tc.wantName)
			}
			if _, ok := f.Namespace.LabelSelector(); ok != tc.wantSel {
				t.Errorf("LabelSelector() ok = %v, want %v", ok, tc.wantSel)
			}
			// Written back as read.
			out, err := json.Marshal(f)
			if err != nil {
				t.Fatal(err)
			}
			var round, orig map[string]any
			_ = json.Unmarshal(out, &round)
			_ = json.Unmarshal([]byte(`{"namespace":`+tc.in+`}`), &orig)
			if a, b := mustJSON(t, round), mustJSON(t, orig); a != b {
				t.Errorf("round trip %s, want %s", a, b)
			}
		})
	}
	var none ResourceFilter
	if err := json.Unmarshal([]byte(`{}`), &none); err != nil || none.Namespace != nil || none.Namespace.Validate() != nil {
		t.Errorf("no filter.namespace: %v %+v", err, none.Namespace)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

package publish

import (
	"errors"
	"strings"
	"testing"

	apisv1alpha2 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

func entry(group, name, schema string) apisv1alpha2.ResourceSchema {
	return apisv1alpha2.ResourceSchema{Group: group, Name: name, Schema: schema,
		Storage: apisv1alpha2.ResourceSchemaStorage{CRD: &apisv1alpha2.ResourceSchemaStorageCRD{}}}
}

func TestMergeExport(t *testing.T) {
	secrets := apisv1alpha2.PermissionClaim{GroupResource: apisv1alpha2.GroupResource{Resource: "secrets"}, Verbs: claimVerbs}
	handMade := apisv1alpha2.PermissionClaim{GroupResource: apisv1alpha2.GroupResource{Resource: "configmaps"}, Verbs: []string{"get"}}
	tests := []struct {
		name        string
		spec        apisv1alpha2.APIExportSpec
		claims      []apisv1alpha2.PermissionClaim
		wantChanged bool
		wantRes     []apisv1alpha2.ResourceSchema
		wantClaims  int
	}{
		{
			name: "adds to an empty export", wantChanged: true,
			wantRes: []apisv1alpha2.ResourceSchema{entry("g", "certs", "v1.certs.g")},
		},
		{
			name:        "unchanged entry is a no-op",
			spec:        apisv1alpha2.APIExportSpec{Resources: []apisv1alpha2.ResourceSchema{entry("g", "certs", "v1.certs.g")}},
			wantChanged: false,
			wantRes:     []apisv1alpha2.ResourceSchema{entry("g", "certs", "v1.certs.g")},
		},
		{
			name: "replaces only its own entry; others survive",
			spec: apisv1alpha2.APIExportSpec{Resources: []apisv1alpha2.ResourceSchema{
				entry("other.example.com", "things", "v9.things.other"), entry("g", "certs", "old.certs.g"), entry("g", "issuers", "v1.issuers.g"),
			}},
			wantChanged: true,
			wantRes: []apisv1alpha2.ResourceSchema{
				entry("other.example.com", "things", "v9.things.other"), entry("g", "certs", "v1.certs.g"), entry("g", "issuers", "v1.issuers.g"),
			},
		},
		{
			name:        "adds missing claims, keeps existing ones",
			spec:        apisv1alpha2.APIExportSpec{Resources: []apisv1alpha2.ResourceSchema{entry("g", "certs", "v1.certs.g")}, PermissionClaims: []apisv1alpha2.PermissionClaim{handMade}},
			claims:      []apisv1alpha2.PermissionClaim{secrets, {GroupResource: apisv1alpha2.GroupResource{Resource: "configmaps"}, Verbs: claimVerbs}},
			wantChanged: true,
			wantRes:     []apisv1alpha2.ResourceSchema{entry("g", "certs", "v1.certs.g")},
			wantClaims:  2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := tt.spec.DeepCopy()
			changed := mergeExport(spec, "g", "certs", "v1.certs.g", tt.claims)
			if changed != tt.wantChanged {
				t.Errorf("changed = %v, want %v", changed, tt.wantChanged)
			}
			if len(spec.Resources) != len(tt.wantRes) {
				t.Fatalf("resources %v, want %v", spec.Resources, tt.wantRes)
			}
			for i := range tt.wantRes {
				if spec.Resources[i].Group != tt.wantRes[i].Group || spec.Resources[i].Name != tt.wantRes[i].Name || spec.Resources[i].Schema != tt.wantRes[i].Schema {
					t.Errorf("resource %d = %+v, want %+v", i, spec.Resources[i], tt.wantRes[i])
				}
			}
			if len(spec.PermissionClaims) != tt.wantClaims {
				t.Errorf("claims %v, want %d", spec.PermissionClaims, tt.wantClaims)
			}
			for _, c := range spec.PermissionClaims {
				if c.Resource == "configmaps" && len(c.Verbs) != 1 {
					t.Errorf("an existing claim was rewritten: %v", c)
				}
			}
		})
	}
}

func TestRelatedClaims(t *testing.T) {
	got := relatedClaims("export.example", []ferryv1alpha1.RelatedResourceSpec{
		{Identifier: "a", Kind: "Secret"},
		{Identifier: "b", Kind: "Secret"},
		{Identifier: "c", Kind: "ConfigMap"},
		{Identifier: "d", Kind: "Certificate", Group: "cert-manager.io"},
		// api-syncagent's spelling names the resource; the edge adds the
		// kind it resolved, whose guessed plural would be wrong here.
		{Identifier: "e", Resource: "geese", Kind: "Goose", Group: "farm.example"},
		// The APIExport's own resource: served to bound workspaces, no claim.
		{Identifier: "f", Resource: "grants", Kind: "Grant", Group: "export.example"},
	})
	want := []string{"secrets", "configmaps", "certificates.cert-manager.io", "geese.farm.example"}
	if len(got) != len(want) {
		t.Fatalf("claims %v, want %v", got, want)
	}
	for i, w := range want {
		if got[i].String() != w || len(got[i].Verbs) == 0 {
			t.Errorf("claim %d = %v, want %s with verbs", i, got[i], w)
		}
	}
}

func TestForget(t *testing.T) {
	owners := Owners{"certs": "pr-a", "issuers": "pr-b"}
	Forget(owners, "pr-a")
	if _, ok := owners["certs"]; ok || owners["issuers"] != "pr-b" {
		t.Errorf("owners after Forget: %v", owners)
	}
}

// TestRelatedScopeProblem: the broker refuses related kinds kcp serves
// cluster-scoped or not at all, whatever the edge checked.
func TestRelatedScopeProblem(t *testing.T) {
	discovery := map[string]*metav1.APIResourceList{
		"v1": {GroupVersion: "v1", APIResources: []metav1.APIResource{
			{Name: "secrets", Namespaced: true}, {Name: "namespaces", Namespaced: false},
		}},
		"rbac.authorization.k8s.io/v1": {GroupVersion: "rbac.authorization.k8s.io/v1", APIResources: []metav1.APIResource{
			{Name: "clusterrolebindings", Namespaced: false},
		}},
	}
	resourcesFor := func(gv string) (*metav1.APIResourceList, error) {
		if gv == "broken/v1" {
			return nil, errors.New("connection refused")
		}
		if l, ok := discovery[gv]; ok {
			return l, nil
		}
		return nil, apierrors.NewNotFound(schema.GroupResource{}, gv)
	}
	entry := func(group, kind string) ferryv1alpha1.RelatedResourceSpec {
		return ferryv1alpha1.RelatedResourceSpec{Identifier: "x", Group: group, Kind: kind}
	}
	cases := []struct {
		name    string
		entry   ferryv1alpha1.RelatedResourceSpec
		problem string
		err     bool
	}{
		{name: "namespaced", entry: entry("", "Secret")},
		{name: "cluster-scoped core kind", entry: entry("", "Namespace"), problem: "namespaces is cluster-scoped in kcp"},
		{name: "cluster-scoped group kind", entry: entry("rbac.authorization.k8s.io", "ClusterRoleBinding"), problem: "clusterrolebindings.rbac.authorization.k8s.io is cluster-scoped"},
		{name: "kind not in its group", entry: entry("", "Widget"), problem: "kcp does not serve widgets"},
		{name: "group not served", entry: entry("example.com", "Widget"), problem: "kcp does not serve widgets.example.com"},
		{name: "discovery failing is retried", entry: entry("broken", "Widget"), err: true},
		{name: "the APIExport's own resource", entry: entry("export.example", "Grant")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := relatedScopeProblem("export.example", []ferryv1alpha1.RelatedResourceSpec{tc.entry}, resourcesFor)
			if (err != nil) != tc.err {
				t.Fatalf("err = %v, want error %v", err, tc.err)
			}
			if (tc.problem == "") != (got == "") || !strings.Contains(got, tc.problem) {
				t.Fatalf("problem %q, want one containing %q", got, tc.problem)
			}
		})
	}
}

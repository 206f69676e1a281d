package publish

import (
	"strings"
	"testing"

	apisv1alpha2 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
)

var (
	hashA = strings.Repeat("a1", 32)
	hashB = strings.Repeat("b2", 32)
)

// TestRelatedClaimsCarryIdentity: a related kind of another APIExport is
// claimed with that export's identity; kinds kcp serves everywhere are
// claimed without one.
func TestRelatedClaimsCarryIdentity(t *testing.T) {
	got := relatedClaims("export.example", []ferryv1alpha1.RelatedResourceSpec{
		{Identifier: "a", Kind: "Secret"},
		{Identifier: "b", Resource: "certificates", Kind: "Certificate", Group: "certs.example", IdentityHash: hashA},
		{Identifier: "c", Resource: "certificates", Kind: "Certificate", Group: "certs.example", IdentityHash: hashA},
	})
	want := []string{"secrets", "certificates.certs.example:" + hashA}
	if len(got) != len(want) {
		t.Fatalf("claims %v, want %v", got, want)
	}
	for i, w := range want {
		if got[i].String() != w || len(got[i].Verbs) == 0 {
			t.Errorf("claim %d = %v, want %s with verbs", i, got[i], w)
		}
	}
	if msg := identityClaimProblem(got); msg != "" {
		t.Errorf("one identity per resource refused: %s", msg)
	}
}

// TestIdentityClaimProblem: one resource related with two identities (or
// with one and without) is refused: kcp serves one claim per resource.
func TestIdentityClaimProblem(t *testing.T) {
	for _, second := range []string{hashB, ""} {
		claims := relatedClaims("export.example", []ferryv1alpha1.RelatedResourceSpec{
			{Identifier: "a", Resource: "certificates", Group: "certs.example", IdentityHash: hashA},
			{Identifier: "b", Resource: "certificates", Group: "certs.example", IdentityHash: second},
		})
		msg := identityClaimProblem(claims)
		if !strings.Contains(msg, "certificates.certs.example is related with two identities") || !strings.Contains(msg, "the same identityHash") {
			t.Errorf("second identity %q: problem %q", second, msg)
		}
	}
}

// TestClaimRewriteProblem: a claim the APIExport has is never rewritten;
// a changed identity is refused with what to write instead, the same one
// merges as a no-op.
func TestClaimRewriteProblem(t *testing.T) {
	export := config.APIExportRef{Workspace: "root:provider", Name: "export.example"}
	claim := func(hash string) apisv1alpha2.PermissionClaim {
		return apisv1alpha2.PermissionClaim{GroupResource: apisv1alpha2.GroupResource{Group: "certs.example", Resource: "certificates"}, Verbs: claimVerbs, IdentityHash: hash}
	}
	secrets := apisv1alpha2.PermissionClaim{GroupResource: apisv1alpha2.GroupResource{Resource: "secrets"}, Verbs: claimVerbs}
	existing := []apisv1alpha2.PermissionClaim{secrets, claim(hashA)}
	cases := []struct {
		name    string
		claims  []apisv1alpha2.PermissionClaim
		problem string
	}{
		{name: "same identity", claims: []apisv1alpha2.PermissionClaim{secrets, claim(hashA)}},
		{name: "another resource", claims: []apisv1alpha2.PermissionClaim{{GroupResource: apisv1alpha2.GroupResource{Group: "certs.example", Resource: "issuers"}, IdentityHash: hashB}}},
		{name: "changed identity", claims: []apisv1alpha2.PermissionClaim{claim(hashB)},
			problem: "APIExport root:provider/export.example already claims certificates.certs.example with identity " + hashA + ", and ferry never rewrites a claim consumers accepted: set identityHash to " + hashA},
		{name: "identity dropped", claims: []apisv1alpha2.PermissionClaim{claim("")}, problem: "set identityHash to " + hashA},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := claimRewriteProblem(export, existing, tc.claims)
			if (tc.problem == "") != (got == "") || !strings.Contains(got, tc.problem) {
				t.Fatalf("problem %q, want one containing %q", got, tc.problem)
			}
			if got != "" {
				return
			}
			spec := &apisv1alpha2.APIExportSpec{PermissionClaims: existing}
			spec = spec.DeepCopy()
			mergeExport(spec, "export.example", "things", "v1.things.export.example", tc.claims)
			for _, c := range spec.PermissionClaims {
				if c.Resource == "certificates" && c.IdentityHash != hashA {
					t.Errorf("the existing claim was rewritten or doubled: %v", spec.PermissionClaims)
				}
			}
		})
	}
	// A hand-made claim without identity for the same resource (a
	// built-in kind's spelling) is not rewritten either.
	if got := claimRewriteProblem(export, []apisv1alpha2.PermissionClaim{claim("")}, []apisv1alpha2.PermissionClaim{claim(hashA)}); !strings.Contains(got, "with identity none") || !strings.Contains(got, "drop identityHash") {
		t.Errorf("problem %q", got)
	}
}

// TestRelatedScopeOfAnotherExport: a kind of another APIExport is checked
// where the provider workspace serves it, and let through where it does
// not (kcp serves it only where its export is bound).
func TestRelatedScopeOfAnotherExport(t *testing.T) {
	discovery := map[string]*metav1.APIResourceList{
		"bound.example/v1": {GroupVersion: "bound.example/v1", APIResources: []metav1.APIResource{
			{Name: "certificates", Namespaced: true}, {Name: "clusterissuers", Namespaced: false},
		}},
	}
	resourcesFor := func(gv string) (*metav1.APIResourceList, error) {
		if l, ok := discovery[gv]; ok {
			return l, nil
		}
		return nil, apierrors.NewNotFound(schema.GroupResource{}, gv)
	}
	entry := func(group, resource, hash string) ferryv1alpha1.RelatedResourceSpec {
		return ferryv1alpha1.RelatedResourceSpec{Identifier: "x", Group: group, Resource: resource, IdentityHash: hash}
	}
	cases := []struct {
		name    string
		entry   ferryv1alpha1.RelatedResourceSpec
		problem string
	}{
		{name: "group not served here", entry: entry("other.example", "certificates", hashA)},
		{name: "resource not served in a served group", entry: entry("bound.example", "issuers", hashA)},
		{name: "served and namespaced", entry: entry("bound.example", "certificates", hashA)},
		{name: "served and cluster-scoped", entry: entry("bound.example", "clusterissuers", hashA), problem: "clusterissuers.bound.example is cluster-scoped in kcp"},
		{name: "not served, without identity", entry: entry("other.example", "certificates", ""), problem: "kcp does not serve certificates.other.example"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := relatedScopeProblem("export.example", []ferryv1alpha1.RelatedResourceSpec{tc.entry}, resourcesFor)
			if err != nil {
				t.Fatal(err)
			}
			if (tc.problem == "") != (got == "") || !strings.Contains(got, tc.problem) {
				t.Fatalf("problem %q, want one containing %q", got, tc.problem)
			}
		})
	}
}

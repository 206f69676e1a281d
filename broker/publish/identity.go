package publish

import (
	"fmt"

	apisv1alpha2 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha2"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/ferry-dev/ferry/broker/config"
)

// Claims of kinds another APIExport provides carry that export's identity
// hash. kcp keys a claim by group, resource and identity (EqualGRI), but
// its virtual workspace serves one claim per group and resource: two
// claims of one resource with different identities would leave it to
// chance which kind ferry reads and writes. And consumers accepted the
// claims an export has, so ferry never rewrites one. Both cases are
// refused with what to do instead.

// identityClaimProblem refuses (a message) the claims of a spec whose
// related entries name one resource with different identities.
func identityClaimProblem(claims []apisv1alpha2.PermissionClaim) string {
	for i, a := range claims {
		for _, b := range claims[i+1:] {
			if a.Group == b.Group && a.Resource == b.Resource && a.IdentityHash != b.IdentityHash {
				return fmt.Sprintf("spec.related: %s is related with two identities (%s and %s); a resource has one identity in kcp: give every entry of %s the same identityHash",
					groupResource(a), identityOrNone(a.IdentityHash), identityOrNone(b.IdentityHash), groupResource(a))
			}
		}
	}
	return ""
}

// claimRewriteProblem refuses (a message) claims that would rewrite an
// identity the APIExport already claims for the same resource: consumers
// accepted that claim, and kcp would serve only one of the two.
func claimRewriteProblem(export config.APIExportRef, existing, claims []apisv1alpha2.PermissionClaim) string {
	for _, c := range claims {
		for _, e := range existing {
			if c.Group == e.Group && c.Resource == e.Resource && c.IdentityHash != e.IdentityHash {
				keep := fmt.Sprintf("set identityHash to %s", e.IdentityHash)
				if e.IdentityHash == "" {
					keep = "drop identityHash"
				}
				return fmt.Sprintf("APIExport %s already claims %s with identity %s, and ferry never rewrites a claim consumers accepted: "+
					"%s, or remove that claim from the APIExport (every consumer then accepts the new one in its APIBinding)",
					export, groupResource(c), identityOrNone(e.IdentityHash), keep)
			}
		}
	}
	return ""
}

func groupResource(c apisv1alpha2.PermissionClaim) string {
	return schema.GroupResource{Group: c.Group, Resource: c.Resource}.String()
}

func identityOrNone(hash string) string {
	if hash == "" {
		return "none"
	}
	return hash
}

package related

import (
	"strings"
	"testing"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

// TestIdentityHashCompiles: an entry relating a kind of another APIExport
// compiles (it was refused before) and carries the identity to the claim.
func TestIdentityHashCompiles(t *testing.T) {
	hash := strings.Repeat("0f", 32)
	s := objectSpec(objRef("spec.certName", nil), nil)
	s.Group, s.Resource, s.IdentityHash = "certs.other.example.com", "certificates", hash
	refs, err := Compile([]ferryv1alpha1.RelatedResourceSpec{s})
	if err != nil {
		t.Fatal(err)
	}
	if refs[0].IdentityHash != hash {
		t.Errorf("IdentityHash = %q, want %q", refs[0].IdentityHash, hash)
	}
	if got := refs[0].Resource.String(); got != "certs.other.example.com/v1, Resource=certificates" {
		t.Errorf("Resource = %s", got)
	}
	// Without one, none is carried.
	s.IdentityHash = ""
	if refs, err = Compile([]ferryv1alpha1.RelatedResourceSpec{s}); err != nil {
		t.Fatal(err)
	}
	if refs[0].IdentityHash != "" {
		t.Errorf("without identityHash: IdentityHash = %q", refs[0].IdentityHash)
	}
}

package edgelease

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestName(t *testing.T) {
	long := strings.Repeat("a", 40) + "-" + strings.Repeat("b", 22) // a 63-character label
	tests := []struct {
		name       string
		edgeName   string
		identity   string
		wantPrefix string
	}{
		{name: "short name", edgeName: "databases", identity: "spiffe://example.com/edge/eu", wantPrefix: "ferry-databases-"},
		{name: "upper case is lowered", edgeName: "DataBases", identity: "spiffe://example.com/edge/eu", wantPrefix: "ferry-databases-"},
		{name: "longest label is cut", edgeName: long, identity: "x", wantPrefix: "ferry-" + long[:46] + "-"},
		{name: "cut never ends in a dash", edgeName: strings.Repeat("a", 45) + "-b", identity: "x", wantPrefix: "ferry-" + strings.Repeat("a", 45) + "-"},
		{name: "empty name still valid", edgeName: "", identity: "x", wantPrefix: "ferry-edge-"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Name(tt.edgeName, tt.identity)
			if !strings.HasPrefix(got, tt.wantPrefix) {
				t.Errorf("Name(%q, %q) = %q, want prefix %q", tt.edgeName, tt.identity, got, tt.wantPrefix)
			}
			if len(got) > 63 {
				t.Errorf("Name(%q, %q) = %q is %d characters long", tt.edgeName, tt.identity, got, len(got))
			}
			if msgs := validation.IsDNS1123Label(got); len(msgs) > 0 {
				t.Errorf("Name(%q, %q) = %q is not a DNS label: %v", tt.edgeName, tt.identity, got, msgs)
			}
			if again := Name(tt.edgeName, tt.identity); again != got {
				t.Errorf("Name is not stable: %q then %q", got, again)
			}
		})
	}
}

func TestNameTellsStandbysApart(t *testing.T) {
	active := Name("databases", "spiffe://example.com/edge/databases-eu")
	standby := Name("databases", "spiffe://example.com/edge/databases-us")
	if active == standby {
		t.Fatalf("two identities sharing the edge name databases got the same Lease %q", active)
	}
}

package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLoad(t *testing.T) {
	tests := []struct {
		name    string
		yaml    string
		wantErr []string
	}{
		{
			name: "valid",
			yaml: `
edges:
- identity: spiffe://ferry.local/edge
  apiExport: {workspace: "root:org", name: demo.ferry.dev}
admins: [spiffe://ferry.local/admin]
`,
		},
		{
			name:    "unknown field is refused",
			yaml:    "edgez: []\n",
			wantErr: []string{"edgez"},
		},
		{
			name: "all problems reported together",
			yaml: `
edges:
- identity: ""
  apiExport: {workspace: "not a path", name: "Bad_Name"}
- identity: a
  apiExport: {workspace: root, name: x}
- identity: a
  apiExport: {workspace: root, name: x}
`,
			wantErr: []string{"edges[0].identity is required", "edges[0].apiExport.workspace", "edges[0].apiExport.name", `edges[2].identity "a" is listed twice`},
		},
		{
			name: "a standby must share the active edge's name (finalizer)",
			yaml: `
edges:
- identity: spiffe://ferry.local/edge
  apiExport: {workspace: "root:org", name: demo.ferry.dev}
- identity: spiffe://ferry.local/standby
  apiExport: {workspace: "root:org", name: demo.ferry.dev}
`,
			wantErr: []string{`edges[1] serves APIExport root:org/demo.ferry.dev like edges[0], so both need the same name (finalizer), but they resolve to "edge" and "standby"`},
		},
		{
			name: "names that cannot name a finalizer",
			yaml: `
edges:
- identity: spiffe://ferry.local/edge
  name: Not_A_Label
  apiExport: {workspace: "root:org", name: demo.ferry.dev}
- identity: "spiffe://ferry.local/Under_Score"
  apiExport: {workspace: "root:other", name: demo.ferry.dev}
`,
			wantErr: []string{`edges[0].name "Not_A_Label" is not a valid DNS label`, `edges[1].name is required: no default can be derived from identity "spiffe://ferry.local/Under_Score"`},
		},
		{
			name: "valid revocations: one certificate (openssl form) and a whole identity",
			yaml: `
edges:
- identity: spiffe://ferry.local/edge
  apiExport: {workspace: "root:org", name: demo.ferry.dev}
admins: [spiffe://ferry.local/admin]
revoked:
- identity: spiffe://ferry.local/edge
  certificateSHA256: "` + strings.Repeat("AB:", 31) + `AB"
  reason: laptop stolen
- identity: spiffe://ferry.local/edge
  reason: decommissioned
`,
		},
		{
			name: "revocations: unknown identity, bad fingerprint, no reason",
			yaml: `
edges:
- identity: spiffe://ferry.local/edge
  apiExport: {workspace: "root:org", name: demo.ferry.dev}
revoked:
- identity: spiffe://ferry.local/nobody
  reason: x
- identity: spiffe://ferry.local/edge
  certificateSHA256: sha256:abc
  reason: x
- identity: spiffe://ferry.local/edge
  reason: "  "
- reason: x
`,
			wantErr: []string{
				`revoked[0].identity "spiffe://ferry.local/nobody" is not an identity of edges[]`,
				`revoked[1].certificateSHA256: certificate fingerprint "sha256:abc"`,
				"revoked[2].reason is required",
				"revoked[3].identity is required",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.yaml")
			if err := os.WriteFile(path, []byte(tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			c, err := Load(path)
			if len(tt.wantErr) == 0 {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if e, ok := c.EdgeFor("spiffe://ferry.local/edge"); !ok || e.APIExport.String() != "root:org/demo.ferry.dev" || e.Finalizer() != "ferry.dev/edge" {
					t.Errorf("EdgeFor = %+v, %v (finalizer %q)", e, ok, e.Finalizer())
				}
				if !c.IsAdmin("spiffe://ferry.local/admin") || c.IsAdmin("spiffe://ferry.local/edge") {
					t.Error("IsAdmin answers wrong")
				}
				return
			}
			if err == nil {
				t.Fatal("want an error")
			}
			for _, w := range tt.wantErr {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestExampleConfigIsValid(t *testing.T) {
	c, err := Load("../../deploy/broker/config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Edges) == 0 || len(c.Admins) == 0 {
		t.Fatalf("example configuration lost its content: %+v", c)
	}
}

// Package config loads and validates the broker's configuration file: which
// edge identity may serve which APIExport, and which identities may use the
// admin API.
package config

import (
	"errors"
	"fmt"
	"os"

	"github.com/kcp-dev/logicalcluster/v3"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"
)

// Config is the broker's configuration file (YAML).
//
//	edges:
//	- identity: spiffe://example.com/edge/nora
//	  apiExport:
//	    workspace: root:org
//	    name: databases.example.com
//	admins:
//	- spiffe://example.com/ops
type Config struct {
	// Edges lists the identities allowed to connect and the APIExport each
	// may serve. Several identities may name the same APIExport (e.g. a
	// standby cluster); only one of them is connected at a time.
	Edges []Edge `json:"edges"`
	// Admins lists identities allowed to call the AdminService.
	Admins []string `json:"admins,omitempty"`
}

// Edge authorizes one edge identity.
type Edge struct {
	// Identity is the client certificate's URI SAN, or its CN when it has
	// no URI SAN.
	Identity string `json:"identity"`
	// APIExport is the export this identity serves.
	APIExport APIExportRef `json:"apiExport"`
}

// APIExportRef names an APIExport in kcp.
type APIExportRef struct {
	// Workspace is the workspace path, e.g. "root:org".
	Workspace string `json:"workspace"`
	// Name is the APIExport's name, which is also the API group of the
	// published resources.
	Name string `json:"name"`
}

// String renders the reference as "workspace/name", the form used in logs and
// error messages.
func (r APIExportRef) String() string { return r.Workspace + "/" + r.Name }

// Load reads and validates the file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read broker configuration: %w", err)
	}
	var c Config
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return nil, fmt.Errorf("broker configuration %s is not valid YAML for this broker: %w", path, err)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("broker configuration %s is invalid: %w", path, err)
	}
	return &c, nil
}

// Validate reports every problem at once.
func (c *Config) Validate() error {
	var errs []error
	seen := map[string]bool{}
	for i, e := range c.Edges {
		field := fmt.Sprintf("edges[%d]", i)
		switch {
		case e.Identity == "":
			errs = append(errs, fmt.Errorf("%s.identity is required", field))
		case seen[e.Identity]:
			errs = append(errs, fmt.Errorf("%s.identity %q is listed twice", field, e.Identity))
		}
		seen[e.Identity] = true
		if !logicalcluster.NewPath(e.APIExport.Workspace).IsValid() {
			errs = append(errs, fmt.Errorf("%s.apiExport.workspace %q is not a workspace path like root:org", field, e.APIExport.Workspace))
		}
		if msgs := validation.IsDNS1123Subdomain(e.APIExport.Name); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("%s.apiExport.name %q is not a valid APIExport name: %v", field, e.APIExport.Name, msgs))
		}
	}
	for i, a := range c.Admins {
		if a == "" {
			errs = append(errs, fmt.Errorf("admins[%d] is empty", i))
		}
	}
	return errors.Join(errs...)
}

// EdgeFor returns the configuration of identity, or false when the identity
// may not connect.
func (c *Config) EdgeFor(identity string) (Edge, bool) {
	for _, e := range c.Edges {
		if e.Identity == identity {
			return e, true
		}
	}
	return Edge{}, false
}

// IsAdmin tells whether identity may call the AdminService.
func (c *Config) IsAdmin(identity string) bool {
	for _, a := range c.Admins {
		if a == identity {
			return true
		}
	}
	return false
}

// Package config loads and validates the broker's configuration file: which
// edge identity may serve which APIExport, and which identities may use the
// admin API.
package config

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/kcp-dev/logicalcluster/v3"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"sigs.k8s.io/yaml"

	"github.com/ferry-dev/ferry/pkg/tlsconfig"
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
//	revoked:
//	- identity: spiffe://example.com/edge/nora
//	  certificateSHA256: sha256:3f…
//	  reason: laptop stolen, ticket OPS-1234
type Config struct {
	// Edges lists the identities allowed to connect and the APIExport each
	// may serve. Several identities may name the same APIExport (e.g. a
	// standby cluster); only one of them is connected at a time.
	Edges []Edge `json:"edges"`
	// Admins lists identities allowed to call the AdminService.
	Admins []string `json:"admins,omitempty"`
	// Revoked blocks certificates or whole identities: their streams are
	// refused with the reason. Blocks made through AdminService.Revoke are
	// kept in kcp instead; both apply.
	Revoked []Revocation `json:"revoked,omitempty"`
}

// Revocation blocks one certificate of an edge identity, or the identity.
type Revocation struct {
	// Identity is a configured edge identity.
	Identity string `json:"identity"`
	// CertificateSHA256 is the SHA-256 fingerprint of the blocked
	// certificate ("sha256:<hex>", bare hex, or openssl's AB:CD:… form).
	// Optional: empty blocks every certificate of the identity.
	CertificateSHA256 string `json:"certificateSHA256,omitempty"`
	// Reason is shown to the refused edge and in the broker's logs.
	Reason string `json:"reason"`
}

// Edge authorizes one edge identity.
type Edge struct {
	// Identity is the client certificate's URI SAN, or its CN when it has
	// no URI SAN.
	Identity string `json:"identity"`
	// APIExport is the export this identity serves.
	APIExport APIExportRef `json:"apiExport"`
	// Name is the edge's name at this broker: the broker's finalizer on every
	// kcp object it syncs for this edge is "ferry.dev/<name>". It is bound to
	// the configuration, not to the agent name an edge announces, so an edge
	// renamed on its side strands nothing. Entries serving the same APIExport
	// (a standby) must resolve to the same name: the standby takes over the
	// objects the active edge finalized. Optional: defaults to the last path
	// segment of the identity (or the identity itself), lowercased, when that
	// is a valid DNS label. Changing it later leaves the old finalizer on
	// existing objects (release it with ferry-broker release-finalizers).
	Name string `json:"name,omitempty"`
	// RelatedResources lists the resources ("secrets", "configmaps",
	// "widgets.example.com": resource.group, core resources without a
	// group) this edge's PublishedResources may name in spec.related[]: the
	// broker claims them in the consumers' workspaces (permission claims)
	// and reads or writes them there. An entry is checked under its kcp
	// side: its projection for origin service, the resource it names for
	// origin kcp. A PublishedResource naming anything
	// else is refused by the broker (BrokerRefused). Optional: default
	// secrets and configmaps. Cluster-scoped kinds are always refused.
	RelatedResources []string `json:"relatedResources,omitempty"`
}

// DefaultRelatedResources are the resources an edge may relate when its
// entry lists none.
var DefaultRelatedResources = []string{"secrets", "configmaps"}

// AllowsRelated tells whether the edge's PublishedResources may name
// resource gr in spec.related[].
func (e Edge) AllowsRelated(gr schema.GroupResource) bool {
	allowed := e.RelatedResources
	if len(allowed) == 0 {
		allowed = DefaultRelatedResources
	}
	return slices.Contains(allowed, gr.String())
}

// FinalizerPrefix prefixes the broker's finalizer names.
const FinalizerPrefix = "ferry.dev/"

// ResolvedName is the entry's name, or the default derived from its
// identity ("" when none can be derived).
func (e Edge) ResolvedName() string {
	if e.Name != "" {
		return e.Name
	}
	id := strings.TrimRight(e.Identity, "/")
	if i := strings.LastIndexAny(id, "/:"); i >= 0 {
		id = id[i+1:]
	}
	id = strings.ToLower(id)
	if len(validation.IsDNS1123Label(id)) > 0 {
		return ""
	}
	return id
}

// Finalizer is the finalizer the broker puts on the kcp objects it syncs
// for this edge.
func (e Edge) Finalizer() string { return FinalizerPrefix + e.ResolvedName() }

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
	names := map[APIExportRef]int{} // first entry per export
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
		name := e.ResolvedName()
		switch {
		case e.Name != "" && len(validation.IsDNS1123Label(e.Name)) > 0:
			errs = append(errs, fmt.Errorf("%s.name %q is not a valid DNS label (it names the finalizer %s<name>)", field, e.Name, FinalizerPrefix))
			continue
		case name == "" && e.Identity != "":
			errs = append(errs, fmt.Errorf("%s.name is required: no default can be derived from identity %q (the finalizer is %s<name>)", field, e.Identity, FinalizerPrefix))
			continue
		}
		for j, r := range e.RelatedResources {
			if gr := schema.ParseGroupResource(r); gr.Resource == "" || len(validation.IsDNS1123Subdomain(gr.Resource)) > 0 {
				errs = append(errs, fmt.Errorf("%s.relatedResources[%d] %q is not a resource (want e.g. secrets or widgets.example.com)", field, j, r))
			}
		}
		if first, ok := names[e.APIExport]; ok {
			if other := c.Edges[first].ResolvedName(); other != name {
				errs = append(errs, fmt.Errorf("%s serves APIExport %s like edges[%d], so both need the same name (finalizer), but they resolve to %q and %q: set name on both",
					field, e.APIExport, first, other, name))
			}
			if !slices.Equal(c.Edges[first].RelatedResources, e.RelatedResources) {
				errs = append(errs, fmt.Errorf("%s serves APIExport %s like edges[%d], so both need the same relatedResources", field, e.APIExport, first))
			}
		} else {
			names[e.APIExport] = i
		}
	}
	for i, a := range c.Admins {
		if a == "" {
			errs = append(errs, fmt.Errorf("admins[%d] is empty", i))
		}
	}
	for i, r := range c.Revoked {
		errs = append(errs, r.validate(fmt.Sprintf("revoked[%d]", i), seen)...)
	}
	return errors.Join(errs...)
}

// validate checks one revocation; configured holds the edge identities.
func (r Revocation) validate(field string, configured map[string]bool) []error {
	var errs []error
	switch {
	case r.Identity == "":
		errs = append(errs, fmt.Errorf("%s.identity is required", field))
	case !configured[r.Identity]:
		errs = append(errs, fmt.Errorf("%s.identity %q is not an identity of edges[]", field, r.Identity))
	}
	if r.CertificateSHA256 != "" {
		if _, err := tlsconfig.ParseFingerprint(r.CertificateSHA256); err != nil {
			errs = append(errs, fmt.Errorf("%s.certificateSHA256: %w", field, err))
		}
	}
	if strings.TrimSpace(r.Reason) == "" {
		errs = append(errs, fmt.Errorf("%s.reason is required: it is shown to the refused edge", field))
	}
	return errs
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

// ExportEntry returns the first entry serving export (entries serving the
// same export agree on name and relatedResources).
func (c *Config) ExportEntry(export APIExportRef) (Edge, bool) {
	for _, e := range c.Edges {
		if e.APIExport == export {
			return e, true
		}
	}
	return Edge{}, false
}

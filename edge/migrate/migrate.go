// Package migrate converts the PublishedResources of ferry's ancestors —
// kcp-dev/api-syncagent (syncagent.kcp.io/v1alpha1) and the KDP servlet
// (services.kdp.k8c.io/v1alpha1) — into ferry's (ferry.dev/v1alpha1), and
// lists every field it changed, dropped or could not carry over.
//
// ferry accepts the ancestors' spellings as written (namespace names in
// filters, origin "platform", \1 in replacements, their template data), so a
// conversion mostly changes the apiVersion. What ferry cannot honour is
// dropped from the output and reported as lossy, so that the output applies
// cleanly and nothing is lost silently: the report says what to write
// instead. Which fields ferry has is read from its own CRD schema, so a field
// this package knows nothing about is never carried into a document the API
// server would prune.
package migrate

import (
	"fmt"
	"sort"
	"strings"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/objects"
)

// Source API versions of PublishedResources ferry migrates from.
const (
	APISyncAgent = "syncagent.kcp.io/v1alpha1"
	Servlet      = "services.kdp.k8c.io/v1alpha1"
)

// Kind of a change made to a document.
type Kind string

// Change kinds.
const (
	// Changed: the field was rewritten to ferry's spelling; nothing lost.
	Changed Kind = "changed"
	// Removed: a field the API server sets (uid, status, …); nothing lost.
	Removed Kind = "removed"
	// Lossy: ferry cannot honour the field; it was dropped and must be
	// rewritten by hand (Message says how).
	Lossy Kind = "lossy"
)

// Change is one difference between the input and the output document.
type Change struct {
	Path    string
	Kind    Kind
	Message string
}

func (c Change) String() string {
	return fmt.Sprintf("%-7s %s: %s", c.Kind, c.Path, c.Message)
}

// Result is one converted PublishedResource.
type Result struct {
	// Name of the PublishedResource.
	Name string
	// From is the input's apiVersion.
	From string
	// Object is ferry's PublishedResource.
	Object map[string]any
	// Changes lists every difference, in document order.
	Changes []Change
}

// Lossy tells whether anything could not be carried over.
func (r Result) Lossy() bool {
	for _, c := range r.Changes {
		if c.Kind == Lossy {
			return true
		}
	}
	return false
}

// Converter converts documents against ferry's PublishedResource schema.
type Converter struct {
	schema *apiextensionsv1.JSONSchemaProps
	adopt  *Adoption
}

// Adoption makes the converted api-syncagent PublishedResources take over
// the copies that api-syncagent made, in place (spec.adopt).
type Adoption struct {
	// AgentName is api-syncagent's --agent-name (its copies' label).
	AgentName string
	// StateNamespace is where api-syncagent keeps its last-known-state
	// Secrets ("": they are left for the service owner).
	StateNamespace string
}

// Adopt makes every api-syncagent PublishedResource converted from now on
// adopt api-syncagent's copies as a describes.
func (c *Converter) Adopt(a Adoption) { c.adopt = &a }

// NewConverter reads ferry's PublishedResource schema from its CRD
// manifest.
func NewConverter(crd *apiextensionsv1.CustomResourceDefinition) (*Converter, error) {
	for _, v := range crd.Spec.Versions {
		if v.Name == ferryv1alpha1.GroupVersion.Version && v.Schema != nil && v.Schema.OpenAPIV3Schema != nil {
			return &Converter{schema: v.Schema.OpenAPIV3Schema}, nil
		}
	}
	return nil, fmt.Errorf("CRD %s has no schema for version %s", crd.Name, ferryv1alpha1.GroupVersion.Version)
}

// Convert converts one document. It refuses anything that is not a
// PublishedResource of api-syncagent, the servlet or ferry.
func (c *Converter) Convert(doc map[string]any) (Result, error) {
	apiVersion, _ := doc["apiVersion"].(string)
	kind, _ := doc["kind"].(string)
	meta, _ := doc["metadata"].(map[string]any)
	name, _ := meta["name"].(string)
	if kind != "PublishedResource" {
		return Result{}, fmt.Errorf("%s %q is not a PublishedResource", orUnset(kind), name)
	}
	switch apiVersion {
	case APISyncAgent, Servlet, ferryv1alpha1.GroupVersion.String():
	default:
		return Result{}, fmt.Errorf("PublishedResource %q has apiVersion %s; ferry migrates %s and %s", name, orUnset(apiVersion), APISyncAgent, Servlet)
	}
	r := Result{Name: name, From: apiVersion}
	out := map[string]any{
		"apiVersion": ferryv1alpha1.GroupVersion.String(),
		"kind":       kind,
	}
	if apiVersion != ferryv1alpha1.GroupVersion.String() {
		r.Changes = append(r.Changes, Change{Path: "apiVersion", Kind: Changed, Message: apiVersion + " → " + ferryv1alpha1.GroupVersion.String()})
	}
	out["metadata"] = r.metadata(meta)
	if _, ok := doc["status"]; ok {
		r.Changes = append(r.Changes, Change{Path: "status", Kind: Removed, Message: "set by the edge"})
	}
	for _, k := range sortedKeys(doc) {
		switch k {
		case "apiVersion", "kind", "metadata", "status":
			continue
		}
		if k != "spec" {
			r.Changes = append(r.Changes, Change{Path: k, Kind: Lossy, Message: "not a field of a PublishedResource; dropped"})
			continue
		}
		spec, ok := doc["spec"].(map[string]any)
		if !ok {
			return Result{}, fmt.Errorf("PublishedResource %q: spec is not an object", name)
		}
		out["spec"] = r.spec(spec, c.schema.Properties["spec"])
		if c.adopt != nil && apiVersion == APISyncAgent {
			r.adoption(out["spec"].(map[string]any), *c.adopt)
		}
	}
	r.Object = out
	return r, nil
}

// metadata keeps what the author wrote (name, labels, annotations) and drops
// what the API server set.
func (r *Result) metadata(meta map[string]any) map[string]any {
	out := map[string]any{}
	for _, k := range sortedKeys(meta) {
		switch k {
		case "name", "labels":
			out[k] = meta[k]
		case "annotations":
			ann, _ := meta[k].(map[string]any)
			kept := map[string]any{}
			for ak, av := range ann {
				if ak == "kubectl.kubernetes.io/last-applied-configuration" {
					r.Changes = append(r.Changes, Change{Path: "metadata.annotations." + ak, Kind: Removed, Message: "kubectl's record of the old object"})
					continue
				}
				kept[ak] = av
			}
			if len(kept) > 0 {
				out[k] = kept
			}
		case "namespace":
			r.Changes = append(r.Changes, Change{Path: "metadata.namespace", Kind: Removed, Message: "PublishedResources are cluster-scoped"})
		default:
			r.Changes = append(r.Changes, Change{Path: "metadata." + k, Kind: Removed, Message: "set by the API server"})
		}
	}
	return out
}

// spec applies the rules for what ferry cannot honour, then drops every
// field ferry's schema does not have.
func (r *Result) spec(spec map[string]any, schema apiextensionsv1.JSONSchemaProps) map[string]any {
	spec = objects.DeepCopyValue(spec).(map[string]any)
	if p, ok := spec["projection"].(map[string]any); ok {
		for _, k := range []string{"group", "apiGroup"} {
			if _, set := p[k]; set {
				delete(p, k)
				r.Changes = append(r.Changes, Change{Path: "spec.projection." + k, Kind: Lossy,
					Message: "ferry serves every published resource in the API group of the edge's APIExport (its name); the group is chosen by the broker's configuration, not per resource"})
			}
		}
	}
	r.mutations("spec.mutation", spec["mutation"])
	if rel, ok := spec["related"].([]any); ok {
		for i, e := range rel {
			if m, ok := e.(map[string]any); ok {
				r.related(fmt.Sprintf("spec.related[%d]", i), m)
			}
		}
	}
	r.prune("spec", spec, &schema)
	return spec
}

// related carries a related entry over: identityHash and projection as
// written (ferry honours them as api-syncagent does), its mutation like the
// primary's (Rudi steps dropped), status steps only with syncStatus.
func (r *Result) related(path string, entry map[string]any) {
	m, ok := entry["mutation"].(map[string]any)
	if !ok {
		return
	}
	r.mutations(path+".mutation", m)
	if sync, _ := entry["syncStatus"].(bool); !sync {
		if _, set := m["status"]; set {
			// api-syncagent runs them on the status a kcp-origin object's
			// copy gets on the service cluster, which ferry does not carry.
			delete(m, "status")
			r.Changes = append(r.Changes, Change{Path: path + ".mutation.status", Kind: Lossy,
				Message: "ferry carries a related object's status only with syncStatus (origin service, from the service cluster into kcp), and runs status steps on that; the status of a kcp-origin object's copy is not synced back"})
		}
	}
	if len(m) == 0 {
		delete(entry, "mutation")
	}
}

// adoption sets spec.adopt, and lets the copies stay in the namespaces
// api-syncagent made (which are not ferry's).
func (r *Result) adoption(spec map[string]any, a Adoption) {
	adopt := map[string]any{"from": string(ferryv1alpha1.AdoptFromAPISyncAgent), "agentName": a.AgentName}
	if a.StateNamespace != "" {
		adopt["stateNamespace"] = a.StateNamespace
	}
	spec["adopt"] = adopt
	r.Changes = append(r.Changes, Change{Path: "spec.adopt", Kind: Changed,
		Message: fmt.Sprintf("added: take over api-syncagent's copies (agent %q) in place", a.AgentName)})
	n, _ := spec["naming"].(map[string]any)
	if n == nil {
		n = map[string]any{}
		spec["naming"] = n
	}
	if v, _ := n["allowExistingNamespaces"].(bool); !v {
		n["allowExistingNamespaces"] = true
		r.Changes = append(r.Changes, Change{Path: "spec.naming.allowExistingNamespaces", Kind: Changed,
			Message: "added: the copies stay in the namespaces api-syncagent created, which are not ferry's"})
	}
}

// mutations drops Rudi steps, which ferry has no interpreter for.
func (r *Result) mutations(path string, v any) {
	m, ok := v.(map[string]any)
	if !ok {
		return
	}
	for _, dir := range []string{"spec", "status"} {
		steps, ok := m[dir].([]any)
		if !ok {
			continue
		}
		kept := steps[:0]
		for i, s := range steps {
			step, _ := s.(map[string]any)
			if _, rudi := step["rudi"]; rudi {
				r.Changes = append(r.Changes, Change{Path: fmt.Sprintf("%s.%s[%d].rudi", path, dir, i), Kind: Lossy,
					Message: "ferry has no Rudi interpreter; write this step as a cel mutation ({cel: {path: ..., expression: ...}})"})
				continue
			}
			kept = append(kept, s)
		}
		if len(kept) == 0 {
			delete(m, dir)
		} else {
			m[dir] = kept
		}
	}
}

// prune removes, in place, every field the schema does not know, recording
// each as lossy. Schemaless nodes (preserve-unknown-fields, or no type) keep
// everything below them.
func (r *Result) prune(path string, v any, s *apiextensionsv1.JSONSchemaProps) {
	if s == nil || (s.XPreserveUnknownFields != nil && *s.XPreserveUnknownFields) {
		return
	}
	switch val := v.(type) {
	case map[string]any:
		if len(s.Properties) == 0 {
			if s.AdditionalProperties != nil && s.AdditionalProperties.Schema != nil {
				for _, k := range sortedKeys(val) {
					r.prune(path+"."+k, val[k], s.AdditionalProperties.Schema)
				}
			}
			return
		}
		for _, k := range sortedKeys(val) {
			ps, ok := s.Properties[k]
			if !ok {
				delete(val, k)
				r.Changes = append(r.Changes, Change{Path: path + "." + k, Kind: Lossy, Message: "ferry has no such field; dropped"})
				continue
			}
			r.prune(path+"."+k, val[k], &ps)
		}
	case []any:
		if s.Items == nil || s.Items.Schema == nil {
			return
		}
		for i, e := range val {
			r.prune(fmt.Sprintf("%s[%d]", path, i), e, s.Items.Schema)
		}
	}
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

func orUnset(s string) string {
	if strings.TrimSpace(s) == "" {
		return "(unset)"
	}
	return s
}

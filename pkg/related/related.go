// Package related locates the related objects of a primary object: the
// spec.related[] entries of a PublishedResource compiled once, then
// evaluated on the primary object on either side — the kcp object gives the
// kcp-side name and namespace, the local copy the service-cluster side. Both
// the broker and the edge use it, so both sides agree on the rules.
//
// Both spellings of an entry compile to the same Reference: ferry's
// kind + reference.{name,namespace} and api-syncagent's resource +
// object.{reference|template} with object.namespace.
package related

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/fieldpath"
	"github.com/ferry-dev/ferry/pkg/replacement"
	"github.com/ferry-dev/ferry/pkg/templating"
)

// Reference is one compiled related[] entry.
type Reference struct {
	// Identifier is the entry's effective identifier (set, or derived from
	// its kind): the key every engine uses for the entry.
	Identifier string
	// Origin is the side that owns the object: OriginService or OriginKCP,
	// never the alias OriginPlatform.
	Origin ferryv1alpha1.RelatedResourceOrigin
	// Kind is the related object's group/version/kind in kcp (version
	// defaults to v1): what the broker writes there. Kind.Kind is empty
	// when the entry names a resource only and the kind was not resolved
	// yet (ResolveKind).
	Kind schema.GroupVersionKind
	// Resource is the related kind's resource in kcp — what the broker
	// claims, watches and writes. It is the entry's resource when it names
	// one, else the conventional plural of Kind; with a projection it is
	// the projected resource for origin service (Sides).
	Resource schema.GroupVersionResource
	// Service is the related kind's resource on the service cluster as the
	// entry names it (the projected one for origin kcp); for an entry that
	// names a kind, the edge resolves the exact resource through the
	// service cluster's discovery.
	Service schema.GroupVersionResource
	// ServiceKind is the related kind on the service cluster: the entry's
	// kind, or what the edge resolved (ResolveServiceKind, ResolveKind).
	ServiceKind string
	// Projected tells that the entry has a projection: the kind may differ
	// between the sides, and each side resolves its own.
	Projected bool
	// ByResource tells that the entry named the resource (api-syncagent's
	// spelling) rather than the kind.
	ByResource bool
	// Cleanup tells whether the copies go with the primary (spec cleanup,
	// default true); false releases them instead.
	Cleanup bool
	// SyncStatus tells whether the object's status is carried to the copy
	// (origin service only).
	SyncStatus bool
	// IdentityHash is the identity of the APIExport that provides the
	// related kind in kcp (empty for kinds kcp serves in every workspace);
	// the broker's permission claim carries it.
	IdentityHash string

	name      locator
	namespace *locator
	// mutation rewrites the object on its way to the destination
	// (mutation.go); nil when the entry has none.
	mutation *mutations
	// selector, when set, finds the objects by labels instead of name
	// (object.selector; origin service only).
	selector *selector
	// watch, when set, is watch.labelSelector: only objects it matches are
	// cached by the edge and found (watch.go; origin service only).
	watch labels.Selector
}

// Env is what a related entry is evaluated with besides the primary
// object: the side the primary is on and its kcp workspace (templates see
// them as .Side, .ClusterName and .ClusterPath).
type Env struct {
	// Side is OriginKCP for the kcp object, OriginService for its local
	// copy.
	Side ferryv1alpha1.RelatedResourceOrigin
	// ClusterName is the kcp workspace's logical cluster name.
	ClusterName string
	// ClusterPath is the workspace path; set only with
	// spec.enableWorkspacePaths (UsesClusterPath).
	ClusterPath string
}

// locator evaluates a ResourceLocator, an object reference or a template.
type locator struct {
	field string // e.g. "reference.name" or "object.template", for errors
	path  fieldpath.Path
	// static is set for an empty pattern with a replacement: the value is
	// the replacement whatever the path holds.
	static      bool
	re          *regexp.Regexp
	replacement string
	// tmpl, when set, computes the value instead of path.
	tmpl     *templating.Template
	tmplText string
	// items, when set, is a path with a "#" (list.go): the locator yields
	// one value per item, and path is unset.
	items *fieldpath.ListPath
}

// Compile checks and compiles specs; the error names the entry and field at
// fault.
func Compile(specs []ferryv1alpha1.RelatedResourceSpec) ([]*Reference, error) {
	out := make([]*Reference, 0, len(specs))
	seen := map[string]int{} // effective identifier → index
	for i := range specs {
		s := &specs[i]
		id := s.EffectiveIdentifier()
		where := fmt.Sprintf("spec.related[%d]", i)
		if id != "" {
			where = fmt.Sprintf("spec.related[%s]", id)
		}
		ref, err := compileOne(s)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", where, err)
		}
		if j, dup := seen[id]; dup {
			return nil, fmt.Errorf("spec.related[%d] (%s) and spec.related[%d] (%s) both have the identifier %q: set identifier on them so that each is different",
				j, describeEntry(&specs[j]), i, describeEntry(s), id)
		}
		seen[id] = i
		out = append(out, ref)
	}
	return out, nil
}

// describeEntry names an entry for a refusal: its kind, and whether its
// identifier is set or the default.
func describeEntry(s *ferryv1alpha1.RelatedResourceSpec) string {
	what := "kind " + s.Kind
	if s.Resource != "" {
		what = "resource " + s.Resource
	}
	if s.Identifier != "" {
		return what + ", identifier set"
	}
	return what + ", identifier by default"
}

func compileOne(s *ferryv1alpha1.RelatedResourceSpec) (*Reference, error) {
	id := s.EffectiveIdentifier()
	if errs := validation.IsDNS1123Label(id); len(errs) > 0 {
		return nil, fmt.Errorf("identifier %q: %s", id, strings.Join(errs, "; "))
	}
	// The compiled entry carries the normalized origin, so everything that
	// compares Reference.Origin sees kcp for the seeds' "platform".
	origin := s.Origin.Normalized()
	if origin != ferryv1alpha1.OriginService && origin != ferryv1alpha1.OriginKCP {
		return nil, fmt.Errorf("origin %q: must be %q or %q", s.Origin, ferryv1alpha1.OriginService, ferryv1alpha1.OriginKCP)
	}
	if err := checkIdentityHash(s.Group, s.IdentityHash); err != nil {
		return nil, err
	}
	// Kind, Resource and Service are set below (Sides: version defaults
	// to v1).
	ref := &Reference{Identifier: id, Origin: origin, Cleanup: s.Cleanup == nil || *s.Cleanup, SyncStatus: s.SyncStatus, IdentityHash: s.IdentityHash}
	if s.SyncStatus && origin != ferryv1alpha1.OriginService {
		return nil, errors.New("syncStatus: only a service-origin related object's status is carried into kcp; set origin: service or drop syncStatus")
	}
	if s.Watch != nil {
		w, err := compileWatch(s.Watch, origin)
		if err != nil {
			return nil, err
		}
		ref.watch = w
	}
	switch {
	case s.Resource != "":
		// The edge sends the broker the kind it resolved beside the
		// resource (ResolveKind), so both may be set here; admission
		// refuses a document that sets both.
		if errs := validation.IsDNS1123Label(s.Resource); len(errs) > 0 {
			return nil, fmt.Errorf("resource %q: the lowercase plural, e.g. secrets: %s", s.Resource, strings.Join(errs, "; "))
		}
		ref.ByResource = true
	case s.Kind != "":
	default:
		return nil, errors.New("set kind (e.g. Secret) or resource (e.g. secrets)")
	}
	if s.Projection != nil {
		if err := checkProjection(s); err != nil {
			return nil, err
		}
	}
	kcp, service := KCPResource(s), ServiceResource(s)
	ref.Resource, ref.Service = kcp, service
	ref.Kind = kcp.GroupVersion().WithKind("")
	if s.Projection == nil {
		// Both sides serve the same resource: the kind named (or resolved
		// by the edge and sent along) is the kind on both.
		ref.Kind.Kind, ref.ServiceKind = s.Kind, s.Kind
	} else {
		// Each side resolves its kind from its resource: the edge through
		// the service cluster's discovery, the broker in kcp.
		ref.Projected = true
	}
	switch {
	case s.Reference != nil && s.Object != nil:
		return nil, errors.New("set reference or object, not both")
	case s.Reference != nil:
		name, err := compileNameLocator("reference.name", s.Reference.Name, origin)
		if err != nil {
			return nil, err
		}
		ref.name = name
		if s.Reference.Namespace != nil {
			ns, err := compileLocator("reference.namespace", *s.Reference.Namespace)
			if err != nil {
				return nil, err
			}
			ref.namespace = &ns
		}
	case s.Object != nil:
		name, err := compileObject("object", s.Object.RelatedResourceObjectSpec, origin)
		switch {
		case errors.Is(err, errSelector):
			if origin != ferryv1alpha1.OriginService {
				return nil, errors.New("object.selector: a label selector finds objects on the service cluster (origin service); for origin kcp locate the object by reference or template")
			}
			if ref.selector, err = compileSelector("object.selector", s.Object.Selector); err != nil {
				return nil, err
			}
		case err != nil:
			return nil, err
		}
		ref.name = name
		if s.Object.Namespace != nil {
			ns, err := compileObject("object.namespace", *s.Object.Namespace, origin)
			if errors.Is(err, errSelector) {
				return nil, errors.New("object.namespace.selector: namespaces cannot be selected by labels; locate the namespace by reference or template (default: the primary's namespace)")
			}
			if err != nil {
				return nil, err
			}
			ref.namespace = &ns
		}
	default:
		return nil, errors.New("set reference or object to say where the related object is")
	}
	mut, err := compileMutation(s.Mutation, s.SyncStatus)
	if err != nil {
		return nil, err
	}
	ref.mutation = mut
	return ref, nil
}

// compileObject compiles one level of api-syncagent's object spelling.
func compileObject(field string, o ferryv1alpha1.RelatedResourceObjectSpec, origin ferryv1alpha1.RelatedResourceOrigin) (locator, error) {
	n := 0
	for _, set := range []bool{o.Reference != nil, o.Template != nil, o.Selector != nil} {
		if set {
			n++
		}
	}
	if n != 1 {
		return locator{}, fmt.Errorf("%s: set exactly one of reference, template and selector", field)
	}
	switch {
	case o.Reference != nil:
		l := ferryv1alpha1.ResourceLocator{Path: o.Reference.Path, Regex: o.Reference.Regex}
		if field == "object" {
			return compileNameLocator(field+".reference", l, origin)
		}
		return compileLocator(field+".reference", l)
	case o.Template != nil:
		t, err := templating.Parse(field+".template", o.Template.Template)
		if err != nil {
			return locator{}, err
		}
		return locator{field: field + ".template", tmpl: t, tmplText: o.Template.Template}, nil
	default:
		return locator{}, errSelector
	}
}

// errSelector marks a selector where compileObject found one: the caller
// compiles it (only object names may be selected by labels).
var errSelector = errors.New("selector")

func compileLocator(field string, l ferryv1alpha1.ResourceLocator) (locator, error) {
	lp, err := fieldpath.ParseList(l.Path)
	if err != nil {
		return locator{}, fmt.Errorf("%s.path: %w", field, err)
	}
	if lp.IsList() {
		return locator{}, fmt.Errorf("%s.path %q lists several values (%q), but a namespace is one: every object of the entry lives in the namespace it names; "+
			"point at one value, e.g. spec.namespace, or leave the namespace out for the primary's", field, l.Path, fieldpath.ListMarker)
	}
	return withRegex(locator{field: field, path: lp.Each}, l.Regex)
}

// withRegex adds the regex of a locator (none when nil) to loc.
func withRegex(loc locator, regex *ferryv1alpha1.RegexReplacement) (locator, error) {
	field := loc.field
	l := ferryv1alpha1.ResourceLocator{Regex: regex}
	var err error
	if l.Regex == nil {
		return loc, nil
	}
	loc.replacement = l.Regex.Replacement
	if l.Regex.Pattern == "" {
		// A static value is not a regex replacement: it is used as written.
		if l.Regex.Replacement == "" {
			return locator{}, fmt.Errorf("%s.regex: an empty pattern needs a replacement (the static value)", field)
		}
		loc.static = true
		return loc, nil
	}
	if loc.re, err = regexp.Compile(l.Regex.Pattern); err != nil {
		return locator{}, fmt.Errorf("%s.regex.pattern: %w", field, err)
	}
	loc.replacement = replacement.Expand(l.Regex.Replacement)
	return loc, nil
}

// HasNamespace tells whether the entry names the namespace itself (instead
// of using the primary's).
func (r *Reference) HasNamespace() bool { return r.namespace != nil }

// StaticNamespace returns the namespace the entry names statically (an
// empty pattern with a replacement): a place the service owner chose, the
// same for every primary.
func (r *Reference) StaticNamespace() (string, bool) {
	if r.namespace == nil || !r.namespace.static {
		return "", false
	}
	return r.namespace.replacement, true
}

// NamespaceFromPrimaryNamespace tells whether the entry derives the
// related object's namespace from the primary's own namespace (a reference
// to metadata.namespace, optionally rewritten by a regex): on the service
// cluster that is a namespace ferry's naming rules chose, not a value the
// consumer wrote.
func (r *Reference) NamespaceFromPrimaryNamespace() bool {
	n := r.namespace
	return n != nil && n.tmpl == nil && !n.static && n.path.String() == "metadata.namespace"
}

// UsesClusterPath tells whether a template of the entry reads
// .ClusterPath, which is known only with spec.enableWorkspacePaths.
func (r *Reference) UsesClusterPath() bool {
	return strings.Contains(r.name.tmplText, ".ClusterPath") || r.namespace != nil && strings.Contains(r.namespace.tmplText, ".ClusterPath") ||
		r.selector != nil && r.selector.usesClusterPath
}

// ResolveKind records the kind the entry's resource is served as in kcp;
// without a projection the service cluster serves the same kind (the edge
// finds it through its discovery), so it is recorded for both sides.
func (r *Reference) ResolveKind(kind string) {
	r.Kind.Kind = kind
	if !r.Projected {
		r.ServiceKind = kind
	}
}

// ResolveServiceKind records the kind the service cluster serves the
// entry's service-side resource as (the edge finds it through discovery).
// Without a projection it is the kind in kcp too.
func (r *Reference) ResolveServiceKind(kind string) {
	r.ServiceKind = kind
	if !r.Projected {
		r.Kind.Kind = kind
	}
}

// IsSelector tells whether the entry finds its objects by labels
// (FindSelector, Rewrite) rather than by name (Locate).
func (r *Reference) IsSelector() bool { return r.selector != nil }

// Locate evaluates the entry on primary (a whole object, as JSON-like map)
// on the side env says: the related object's namespace and name on that
// side. The namespace defaults to the primary's.
func (r *Reference) Locate(primary map[string]any, env Env) (namespace, name string, err error) {
	if r.selector != nil {
		return "", "", fmt.Errorf("related %q selects its objects by labels: they have no name to locate", r.Identifier)
	}
	if r.name.items != nil {
		return "", "", fmt.Errorf("related %q lists several objects: locate them with LocateList", r.Identifier)
	}
	if name, err = r.name.eval(primary, env); err != nil {
		return "", "", fmt.Errorf("related %q: %w", r.Identifier, err)
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", "", fmt.Errorf("related %q: %s gives %q, which is not a valid name: %s", r.Identifier, r.name.describe(), name, strings.Join(errs, "; "))
	}
	namespace, err = r.LocateNamespace(primary, env)
	return namespace, name, err
}

// LocateNamespace evaluates the entry's namespace on primary on the side
// env says; it defaults to the primary's.
func (r *Reference) LocateNamespace(primary map[string]any, env Env) (namespace string, err error) {
	if r.namespace == nil {
		namespace, _ = fieldpath.Path{"metadata", "namespace"}.GetString(primary)
		if namespace == "" {
			return "", fmt.Errorf("related %q: the primary object has no namespace; set reference.namespace", r.Identifier)
		}
		return namespace, nil
	}
	if namespace, err = r.namespace.eval(primary, env); err != nil {
		return "", fmt.Errorf("related %q: %w", r.Identifier, err)
	}
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return "", fmt.Errorf("related %q: %s gives %q, which is not a valid namespace: %s", r.Identifier, r.namespace.describe(), namespace, strings.Join(errs, "; "))
	}
	return namespace, nil
}

func (l locator) eval(obj map[string]any, env Env) (string, error) {
	if l.static {
		return l.replacement, nil
	}
	if l.tmpl != nil {
		v, err := l.tmpl.Execute(templating.Data{
			Object: obj, Side: string(env.Side), ClusterName: env.ClusterName, ClusterPath: env.ClusterPath, WorkspacePath: env.ClusterPath,
		})
		if err != nil {
			return "", fmt.Errorf("%s: %w", l.field, err)
		}
		if v == "" {
			return "", fmt.Errorf("%s gives an empty name", l.field)
		}
		return v, nil
	}
	v, err := l.path.GetString(obj)
	if err != nil {
		return "", fmt.Errorf("%s: %w", l.field, err)
	}
	if l.re != nil {
		v = l.re.ReplaceAllString(v, l.replacement)
	}
	if v == "" {
		return "", fmt.Errorf("%s: %s is empty", l.field, l.describe())
	}
	return v, nil
}

func (l locator) describe() string {
	if l.tmpl != nil {
		return l.field
	}
	path := l.path.String()
	if l.items != nil {
		path = l.items.String()
	}
	if l.re != nil {
		return fmt.Sprintf("%s (path %s rewritten by %q)", l.field, path, l.re.String())
	}
	return fmt.Sprintf("%s (path %s)", l.field, path)
}

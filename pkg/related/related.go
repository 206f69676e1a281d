// Package related locates the related objects of a primary object: the
// spec.related[] entries of a PublishedResource compiled once, then
// evaluated on the primary object on either side — the kcp object gives the
// kcp-side name and namespace, the local copy the service-cluster side. Both
// the broker and the edge use it, so both sides agree on the rules.
package related

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/fieldpath"
	"github.com/ferry-dev/ferry/pkg/replacement"
)

// Reference is one compiled related[] entry.
type Reference struct {
	// Identifier is the entry's effective identifier (set, or derived from
	// its kind): the key every engine uses for the entry.
	Identifier string
	// Origin is the side that owns the object: OriginService or OriginKCP,
	// never the alias OriginPlatform.
	Origin ferryv1alpha1.RelatedResourceOrigin
	// Kind is the related object's group/version/kind (version defaults to v1).
	Kind schema.GroupVersionKind
	// Resource is the conventional plural resource of Kind — what the broker
	// claims in kcp. The edge resolves the service cluster's own resource
	// through discovery.
	Resource schema.GroupVersionResource

	name      locator
	namespace *locator
}

// locator evaluates a ResourceLocator.
type locator struct {
	field string // "reference.name" or "reference.namespace", for errors
	path  fieldpath.Path
	// static is set for an empty pattern with a replacement: the value is
	// the replacement whatever the path holds.
	static      bool
	re          *regexp.Regexp
	replacement string
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
	if s.Identifier != "" {
		return "kind " + s.Kind + ", identifier set"
	}
	return "kind " + s.Kind + ", identifier by default"
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
	if s.Kind == "" {
		return nil, errors.New("kind is required")
	}
	version := s.Version
	if version == "" {
		version = "v1"
	}
	gvk := schema.GroupVersionKind{Group: s.Group, Version: version, Kind: s.Kind}
	plural, _ := meta.UnsafeGuessKindToResource(gvk)
	ref := &Reference{Identifier: id, Origin: origin, Kind: gvk, Resource: plural}
	name, err := compileLocator("reference.name", s.Reference.Name)
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
	return ref, nil
}

func compileLocator(field string, l ferryv1alpha1.ResourceLocator) (locator, error) {
	path, err := fieldpath.Parse(l.Path)
	if err != nil {
		return locator{}, fmt.Errorf("%s.path: %w", field, err)
	}
	loc := locator{field: field, path: path}
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

// Locate evaluates the entry on primary (a whole object, as JSON-like map):
// the related object's namespace and name on that side. The namespace
// defaults to the primary's.
func (r *Reference) Locate(primary map[string]any) (namespace, name string, err error) {
	if name, err = r.name.eval(primary); err != nil {
		return "", "", fmt.Errorf("related %q: %w", r.Identifier, err)
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", "", fmt.Errorf("related %q: %s gives %q, which is not a valid name: %s", r.Identifier, r.name.describe(), name, strings.Join(errs, "; "))
	}
	if r.namespace == nil {
		namespace, _ = fieldpath.Path{"metadata", "namespace"}.GetString(primary)
		if namespace == "" {
			return "", "", fmt.Errorf("related %q: the primary object has no namespace; set reference.namespace", r.Identifier)
		}
		return namespace, name, nil
	}
	if namespace, err = r.namespace.eval(primary); err != nil {
		return "", "", fmt.Errorf("related %q: %w", r.Identifier, err)
	}
	if errs := validation.IsDNS1123Label(namespace); len(errs) > 0 {
		return "", "", fmt.Errorf("related %q: %s gives %q, which is not a valid namespace: %s", r.Identifier, r.namespace.describe(), namespace, strings.Join(errs, "; "))
	}
	return namespace, name, nil
}

func (l locator) eval(obj map[string]any) (string, error) {
	if l.static {
		return l.replacement, nil
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
	if l.re != nil {
		return fmt.Sprintf("%s (path %s rewritten by %q)", l.field, l.path, l.re.String())
	}
	return fmt.Sprintf("%s (path %s)", l.field, l.path)
}

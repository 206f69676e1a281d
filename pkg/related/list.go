package related

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/fieldpath"
)

// References that return lists. A name path with a "#" (gjson's syntax,
// as api-syncagent writes it: spec.users.#.name) names one related object
// per item, each value rewritten by the regex. The path is evaluated on
// the primary on each side — the kcp object and its local copy — and the
// two lists are matched by position: item i on the origin side is copied
// to the name of item i on the destination side. Two lists of different
// lengths cannot be matched, so the engines refuse such a primary (and
// delete nothing) until they agree. The namespace stays one value: every
// object of the entry lives in the namespace it names.

// compileNameLocator compiles the locator of the related object's name,
// which may hold a "#" (a list reference).
func compileNameLocator(field string, l ferryv1alpha1.ResourceLocator, origin ferryv1alpha1.RelatedResourceOrigin) (locator, error) {
	lp, err := fieldpath.ParseList(l.Path)
	if err != nil {
		return locator{}, fmt.Errorf("%s.path: %w", field, err)
	}
	if !lp.IsList() {
		return compileLocator(field, l)
	}
	if origin != ferryv1alpha1.OriginService {
		return locator{}, fmt.Errorf("%s.path %q lists several objects (%q), which ferry supports for origin service only so far; "+
			"for origin kcp name one object per entry (e.g. spec.users.0.name) or one entry per object", field, l.Path, fieldpath.ListMarker)
	}
	if l.Regex != nil && l.Regex.Pattern == "" {
		return locator{}, fmt.Errorf("%s.regex: an empty pattern gives every item the same static name; a list needs a name per item (write a pattern, e.g. ^(.*)$)", field)
	}
	// The regex is compiled as for one value, and applied to each.
	return withRegex(locator{field: field, items: &lp}, l.Regex)
}

// IsList tells whether the entry's name path lists several objects
// (LocateList) rather than one (Locate).
func (r *Reference) IsList() bool { return r.name.items != nil }

// LocateList evaluates a list reference on primary on the side env says:
// the namespace, and the names in the order of the list's items (the
// other side's names match them by position). Every name must be valid
// and appear once: two items naming one object would copy it twice.
func (r *Reference) LocateList(primary map[string]any, env Env) (namespace string, names []string, err error) {
	if r.name.items == nil {
		return "", nil, fmt.Errorf("related %q names one object: locate it with Locate", r.Identifier)
	}
	values, err := r.name.items.GetStrings(primary)
	if err != nil {
		return "", nil, fmt.Errorf("related %q: %s: %w", r.Identifier, r.name.field, err)
	}
	names = make([]string, 0, len(values))
	seen := map[string]int{}
	for i, v := range values {
		if r.name.re != nil {
			v = r.name.re.ReplaceAllString(v, r.name.replacement)
		}
		if v == "" {
			return "", nil, fmt.Errorf("related %q: %s gives an empty name for item %d", r.Identifier, r.name.describe(), i)
		}
		if errs := validation.IsDNS1123Subdomain(v); len(errs) > 0 {
			return "", nil, fmt.Errorf("related %q: %s gives %q for item %d, which is not a valid name: %s", r.Identifier, r.name.describe(), v, i, strings.Join(errs, "; "))
		}
		if j, dup := seen[v]; dup {
			return "", nil, fmt.Errorf("related %q: %s gives %q for items %d and %d; each item must name its own object", r.Identifier, r.name.describe(), v, j, i)
		}
		seen[v] = i
		names = append(names, v)
	}
	if namespace, err = r.LocateNamespace(primary, env); err != nil {
		return "", nil, err
	}
	return namespace, names, nil
}

package related

import (
	"fmt"
	"regexp"
	"sort"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/replacement"
	"github.com/ferry-dev/ferry/pkg/templating"
)

// Label-selected related objects (object.selector, origin service). The
// primary names no object: every object of the related kind in the
// related namespace whose labels match is synced, so one entry may sync
// several objects. The selector is evaluated on the service cluster only
// (the origin); each object found gets its kcp name from the rewrite,
// because the service cluster's names (e.g. derived from a local name
// with a workspace hash) may say more than the consumer should see.

// selector is a compiled object.selector.
type selector struct {
	// matchLabels keys and values are templates (api-syncagent's rule);
	// a key that renders empty is left out.
	labels []labelTemplate
	exprs  []metav1.LabelSelectorRequirement
	// Exactly one of rewriteRe (with rewriteRepl; static when nil with a
	// replacement) and rewriteTmpl.
	rewriteRe     *regexp.Regexp
	rewriteRepl   string
	rewriteStatic bool
	rewriteTmpl   *templating.Template

	usesClusterPath bool
}

type labelTemplate struct {
	key, value *templating.Template
}

func compileSelector(field string, s *ferryv1alpha1.RelatedResourceObjectSelector) (*selector, error) {
	out := &selector{exprs: s.MatchExpressions}
	keys := make([]string, 0, len(s.MatchLabels))
	for k := range s.MatchLabels {
		keys = append(keys, k)
	}
	sort.Strings(keys) // a stable order for stable errors
	for _, k := range keys {
		kt, err := templating.Parse(field+".matchLabels key "+k, k)
		if err != nil {
			return nil, err
		}
		vt, err := templating.Parse(field+".matchLabels["+k+"]", s.MatchLabels[k])
		if err != nil {
			return nil, err
		}
		out.labels = append(out.labels, labelTemplate{key: kt, value: vt})
		out.usesClusterPath = out.usesClusterPath || strings.Contains(k+s.MatchLabels[k], ".ClusterPath")
	}
	// The expressions are checked once here, not on every evaluation.
	if _, err := metav1.LabelSelectorAsSelector(&metav1.LabelSelector{MatchExpressions: s.MatchExpressions}); err != nil {
		return nil, fmt.Errorf("%s.matchExpressions: %w", field, err)
	}
	rw := s.Rewrite
	switch {
	case rw.Regex != nil && rw.Template != nil, rw.Regex == nil && rw.Template == nil:
		return nil, fmt.Errorf("%s.rewrite: set exactly one of regex and template", field)
	case rw.Template != nil:
		t, err := templating.Parse(field+".rewrite.template", rw.Template.Template)
		if err != nil {
			return nil, err
		}
		out.rewriteTmpl = t
		out.usesClusterPath = out.usesClusterPath || strings.Contains(rw.Template.Template, ".ClusterPath")
	case rw.Regex.Pattern == "":
		if rw.Regex.Replacement == "" {
			return nil, fmt.Errorf("%s.rewrite.regex: an empty pattern needs a replacement", field)
		}
		out.rewriteStatic, out.rewriteRepl = true, rw.Regex.Replacement
	default:
		re, err := regexp.Compile(rw.Regex.Pattern)
		if err != nil {
			return nil, fmt.Errorf("%s.rewrite.regex.pattern: %w", field, err)
		}
		out.rewriteRe, out.rewriteRepl = re, replacement.Expand(rw.Regex.Replacement)
	}
	return out, nil
}

// Selector is the label selector of a label-selected entry for primary
// (on the service cluster: env.Side is service), its matchLabels templates
// rendered with .Object and .LocalObject (the primary), .ClusterName and
// .ClusterPath.
func (r *Reference) Selector(primary map[string]any, env Env) (labels.Selector, error) {
	if r.selector == nil {
		return nil, fmt.Errorf("related %q does not select by labels", r.Identifier)
	}
	data := templating.Data{Object: primary, LocalObject: primary, Side: string(env.Side), ClusterName: env.ClusterName, ClusterPath: env.ClusterPath, WorkspacePath: env.ClusterPath}
	ls := &metav1.LabelSelector{MatchLabels: map[string]string{}, MatchExpressions: r.selector.exprs}
	for _, l := range r.selector.labels {
		k, err := l.key.Execute(data)
		if err != nil {
			return nil, fmt.Errorf("related %q: object.selector: %w", r.Identifier, err)
		}
		if k == "" {
			continue
		}
		v, err := l.value.Execute(data)
		if err != nil {
			return nil, fmt.Errorf("related %q: object.selector: %w", r.Identifier, err)
		}
		ls.MatchLabels[k] = v
	}
	sel, err := metav1.LabelSelectorAsSelector(ls)
	if err != nil {
		return nil, fmt.Errorf("related %q: object.selector: %w", r.Identifier, err)
	}
	if sel.Empty() {
		// Every object of the kind in the namespace would be synced.
		return nil, fmt.Errorf("related %q: object.selector selects everything; it needs at least one label", r.Identifier)
	}
	return sel, nil
}

// Rewrite is the kcp name of found, an object the entry's selector found
// on the service cluster for primary: its name rewritten by
// selector.rewrite (a template sees .Value, the found name, and
// .RelatedObject, the found object, besides the primary).
func (r *Reference) Rewrite(found, primary map[string]any, foundName string, env Env) (string, error) {
	if r.selector == nil {
		return "", fmt.Errorf("related %q does not select by labels", r.Identifier)
	}
	var name string
	switch s := r.selector; {
	case s.rewriteTmpl != nil:
		v, err := s.rewriteTmpl.Execute(templating.Data{
			Value: foundName, RelatedObject: found, Object: primary, LocalObject: primary,
			Side: string(env.Side), ClusterName: env.ClusterName, ClusterPath: env.ClusterPath, WorkspacePath: env.ClusterPath,
		})
		if err != nil {
			return "", fmt.Errorf("related %q: object.selector.rewrite: %w", r.Identifier, err)
		}
		name = v
	case s.rewriteStatic:
		name = s.rewriteRepl
	default:
		name = s.rewriteRe.ReplaceAllString(foundName, s.rewriteRepl)
	}
	if name == "" {
		return "", fmt.Errorf("related %q: object.selector.rewrite gives an empty name for %s", r.Identifier, foundName)
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return "", fmt.Errorf("related %q: object.selector.rewrite gives %q for %s, which is not a valid name: %s", r.Identifier, name, foundName, strings.Join(errs, "; "))
	}
	return name, nil
}

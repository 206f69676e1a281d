// Package naming decides the local namespace and name of a kcp object's copy
// in the service cluster, and the labels and annotations that point back to
// the kcp object.
//
// Naming rules are either strings with the placeholders $remoteClusterName,
// $remoteNamespace, $remoteNamespaceHash, $remoteName and $remoteNameHash, or
// Go templates (any rule containing "{{") run by pkg/templating over the
// data of a Remote: ferry's .ClusterName, .WorkspacePath, .Namespace,
// .Name, api-syncagent's .Object (the kcp object) and .ClusterPath, and the
// seeds' .RemoteObject. The defaults —
// namespace "$remoteClusterName", name "$remoteNamespaceHash-$remoteNameHash"
// — cannot collide: the namespace separates workspaces and the name hashes
// are fixed-length, so the separator is unambiguous.
//
// Labels carry hashes (label values are limited to 63 characters), the
// annotations the full values.
package naming

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/templating"
)

// Placeholders usable in naming rules.
const (
	PlaceholderClusterName   = "$remoteClusterName"
	PlaceholderNamespace     = "$remoteNamespace"
	PlaceholderNamespaceHash = "$remoteNamespaceHash"
	PlaceholderName          = "$remoteName"
	PlaceholderNameHash      = "$remoteNameHash"
)

// Default rules.
const (
	DefaultNamespace = PlaceholderClusterName
	DefaultName      = PlaceholderNamespaceHash + "-" + PlaceholderNameHash
)

// HashLength is how many hex characters of a SHA-1 a hash keeps.
const HashLength = templating.HashLength

// Hash is the first 20 hex characters of the SHA-1 of s (the templates'
// shortHash and hash).
func Hash(s string) string { return templating.ShortHash(s) }

// Remote identifies the kcp object a local copy belongs to. It is also the
// data of Go template rules (see TemplateData).
type Remote struct {
	// ClusterName is the logical cluster name of the object's workspace.
	ClusterName string
	// WorkspacePath is the workspace path, when known.
	WorkspacePath string
	// Namespace is the object's namespace in kcp ("" when cluster-scoped).
	Namespace string
	// Name is the object's name in kcp.
	Name string
	// UID is the object's uid in kcp (not used by naming rules).
	UID string
}

// TemplateData is what naming templates see for remote, whose kcp object
// is obj when at hand (nil: templates see an object made of remote's
// fields).
func (r Remote) TemplateData(object map[string]any) templating.Data {
	obj := templating.Object(object)
	if obj == nil {
		meta := map[string]any{"name": r.Name}
		if r.Namespace != "" {
			meta["namespace"] = r.Namespace
		}
		if r.UID != "" {
			meta["uid"] = r.UID
		}
		obj = templating.Object{"metadata": meta}
	}
	return templating.Data{
		Object: obj, Remote: obj, RemoteObject: obj,
		ClusterName: r.ClusterName, ClusterPath: r.WorkspacePath, WorkspacePath: r.WorkspacePath,
		Namespace: r.Namespace, Name: r.Name,
	}
}

// Rules are compiled naming rules. Build them once per PublishedResource.
type Rules struct {
	namespace rule
	name      rule
}

type rule struct {
	text string
	tmpl *templating.Template
}

// Compile checks and compiles a PublishedResource's naming rules (nil means
// the defaults).
func Compile(n *ferryv1alpha1.ResourceNaming) (*Rules, error) {
	nsText, nameText := DefaultNamespace, DefaultName
	if n != nil && n.Namespace != "" {
		nsText = n.Namespace
	}
	if n != nil && n.Name != "" {
		nameText = n.Name
	}
	ns, err := compileRule("spec.naming.namespace", nsText)
	if err != nil {
		return nil, err
	}
	name, err := compileRule("spec.naming.name", nameText)
	if err != nil {
		return nil, err
	}
	return &Rules{namespace: ns, name: name}, nil
}

func compileRule(field, text string) (rule, error) {
	if !strings.Contains(text, "{{") {
		return rule{text: text}, nil
	}
	t, err := templating.Parse(field, text)
	if err != nil {
		return rule{}, err
	}
	return rule{text: text, tmpl: t}, nil
}

func (r rule) apply(remote Remote, object map[string]any) (string, error) {
	if r.tmpl == nil {
		// Longer placeholders first: $remoteNamespaceHash before $remoteNamespace.
		return strings.NewReplacer(
			PlaceholderNamespaceHash, Hash(remote.Namespace),
			PlaceholderNameHash, Hash(remote.Name),
			PlaceholderClusterName, remote.ClusterName,
			PlaceholderNamespace, remote.Namespace,
			PlaceholderName, remote.Name,
		).Replace(r.text), nil
	}
	out, err := r.tmpl.Execute(remote.TemplateData(object))
	if err != nil {
		return "", fmt.Errorf("%s: %w", r.tmpl.Name(), err)
	}
	return out, nil
}

// Check runs the template rules on a sample kcp object of the resource
// (templating.Check): a rule that would fail on every object — data the
// model lacks, such as .Objekt — is an error naming the rule.
func (r *Rules) Check(apiVersion, kind string, namespaced bool) error {
	sample := templating.SampleData(apiVersion, kind, namespaced)
	for _, rl := range []rule{r.namespace, r.name} {
		if rl.tmpl == nil {
			continue
		}
		if err := rl.tmpl.Check(sample); err != nil {
			return err
		}
	}
	return nil
}

// Local returns the local namespace (empty when the local resource is
// cluster-scoped) and name for remote. Results longer than Kubernetes allows
// are shortened deterministically (see Shorten); results that are still not
// valid names are an error naming the rule.
func (r *Rules) Local(remote Remote, namespaced bool) (namespace, name string, err error) {
	return r.LocalOf(remote, nil, namespaced)
}

// LocalOf is Local with the kcp object at hand, for templates reading it
// (.Object.spec…).
func (r *Rules) LocalOf(remote Remote, object map[string]any, namespaced bool) (namespace, name string, err error) {
	if namespaced {
		ns, err := r.namespace.apply(remote, object)
		if err != nil {
			return "", "", err
		}
		namespace = Shorten(ns, validation.DNS1123LabelMaxLength)
		if msgs := validation.IsDNS1123Label(namespace); len(msgs) > 0 {
			return "", "", fmt.Errorf("spec.naming.namespace %q yields %q, not a valid namespace: %s", r.namespace.text, namespace, strings.Join(msgs, "; "))
		}
	}
	n, err := r.name.apply(remote, object)
	if err != nil {
		return "", "", err
	}
	name = Shorten(n, validation.DNS1123SubdomainMaxLength)
	if msgs := validation.IsDNS1123Subdomain(name); len(msgs) > 0 {
		return "", "", fmt.Errorf("spec.naming.name %q yields %q, not a valid name: %s", r.name.text, name, strings.Join(msgs, "; "))
	}
	return namespace, name, nil
}

// StaticNamespace returns the namespace rule's value when it names one
// namespace for every object (no placeholder, no template): a namespace the
// service owner named in the PublishedResource, shared by all workspaces.
func (r *Rules) StaticNamespace() (string, bool) {
	if r.namespace.tmpl != nil || strings.Contains(r.namespace.text, "$") {
		return "", false
	}
	return r.namespace.text, true
}

// Shorten returns s when it fits in limit, else a prefix of s followed by
// "-" and the hash of the whole s, limit characters long: two different
// long inputs share a result only if their SHA-1 prefixes collide.
func Shorten(s string, limit int) string {
	if len(s) <= limit {
		return s
	}
	suffix := "-" + Hash(s)
	prefix := strings.TrimRight(s[:limit-len(suffix)], "-.")
	return prefix + suffix
}

// SeparatesWorkspaces tells whether the rules can never map objects of two
// workspaces onto one local object: a rule names the workspace
// ($remoteClusterName, or .ClusterName / .WorkspacePath in a template), or,
// for namespaced copies, the namespace rule yields namespaces the edge
// creates for one workspace each (not a static namespace, and not the
// service cluster's own namespaces, which allowExistingNamespaces admits).
func (r *Rules) SeparatesWorkspaces(namespaced, allowExistingNamespaces bool) bool {
	if r.name.namesWorkspace() || namespaced && r.namespace.namesWorkspace() {
		return true
	}
	if !namespaced || allowExistingNamespaces {
		return false
	}
	_, static := r.StaticNamespace()
	return !static
}

// namesWorkspace tells whether the rule's result depends on the workspace.
func (r rule) namesWorkspace() bool {
	if r.tmpl != nil {
		return strings.Contains(r.text, ".ClusterName") || strings.Contains(r.text, ".WorkspacePath") || strings.Contains(r.text, ".ClusterPath")
	}
	return strings.Contains(r.text, PlaceholderClusterName)
}

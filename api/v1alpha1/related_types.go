package v1alpha1

import (
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Related objects: the spec.related[] entries of a PublishedResource.
//
// Two spellings are accepted, so documents written for api-syncagent work
// with only their apiVersion changed:
//
//   - ferry's: kind (+ group, version) and reference.{name,namespace}, each a
//     path on the primary object with an optional regex;
//   - api-syncagent's: resource (the plural, + group, version) and
//     object.{reference|template|selector} with object.namespace.
//
// Exactly one of kind and resource, and exactly one of reference and object,
// is set; admission says which when a document mixes them.

// RelatedResourceOrigin tells on which side a related object is created:
// "service" or "kcp". "platform", the seeds' word for kcp, is accepted as
// written and means kcp; compare origins through Normalized.
// +kubebuilder:validation:Enum=service;kcp;platform
type RelatedResourceOrigin string

// Related resource origins.
const (
	OriginService RelatedResourceOrigin = "service"
	OriginKCP     RelatedResourceOrigin = "kcp"
	// OriginPlatform is the seeds' spelling of OriginKCP.
	OriginPlatform RelatedResourceOrigin = "platform"
)

// Normalized returns the origin in ferry's spelling: platform becomes kcp;
// anything else is returned unchanged (and refused where it is compiled).
func (o RelatedResourceOrigin) Normalized() RelatedResourceOrigin {
	if o == OriginPlatform {
		return OriginKCP
	}
	return o
}

// RelatedResourceSpec describes one kind of related object.
// +kubebuilder:validation:XValidation:rule="!(has(self.kind) && has(self.resource))",message="set kind (e.g. Secret) or resource (the plural, e.g. secrets), not both: the edge derives one from the other through the service cluster's discovery"
// +kubebuilder:validation:XValidation:rule="has(self.kind) || has(self.resource)",message="set kind (e.g. Secret) or resource (the plural, e.g. secrets) to name the related object's type"
// +kubebuilder:validation:XValidation:rule="!(has(self.reference) && has(self.object))",message="set reference (ferry's name/namespace paths) or object (api-syncagent's reference, template or selector), not both"
// +kubebuilder:validation:XValidation:rule="has(self.reference) || has(self.object)",message="set reference (e.g. reference.name.path: spec.secretName) or object (e.g. object.reference.path: spec.secretName) to say where the related object is"
// +kubebuilder:validation:XValidation:rule="!has(self.object) || !has(self.object.selector) || self.origin == 'service'",message="object.selector finds objects by their labels on the service cluster, so it needs origin: service; for origin kcp locate the object by object.reference or object.template"
// +kubebuilder:validation:XValidation:rule="!has(self.syncStatus) || !self.syncStatus || self.origin == 'service'",message="syncStatus carries the status of a service-origin related object into kcp; it needs origin: service (the status of a kcp-origin object is not synced)"
// +kubebuilder:validation:XValidation:rule="!has(self.identityHash) || (has(self.group) && size(self.group) > 0)",message="identityHash names the APIExport that provides a kind of an API group; kinds of the core group (secrets, configmaps) have no identity: set group or drop identityHash"
// +kubebuilder:validation:XValidation:rule="!has(self.projection) || has(self.resource)",message="projection needs the related resource on the origin side written as resource (the lowercase plural, e.g. resource: userdatabases) instead of kind: each side resolves its kind from its resource through its own discovery"
// +kubebuilder:validation:XValidation:rule="!has(self.mutation) || !has(self.mutation.status) || size(self.mutation.status) == 0 || (has(self.syncStatus) && self.syncStatus)",message="mutation.status rewrites the status carried with syncStatus: set syncStatus: true (origin service) or drop the status steps"
// +kubebuilder:validation:XValidation:rule="!has(self.watch) || self.origin == 'service'",message="watch narrows what the edge caches of a service-origin related kind on the service cluster; it needs origin: service (the broker watches kcp-origin objects through the APIExport's virtual workspace, not the edge)"
type RelatedResourceSpec struct {
	// Identifier names the entry, unique within the PublishedResource; it
	// labels the related copies. Default: the resource when set (e.g.
	// "secrets"), else the kind in lowercase (e.g. "secret"), as the seeds'
	// examples leave it out; two entries of one kind must set it.
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:MaxLength=63
	Identifier string `json:"identifier,omitempty"`

	// Origin is the side where the object is created: "service" (synced up
	// into kcp) or "kcp" (synced down); "platform" (the seeds' word) means
	// kcp.
	// +required
	Origin RelatedResourceOrigin `json:"origin"`

	// Kind of the related object, e.g. Secret or ConfigMap. Either Kind or
	// Resource is set.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	Kind string `json:"kind,omitempty"`

	// Resource is the related object's plural resource name, e.g. secrets
	// (api-syncagent's spelling; Kind is ferry's). The edge resolves it to a
	// kind through the service cluster's discovery, so it must be served
	// there. Either Kind or Resource is set.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="resource is the lowercase plural as `kubectl api-resources` lists it (e.g. secrets, not Secrets or Secret); to name the kind write kind: Secret instead"
	Resource string `json:"resource,omitempty"`

	// Group of the related object; empty for the core group.
	// +optional
	Group string `json:"group,omitempty"`

	// Version of the related object; default "v1".
	// +optional
	Version string `json:"version,omitempty"`

	// Reference locates the related object by paths on the primary object
	// (ferry's spelling). Either Reference or Object is set.
	// +optional
	Reference *RelatedResourceReference `json:"reference,omitempty"`

	// Object locates the related object by a reference, a template or a
	// label selector, and its namespace likewise (api-syncagent's
	// spelling). Either Reference or Object is set.
	// +optional
	Object *RelatedResourceObject `json:"object,omitempty"`

	// Cleanup says whether the related copies go with the primary object.
	// Default true: when the primary is deleted, the copies ferry wrote
	// (in kcp for origin service, in the service cluster for origin kcp)
	// are deleted before its finalizer is released. False keeps them: ferry
	// removes its labels and annotations from each copy (and, in kcp, the
	// owner reference to the primary, so kcp's garbage collector keeps it
	// too) and never touches it again — it becomes an ordinary object of
	// its side. A copy whose reference moves while the primary exists is
	// still deleted, and deletionPolicy Delete of the PublishedResource
	// still deletes every copy.
	// +optional
	// +kubebuilder:default=true
	Cleanup *bool `json:"cleanup,omitempty"`

	// IdentityHash relates a kind that another APIExport provides in kcp:
	// that APIExport's status.identityHash (64 lowercase hex characters).
	// The broker claims the resource with this identity in ferry's
	// APIExport, so a consumer workspace that binds the other APIExport
	// and accepts ferry's claim lets ferry read and write those objects.
	// Leave it out for kinds kcp serves in every workspace (secrets,
	// configmaps). The service cluster serves the same group, version and
	// resource (e.g. the other provider's CRD).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-f0-9]{64}$')",message="identityHash is the other APIExport's status.identityHash: 64 lowercase hex characters (kubectl get apiexport <name> -o jsonpath='{.status.identityHash}')"
	IdentityHash string `json:"identityHash,omitempty"`

	// Projection relates the kind under another group, version or
	// resource on the destination side (api-syncagent's semantics): group,
	// version and resource above are the origin side's (the service
	// cluster's for origin service, kcp's for origin kcp), and each field
	// set here replaces its counterpart on the destination side (unset:
	// unchanged). Typical use: a CRD another PublishedResource of this
	// edge publishes (schema-only, synchronization disabled) related from
	// the service cluster into kcp under the APIExport's group, e.g.
	// projection.group: the APIExport's name. Needs resource (not kind);
	// the kind on each side is what that side serves the resource as.
	// +optional
	Projection *RelatedResourceProjection `json:"projection,omitempty"`

	// Mutation rewrites the related object on its way to its destination
	// side, with the steps of spec.mutation (delete, regex, template, cel).
	// Spec steps run on the object's content (all but status) going from
	// its origin to the destination — into kcp for origin service, into
	// the service cluster for origin kcp. Status steps run on the status
	// carried with syncStatus (origin service: from the service cluster
	// into kcp) and need it. Templates and CEL see the related object as
	// the mutated object, and its service-cluster and kcp versions as far
	// as they are known.
	// +optional
	Mutation *ResourceMutationSpec `json:"mutation,omitempty"`

	// SyncStatus carries the related object's status along with it
	// (default false: status stays on its side). For origin service the
	// status of the object in the service cluster is written to the copy in
	// kcp — through the status subresource where the kind has one — so a
	// consumer sees e.g. whether a provisioned object is ready. Only for
	// origin service.
	// +optional
	SyncStatus bool `json:"syncStatus,omitempty"`

	// Watch narrows what the edge caches of the related kind on the
	// service cluster, and so what it can find: with watch.labelSelector
	// its informers list and watch only objects with those labels (the API
	// server filters), and an object without them is not found — as if it
	// did not exist — until it is labelled. Default: every object of the
	// kind in the namespaces the edge may use. Only for origin service.
	// +optional
	Watch *RelatedResourceWatch `json:"watch,omitempty"`
}

// RelatedResourceWatch says which objects of a service-origin related kind
// the edge caches. It is static: the same for every primary object, since
// one informer serves them all.
// +kubebuilder:validation:XValidation:rule="(has(self.labelSelector.matchLabels) && size(self.labelSelector.matchLabels) > 0) || (has(self.labelSelector.matchExpressions) && size(self.labelSelector.matchExpressions) > 0)",message="watch.labelSelector selects every object when it has neither matchLabels nor matchExpressions; name the labels the service's controller puts on the related objects (e.g. matchLabels: {app.kubernetes.io/managed-by: my-operator}), or leave watch out to cache every object of the kind"
type RelatedResourceWatch struct {
	// LabelSelector the related objects must match to be cached and
	// found, e.g. the label the service's controller puts on every Secret
	// it makes. Static: no templates (an informer is shared by every
	// primary object).
	// +required
	LabelSelector metav1.LabelSelector `json:"labelSelector"`
}

// EffectiveIdentifier is the identifier, or its default: the resource when
// the entry names one, else the kind in lowercase.
func (s *RelatedResourceSpec) EffectiveIdentifier() string {
	// The resource first: the edge sends the broker the kind it resolved
	// beside a resource, and both sides must derive the same identifier.
	switch {
	case s.Identifier != "":
		return s.Identifier
	case s.Resource != "":
		return s.Resource
	default:
		return strings.ToLower(s.Kind)
	}
}

// RelatedResourceReference locates a related object by paths evaluated on
// the primary object on each side.
type RelatedResourceReference struct {
	// Name of the related object.
	// +required
	Name ResourceLocator `json:"name"`
	// Namespace of the related object; default: the primary's namespace.
	// +optional
	Namespace *ResourceLocator `json:"namespace,omitempty"`
}

// ResourceLocator evaluates a field path on an object, optionally rewritten
// by a regular expression.
type ResourceLocator struct {
	// Path is a dot-separated field path, e.g. "spec.secretName". For the
	// name of an origin service entry it may hold one "#" (gjson's syntax)
	// for every item of a list, e.g. "spec.users.#.name" or
	// "spec.secretNames.#": one related object per item, matched by
	// position between the kcp object and its local copy. A namespace
	// path names one value.
	// +required
	// +kubebuilder:validation:MinLength=1
	Path string `json:"path"`
	// Regex rewrites the value found at Path.
	// +optional
	Regex *RegexReplacement `json:"regex,omitempty"`
}

// RegexReplacement is a Go regular expression replacement. An empty pattern
// with a replacement yields the replacement as a static value.
type RegexReplacement struct {
	// Pattern to match; empty replaces the whole value.
	// +optional
	Pattern string `json:"pattern,omitempty"`
	// Replacement, which may refer to groups as $1 or ${1} (Go) or as \1
	// (the seeds' and api-syncagent's spelling; \\ is a literal backslash).
	// +optional
	Replacement string `json:"replacement,omitempty"`
}

// RelatedResourceObject locates a related object and its namespace
// (api-syncagent's spelling). Each level is located in exactly one way.
// The rules are evaluated on the primary object on each side: in kcp on
// the kcp object, on the service cluster on its local copy (after
// mutations), so each side finds its own name.
// +kubebuilder:validation:XValidation:rule="!has(self.__namespace__) || !has(self.__namespace__.selector)",message="object.namespace.selector is not supported by ferry: locate the namespace by object.namespace.reference or object.namespace.template, or leave it out for the primary's namespace"
type RelatedResourceObject struct {
	RelatedResourceObjectSpec `json:",inline"`

	// Namespace locates the related object's namespace; default: the
	// primary's namespace (required when the primary is cluster-scoped).
	// +optional
	Namespace *RelatedResourceObjectSpec `json:"namespace,omitempty"`
}

// RelatedResourceObjectSpec is one way of locating a related object's name
// or namespace: exactly one of Reference, Template and Selector.
// +kubebuilder:validation:XValidation:rule="(has(self.reference) ? 1 : 0) + (has(self.template) ? 1 : 0) + (has(self.selector) ? 1 : 0) == 1",message="locate the related object (and its namespace) in exactly one way: reference (a path on the primary object), template (a Go template) or selector (labels, with a rewrite for the destination name)"
type RelatedResourceObjectSpec struct {
	// Reference is a dot-separated path on the primary object, e.g.
	// spec.secretName, with an optional regex applied to the value.
	// +optional
	Reference *RelatedResourceObjectReference `json:"reference,omitempty"`

	// Template is a Go template (pkg/templating: sprig functions, sha3sum,
	// sha3short, shortHash) whose output is the name. It sees .Object (the
	// primary object on the side it is evaluated for), .Side ("kcp" or
	// "service"), .ClusterName and .ClusterPath (the kcp workspace).
	// +optional
	Template *TemplateExpression `json:"template,omitempty"`

	// Selector finds the related objects by their labels on the service
	// cluster (origin service only; not for a namespace): every object of
	// the kind in the related namespace whose labels match is synced, so
	// one entry may sync several objects. matchLabels keys and values are
	// Go templates over .Object / .LocalObject (the local primary copy),
	// .ClusterName and .ClusterPath; a key that renders empty is left out.
	// Rewrite gives each found object its name in kcp.
	// +optional
	Selector *RelatedResourceObjectSelector `json:"selector,omitempty"`
}

// RelatedResourceObjectReference is a path on the primary object, with an
// optional regular expression applied to the value found.
type RelatedResourceObjectReference struct {
	// Path is a dot-separated field path, e.g. "spec.secretName"; for the
	// object's name (origin service) it may hold one "#" for every item of
	// a list, e.g. "spec.users.#.name" (see ResourceLocator.Path).
	// +required
	// +kubebuilder:validation:MinLength=1
	Path string `json:"path"`
	// Regex rewrites the value found at Path.
	// +optional
	Regex *RegexReplacement `json:"regex,omitempty"`
}

// TemplateExpression is a Go template (see pkg/templating).
type TemplateExpression struct {
	// Template text, e.g. "{{ .Object.spec.secretName }}"; its output is
	// trimmed of surrounding whitespace.
	// +required
	// +kubebuilder:validation:MinLength=1
	Template string `json:"template"`
}

// RelatedResourceObjectSelector finds related objects by their labels on
// the origin side. Every object found is synced, named on the destination
// side by Rewrite (the origin's names may say more than the consumer
// should see).
type RelatedResourceObjectSelector struct {
	metav1.LabelSelector `json:",inline"`

	// Rewrite names each found object on the destination side.
	// +required
	Rewrite RelatedResourceSelectorRewrite `json:"rewrite"`
}

// RelatedResourceSelectorRewrite turns a found object's name into its name
// on the destination side: exactly one of Regex and Template.
// +kubebuilder:validation:XValidation:rule="has(self.regex) != has(self.template)",message="rewrite sets exactly one of regex (pattern and replacement) and template (a Go template over .Value, the found name)"
type RelatedResourceSelectorRewrite struct {
	// Regex rewrites the found name.
	// +optional
	Regex *RegexReplacement `json:"regex,omitempty"`
	// Template computes the name; .Value is the found name and
	// .RelatedObject the found object.
	// +optional
	Template *TemplateExpression `json:"template,omitempty"`
}

// RelatedResourceProjection is a related kind's group, version and
// resource on the destination side; each unset (or empty) field keeps the
// origin side's. An empty group keeps the origin's group, so a kind cannot
// be projected into the core group.
// +kubebuilder:validation:XValidation:rule="(has(self.group) && size(self.group) > 0) || (has(self.version) && size(self.version) > 0) || (has(self.resource) && size(self.resource) > 0)",message="projection sets at least one of group, version and resource (the related kind's on the destination side, e.g. projection.group: the APIExport's name); remove an empty projection"
type RelatedResourceProjection struct {
	// Group on the destination side, e.g. the APIExport's name for a kind
	// another PublishedResource of this edge publishes.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="size(self) == 0 || self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*$')",message="projection.group is an API group in lowercase, e.g. api.example.com"
	Group string `json:"group,omitempty"`
	// Version on the destination side, e.g. v1alpha1.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="size(self) == 0 || self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="projection.version is an API version in lowercase, e.g. v1 or v1alpha1"
	Version string `json:"version,omitempty"`
	// Resource on the destination side: the lowercase plural, e.g.
	// userdatabases.
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="size(self) == 0 || self.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')",message="projection.resource is the lowercase plural as `kubectl api-resources` lists it (e.g. userdatabases, not UserDatabases or UserDatabase): kcp and Kubernetes serve only lowercase resource names"
	Resource string `json:"resource,omitempty"`
}

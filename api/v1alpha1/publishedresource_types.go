package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=pubres,categories=ferry
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.spec.resource.kind`,description="Kind of the CRD on the service cluster"
// +kubebuilder:printcolumn:name="Projected",type=string,JSONPath=`.status.projectedKind`,description="Kind as served in kcp"
// +kubebuilder:printcolumn:name="Schema",type=string,JSONPath=`.status.resourceSchemaName`,description="APIResourceSchema in kcp"
// +kubebuilder:printcolumn:name="Published",type=string,JSONPath=`.status.conditions[?(@.type=="Published")].status`
// +kubebuilder:printcolumn:name="Synced",type=string,JSONPath=`.status.conditions[?(@.type=="Synced")].status`,description="Whether the edge watches the local copies"
// +kubebuilder:printcolumn:name="Copies",type=integer,JSONPath=`.status.objects.synced`,description="Local copies of kcp objects in the service cluster"
// +kubebuilder:printcolumn:name="Failing",type=integer,JSONPath=`.status.objects.failing`,description="kcp objects the edge refuses (SyncFailed Events on them in kcp)"
// +kubebuilder:printcolumn:name="Conflicts",type=integer,JSONPath=`.status.objects.conflicting`,description="kcp objects whose local name another object holds"
// +kubebuilder:printcolumn:name="Virtual-Workspace",type=string,JSONPath=`.status.conditions[?(@.type=="VirtualWorkspaceReady")].status`,priority=1,description="Whether the broker watches the APIExport's virtual workspace"
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.status) || !has(oldSelf.status.servedResource) || oldSelf.status.servedResource == '' || (has(self.spec.projection) && has(self.spec.projection.kind) ? self.spec.projection.kind : '') == (has(oldSelf.spec.projection) && has(oldSelf.spec.projection.kind) ? oldSelf.spec.projection.kind : '') && (has(self.spec.projection) && has(self.spec.projection.plural) ? self.spec.projection.plural : '') == (has(oldSelf.spec.projection) && has(oldSelf.spec.projection.plural) ? oldSelf.spec.projection.plural : '') && (has(self.spec.projection) && has(self.spec.projection.scope) ? self.spec.projection.scope : '') == (has(oldSelf.spec.projection) && has(oldSelf.spec.projection.scope) ? oldSelf.spec.projection.scope : '') && (has(self.spec.projection) && has(self.spec.projection.version) ? self.spec.projection.version : '') == (has(oldSelf.spec.projection) && has(oldSelf.spec.projection.version) ? oldSelf.spec.projection.version : '') && (has(self.spec.projection) && has(self.spec.projection.versions) ? self.spec.projection.versions : {}) == (has(oldSelf.spec.projection) && has(oldSelf.spec.projection.versions) ? oldSelf.spec.projection.versions : {})",messageExpression="'spec.projection (kind, plural, scope, version, versions) cannot change once published (served as ' + oldSelf.status.servedResource + '): its objects in kcp and their local copies belong to that resource. To serve the CRD as another resource, delete this PublishedResource with deletionPolicy Orphan to keep the copies, then create a new one (README: changing a projection)'",fieldPath=".spec.projection",reason=FieldValueForbidden

// PublishedResource publishes one CRD of the service cluster as an API in
// kcp: the edge sends the CRD to the broker, which projects it into an
// APIResourceSchema and adds it to the edge's APIExport. Objects that kcp
// users create are then synced into this cluster (unless synchronization is
// disabled).
//
// Once published (status.servedResource set), the projected resource
// (spec.projection kind, plural, scope, version, versions) cannot change:
// the kcp objects of the served resource and their local copies belong to
// it, and moving them would delete every copy. Short names and categories
// can change. Only one PublishedResource may publish a given CRD: a younger
// one naming the same CRD is refused (LocalResourceClaimed) until the elder
// is gone.
type PublishedResource struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// Spec describes what to publish and how.
	// +required
	Spec PublishedResourceSpec `json:"spec"`

	// Status reports whether and as what the resource is published.
	// +optional
	Status PublishedResourceStatus `json:"status,omitempty"`
}

// PublishedResourceSpec describes what to publish and how.
type PublishedResourceSpec struct {
	// Resource is the CRD on the service cluster to publish. It cannot be
	// changed after creation: publishing another resource means a new
	// PublishedResource.
	// +required
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.resource is immutable: create a new PublishedResource to publish another resource"
	Resource SourceResource `json:"resource"`

	// Projection changes how the resource looks in kcp (version names, kind,
	// plural, short names, categories, scope). The API group in kcp is always
	// the APIExport's name.
	// +optional
	Projection *ResourceProjection `json:"projection,omitempty"`

	// Naming controls the namespace and name of local copies of kcp objects.
	// +optional
	Naming *ResourceNaming `json:"naming,omitempty"`

	// Filter restricts which kcp objects are synced.
	// +optional
	Filter *ResourceFilter `json:"filter,omitempty"`

	// Related lists objects that belong to each published object and are
	// synced along with it (e.g. a Secret with credentials). Every entry's
	// identifier (set, or derived from its kind) is unique.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:XValidation:rule="self.all(a, self.exists_one(b, (has(b.identifier) ? b.identifier : has(b.resource) ? b.resource : b.kind.lowerAscii()) == (has(a.identifier) ? a.identifier : has(a.resource) ? a.resource : a.kind.lowerAscii())))",message="two spec.related entries have the same identifier (an unset identifier is the resource, e.g. secrets, or else the kind in lowercase, e.g. secret): set identifier on the entries of the same kind so that each is different"
	Related []RelatedResourceSpec `json:"related,omitempty"`

	// Mutation rewrites objects on their way between kcp and the service
	// cluster.
	// +optional
	Mutation *ResourceMutationSpec `json:"mutation,omitempty"`

	// EnableWorkspacePaths records the kcp workspace path (not only the
	// logical cluster name) on local copies.
	// +optional
	EnableWorkspacePaths bool `json:"enableWorkspacePaths,omitempty"`

	// Synchronization controls whether objects are synced at all.
	// +optional
	Synchronization *SynchronizationSpec `json:"synchronization,omitempty"`

	// DeletionPolicy says what becomes of the local copies when this
	// PublishedResource is deleted or its synchronization disabled. In both
	// cases the broker releases its finalizer on every kcp object of the
	// resource, so kcp objects can always be deleted afterwards.
	//
	//   - Orphan (default): the local copies stay in the service cluster,
	//     untouched (labels included), and related copies in kcp stay too.
	//     Recreating the PublishedResource picks the copies up again.
	//   - Delete: the edge deletes every local copy (and the related copies
	//     ferry wrote next to them) before the finalizer of the
	//     PublishedResource is removed; related copies in kcp are deleted.
	//
	// Orphan is the default because the local copies are usually real
	// resources (a database, a bucket): deleting a PublishedResource — by
	// mistake, or to recreate it with other settings — must not destroy
	// them. Delete is for APIs whose copies are disposable.
	// +optional
	// +kubebuilder:default=Orphan
	DeletionPolicy DeletionPolicy `json:"deletionPolicy,omitempty"`

	// LocalEdits says what becomes of an edit made in the service cluster
	// to a field of a local copy that the kcp object sets (the spec, and
	// every other field outside metadata and status).
	//
	//   - Repair (default): kcp wins at once. The edit is undone within
	//     seconds; the copy always holds what kcp says.
	//   - Keep: the edit survives until the kcp object changes that same
	//     field; then kcp's new value wins (a field kcp removes is removed).
	//     The edge keeps the state it last applied from kcp in the copy's
	//     ferry.dev/last-applied annotation, as kubectl apply does, and
	//     merges field by field (maps key by key; a list is one value).
	//
	// Repair is the default because the copy then never silently differs
	// from what the consumer sees in kcp. Keep suits services whose
	// operators tune copies by hand, or whose controllers write into the
	// spec, at the price that kcp no longer tells the whole truth about a
	// copy and that each copy carries its last applied state (objects whose
	// state is too large for an annotation are repaired as with Repair).
	// Labels and annotations that kcp sets are always re-applied.
	// +optional
	// +kubebuilder:default=Repair
	LocalEdits LocalEditsPolicy `json:"localEdits,omitempty"`

	// ServiceOwnedPaths are field paths of a local copy (the path syntax of
	// mutations, e.g. spec.replicas) that the service cluster owns once the
	// copy exists: ferry sets them from the kcp object when it creates the
	// copy and never applies them again, so a change in kcp does not reach
	// the copy and a local change (an autoscaler's) is never repaired. Use
	// them for fields a controller of the service cluster manages, so ferry
	// and that controller never fight over them. Default: none.
	//
	// A path names a field of the object's content: not metadata, status,
	// apiVersion or kind, and not an element of a list (a list is one
	// value: name the list). Removing a path hands it back to kcp: the next
	// apply sets kcp's value again.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=256
	// +kubebuilder:validation:XValidation:rule="self.all(p, p.matches('^[.]?[^.]+([.][^.]+)*$'))",message="spec.serviceOwnedPaths: every entry is a dot-separated field path without empty segments, such as spec.replicas"
	// +kubebuilder:validation:XValidation:rule="self.all(p, !p.matches('^[.]?(metadata|status|apiVersion|kind)([.]|$)'))",message="spec.serviceOwnedPaths: metadata, status, apiVersion and kind cannot be owned by the service cluster; name a field of the object's content, such as spec.replicas"
	// +kubebuilder:validation:XValidation:rule="self.all(p, !p.matches('(^|[.])[0-9]+([.]|$)'))",message="spec.serviceOwnedPaths: a path cannot index into a list (a list is one value); name the whole list instead, such as spec.ports"
	ServiceOwnedPaths []string `json:"serviceOwnedPaths,omitempty"`

	// ConsumerDeletionPolicy says whether a consumer may keep the local copy
	// of a kcp object it deletes, by annotating the kcp object with
	// ferry.dev/deletion-policy: Orphan before deleting it.
	//
	//   - Ignore (default): the annotation is ignored: the copy is deleted
	//     as usual, and a Warning Event (DeletionPolicyIgnored) on the kcp
	//     object tells the consumer so.
	//   - Allow: the copy stays in the service cluster, no longer ferry's:
	//     its ferry labels and annotations are removed and it is annotated
	//     ferry.dev/orphaned-from (naming the kcp object); the broker then
	//     releases its finalizer. Related copies ferry wrote next to it stay
	//     too. ferry never writes or deletes the orphaned object again; a
	//     new kcp object at the same name finds its place taken (a conflict).
	//
	// Ignore is the default because the copies are the service owner's
	// resources: whether a consumer may leave one behind (still running,
	// still billed) is the service owner's decision. The annotation only
	// counts for a deletion in kcp; an object leaving spec.filter loses
	// its copy whatever it says.
	// +optional
	// +kubebuilder:default=Ignore
	ConsumerDeletionPolicy ConsumerDeletionPolicy `json:"consumerDeletionPolicy,omitempty"`
	// ConflictPolicy says what the edge does when an object it did not
	// create exists at the local name the naming rules give a kcp object
	// (adopt_types.go). Fail (default) refuses the kcp object and leaves the
	// local object untouched; Adopt takes the local object over in place.
	// +optional
	// +kubebuilder:default=Fail
	ConflictPolicy ConflictPolicy `json:"conflictPolicy,omitempty"`

	// Adopt takes over the copies another sync agent made of this
	// resource's kcp objects, in place (adopt_types.go). Unset: none.
	// +optional
	Adopt *AdoptSpec `json:"adopt,omitempty"`
}

// DeletionPolicy is Orphan or Delete.
// +kubebuilder:validation:Enum=Orphan;Delete
type DeletionPolicy string

// Deletion policies.
const (
	DeletionPolicyOrphan DeletionPolicy = "Orphan"
	DeletionPolicyDelete DeletionPolicy = "Delete"
)

// PublishedResourceFinalizer is the edge's finalizer on PublishedResources:
// it is removed once the broker released the objects (see DeletionPolicy).
const PublishedResourceFinalizer = "ferry.dev/release-objects"

// EffectiveDeletionPolicy is spec.deletionPolicy with its default (Orphan)
// applied; anything but Delete means Orphan.
func (s *PublishedResourceSpec) EffectiveDeletionPolicy() DeletionPolicy {
	if s.DeletionPolicy == DeletionPolicyDelete {
		return DeletionPolicyDelete
	}
	return DeletionPolicyOrphan
}

// SyncDisabled tells whether the spec disables object synchronization.
func (s *PublishedResourceSpec) SyncDisabled() bool {
	return s.Synchronization != nil && s.Synchronization.Enabled != nil && !*s.Synchronization.Enabled
}

// SourceResource names a CRD on the service cluster and the versions to
// publish: version, versions, or neither — then every version the CRD
// serves (as api-syncagent does).
// +kubebuilder:validation:XValidation:rule="!(has(self.version) && has(self.versions))",message="set at most one of version and versions (neither publishes every version the CRD serves)"
type SourceResource struct {
	// APIGroup of the CRD, e.g. "cert-manager.io", or of a built-in kind
	// of the service cluster (e.g. "rbac.authorization.k8s.io"; "" is the
	// core group of ConfigMap). A kind no CRD defines is published through
	// the schema the service cluster's OpenAPI v3 discovery gives it.
	// +required
	APIGroup string `json:"apiGroup"`

	// Version publishes a single version, e.g. "v1". Neither version nor
	// versions: every served version.
	// +optional
	// +kubebuilder:validation:MinLength=1
	Version string `json:"version,omitempty"`

	// Versions publishes several versions of a multi-version CRD.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +listType=set
	Versions []string `json:"versions,omitempty"`

	// Kind of the CRD or built-in kind, e.g. "Certificate" or "ConfigMap".
	// +required
	// +kubebuilder:validation:MinLength=1
	Kind string `json:"kind"`
}

// ResourceScope is Namespaced or Cluster.
// +kubebuilder:validation:Enum=Namespaced;Cluster
type ResourceScope string

// Resource scopes.
const (
	NamespaceScoped ResourceScope = "Namespaced"
	ClusterScoped   ResourceScope = "Cluster"
)

// ResourceProjection describes how the resource is presented in kcp. Unset
// fields keep the CRD's values.
// +kubebuilder:validation:XValidation:rule="!(has(self.version) && has(self.versions))",message="set at most one of projection.version and projection.versions"
type ResourceProjection struct {
	// Version renames the published version; only with a single published
	// version.
	// +optional
	// +kubebuilder:validation:Pattern=`^v[0-9]+((alpha|beta)[0-9]+)?$`
	Version string `json:"version,omitempty"`

	// Versions renames published versions: source version → kcp version.
	// +optional
	Versions map[string]string `json:"versions,omitempty"`

	// Kind in kcp. The singular name becomes its lowercase form, and the
	// plural is derived from it unless Plural is set.
	// +optional
	// +kubebuilder:validation:Pattern=`^[A-Z][A-Za-z0-9]*$`
	// +kubebuilder:validation:MaxLength=63
	Kind string `json:"kind,omitempty"`

	// Plural resource name in kcp; a lowercase DNS label (kcp serves no
	// other).
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:XValidation:rule="self.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",messageExpression="self.lowerAscii().matches('^[a-z]([-a-z0-9]*[a-z0-9])?$') ? 'kcp serves only lowercase resource names: write ' + self.lowerAscii() : 'projection.plural must be a lowercase DNS label (letters, digits and -, starting with a letter), e.g. ' + self.lowerAscii().replace('_', '-').replace('.', '-')"
	Plural string `json:"plural,omitempty"`

	// Group is not supported: ferry serves every published resource in the
	// APIExport's group (the APIExport's name). It is in the schema so that
	// a document setting it (api-syncagent's projection.group) is refused
	// with that message instead of the field being dropped silently.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="false",message="projection.group is not supported: ferry serves every published resource in the API group of the APIExport (its name); remove projection.group"
	Group string `json:"group,omitempty"`

	// APIGroup is not supported, like Group (the seeds' spelling).
	// +optional
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="false",message="projection.apiGroup is not supported: ferry serves every published resource in the API group of the APIExport (its name); remove projection.apiGroup"
	APIGroup string `json:"apiGroup,omitempty"`

	// ShortNames replace the CRD's short names; an empty list removes them,
	// null or absent keeps them.
	// +optional
	// +nullable
	// +listType=set
	ShortNames []string `json:"shortNames"` // no omitempty: [] (remove all) differs from unset

	// Categories replace the CRD's categories; an empty list removes them,
	// null or absent keeps them.
	// +optional
	// +nullable
	// +listType=set
	Categories []string `json:"categories"` // no omitempty: [] (remove all) differs from unset

	// Scope changes the scope; use with care, objects may need mutations.
	// +optional
	Scope ResourceScope `json:"scope,omitempty"`
}

// ResourceNaming controls local names. Placeholders: $remoteClusterName,
// $remoteNamespace, $remoteNamespaceHash, $remoteName, $remoteNameHash (hash
// = first 20 hex characters of the SHA-1).
type ResourceNaming struct {
	// Namespace of local copies; default "$remoteClusterName".
	// +optional
	Namespace string `json:"namespace,omitempty"`
	// Name of local copies; default "$remoteNamespaceHash-$remoteNameHash".
	// +optional
	Name string `json:"name,omitempty"`
	// AllowExistingNamespaces lets local copies land in namespaces that
	// exist already and that ferry did not create (e.g. a rule
	// "$remoteNamespace" mapping onto the service cluster's own
	// namespaces). Off by default: the edge writes a workspace's objects
	// only into namespaces it created for that workspace (labelled
	// ferry.dev/workspace) or into the one namespace a static rule names,
	// so neither a consumer nor a misbehaving broker can make it write into
	// kube-system or another tenant's namespace. A namespace ferry created
	// for another workspace is refused even when this is set.
	// +optional
	AllowExistingNamespaces bool `json:"allowExistingNamespaces,omitempty"`
	// AllowNameCollisions accepts naming rules that can map objects of two
	// workspaces onto one local object: neither rule contains the
	// workspace ($remoteClusterName, or .ClusterName / .WorkspacePath in a
	// template), and the namespace is static, or one of the service
	// cluster's own (allowExistingNamespaces), or the copies are
	// cluster-scoped. Such rules are refused (Published False,
	// NamingInvalid) unless this is set. With it, the first workspace's
	// object keeps its copy and every other object that maps onto the same
	// local name is refused with a CONFLICT Event on the kcp object; the
	// edge never overwrites or deletes an object that is not its copy of
	// exactly that kcp object.
	// +optional
	AllowNameCollisions bool `json:"allowNameCollisions,omitempty"`
}

// ResourceMutationSpec lists mutations by direction.
type ResourceMutationSpec struct {
	// Spec mutations apply to objects going from kcp to the service cluster.
	// They run on the copy as it will be written: its metadata.namespace and
	// metadata.name are the local ones (after spec.naming) and its
	// ferry.dev/remote-* labels and annotations name the kcp object and its
	// workspace (ferry.dev/remote-cluster), so related names can be made
	// unique per copy (e.g. spec.secretName from the local name).
	// +optional
	// +kubebuilder:validation:MaxItems=64
	Spec []ResourceMutation `json:"spec,omitempty"`
	// Status mutations apply to status going from the service cluster to kcp.
	// +optional
	// +kubebuilder:validation:MaxItems=64
	Status []ResourceMutation `json:"status,omitempty"`
}

// ResourceMutation is one mutation step: exactly one field is set.
// +kubebuilder:validation:XValidation:rule="has(self.rudi) || (has(self.delete) ? 1 : 0) + (has(self.regex) ? 1 : 0) + (has(self.template) ? 1 : 0) + (has(self.cel) ? 1 : 0) == 1",message="a mutation sets exactly one of delete, regex, template and cel"
type ResourceMutation struct {
	// Delete removes the field at Path.
	// +optional
	Delete *DeleteMutation `json:"delete,omitempty"`
	// Regex rewrites the string at Path.
	// +optional
	Regex *RegexMutation `json:"regex,omitempty"`
	// Template sets Path to a Go template's output.
	// +optional
	Template *TemplateMutation `json:"template,omitempty"`
	// CEL sets Path to a CEL expression's value.
	// +optional
	CEL *CELMutation `json:"cel,omitempty"`
	// Rudi is not supported (the seeds' Rudi scripts): it is in the schema
	// so that a document using it is refused with what to write instead.
	// +optional
	// +kubebuilder:validation:XValidation:rule="false",message="Rudi is not supported: write it as cel (a cel mutation with path and expression, e.g. path: metadata.name, expression: object.metadata.name + '-foo')"
	Rudi *RudiMutation `json:"rudi,omitempty"`
}

// RudiMutation is the seeds' Rudi script step, refused at admission.
type RudiMutation struct {
	// Script is the Rudi program.
	// +optional
	// +kubebuilder:validation:MaxLength=65536
	Script string `json:"script,omitempty"`
}

// DeleteMutation removes a field.
type DeleteMutation struct {
	// Path of the field.
	// +kubebuilder:validation:MinLength=1
	Path string `json:"path"`
}

// RegexMutation rewrites a string field.
type RegexMutation struct {
	// Path of the field.
	// +kubebuilder:validation:MinLength=1
	Path string `json:"path"`
	// Pattern to match; empty replaces the whole value.
	// +optional
	Pattern string `json:"pattern,omitempty"`
	// Replacement, which may refer to groups as $1 or ${1} (Go) or as \1
	// (the seeds' and api-syncagent's spelling; \\ is a literal backslash).
	// +optional
	Replacement string `json:"replacement,omitempty"`
}

// TemplateMutation sets a field to a Go template's output.
type TemplateMutation struct {
	// Path of the field.
	// +kubebuilder:validation:MinLength=1
	Path string `json:"path"`
	// Template with the local and remote objects available.
	// +kubebuilder:validation:MinLength=1
	Template string `json:"template"`
}

// CELMutation sets a field to a CEL expression's value.
type CELMutation struct {
	// Path of the field.
	// +kubebuilder:validation:MinLength=1
	Path string `json:"path"`
	// Expression in CEL.
	// +kubebuilder:validation:MinLength=1
	Expression string `json:"expression"`
}

// SynchronizationSpec controls object synchronization.
type SynchronizationSpec struct {
	// Enabled syncs objects; false publishes the schema only. Default true.
	// +optional
	// +kubebuilder:default=true
	Enabled *bool `json:"enabled,omitempty"`
}

// PublishedResourceStatus reports whether and as what the resource is
// published.
type PublishedResourceStatus struct {
	// ObservedGeneration is the generation the status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// ResourceSchemaName is the APIResourceSchema in kcp.
	// +optional
	ResourceSchemaName string `json:"resourceSchemaName,omitempty"`

	// ProjectedKind is the kind as served in kcp.
	// +optional
	ProjectedKind string `json:"projectedKind,omitempty"`

	// ServedResource is group/version/resource as served in kcp.
	// +optional
	ServedResource string `json:"servedResource,omitempty"`

	// Conditions: Published, and Synced (whether the edge can watch the
	// local copies; False with LocalWatchFailed while it cannot).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// Objects counts this resource's objects on the edge, written with the
	// Synced condition (whose message names the latest refusal).
	// +optional
	Objects *ObjectCounts `json:"objects,omitempty"`
}

// ObjectCounts counts a PublishedResource's objects on its edge.
type ObjectCounts struct {
	// Synced is how many local copies of kcp objects exist in the service
	// cluster.
	Synced int32 `json:"synced"`
	// Failing is how many kcp objects the edge currently refuses for good,
	// other than conflicts: a mutation or template that fails on the
	// object, a place the edge may not write, the service cluster refusing
	// the copy. Each has a SyncFailed Event on the kcp object; a refusal
	// the broker retries (the service cluster unreachable, a cache not
	// ready) is not counted.
	Failing int32 `json:"failing"`
	// Conflicting is how many kcp objects the edge refuses because an
	// object that is not their copy holds their local name
	// (spec.conflictPolicy Fail, or an object Adopt may not take).
	Conflicting int32 `json:"conflicting"`
	// RelatedFailing is how many related objects the edge refuses: a
	// kcp-origin one it refuses for good (a place it may not write, the
	// service cluster refusing it), a service-origin one in a place it may
	// not read or shared by several primaries. A Related* Event on the
	// primary in kcp says which and why.
	RelatedFailing int32 `json:"relatedFailing"`
}

// Condition types and reasons of a PublishedResource.
const (
	// ConditionPublished is True once the schema is part of the APIExport.
	ConditionPublished = "Published"
	// ConditionVirtualWorkspaceReady is True while the broker watches the
	// APIExport's virtual workspace at every endpoint (kcp shard), so kcp
	// objects of the resource reach the edge from every bound workspace;
	// False while kcp lists no virtual workspace yet (no workspace binds the
	// APIExport: ReasonWaitingForBinding) or some endpoint cannot be reached
	// (ReasonEndpointsUnreachable); Unknown until the broker reported.
	ConditionVirtualWorkspaceReady = "VirtualWorkspaceReady"

	ReasonVirtualWorkspaceReady = "Watching"
	ReasonWaitingForBinding     = "WaitingForBinding"
	ReasonEndpointsUnreachable  = "EndpointsUnreachable"
	ReasonExportStatusUnknown   = "ExportStatusUnknown"

	// ConditionSynced is True while the edge watches the resource's local
	// copies, False (LocalWatchFailed) while it cannot list them, e.g. for
	// lack of RBAC; its objects' intents are answered NOT_READY meanwhile.
	ConditionSynced = "Synced"

	ReasonPublished         = "Published"
	ReasonPending           = "Pending"
	ReasonCRDNotFound       = "CRDNotFound"
	ReasonVersionNotFound   = "VersionNotFound"
	ReasonProjectionInvalid = "ProjectionInvalid"
	ReasonSchemaConflict    = "SchemaConflict"
	ReasonBrokerUnavailable = "BrokerUnavailable"
	ReasonBrokerRefused     = "BrokerRefused"
	ReasonTooLarge          = "TooLarge"
	ReasonNamingInvalid     = "NamingInvalid"
	ReasonMutationInvalid   = "MutationInvalid"
	ReasonRelatedInvalid    = "RelatedInvalid"
	// ReasonFilterInvalid: spec.filter cannot be used (e.g. filter.namespace
	// is neither a namespace name nor a label selector).
	ReasonFilterInvalid    = "FilterInvalid"
	ReasonWatching         = "Watching"
	ReasonLocalWatchFailed = "LocalWatchFailed"
	// ReasonProjectionChanged: the projection now yields another served
	// resource than the one published (status.servedResource). The edge
	// keeps syncing the published one and does not publish the change
	// (admission refuses it where the CRD's validation rules are served).
	ReasonProjectionChanged = "ProjectionChanged"
	// ReasonLocalResourceClaimed: an older PublishedResource publishes the
	// same CRD; this one is neither published nor synced until it is gone.
	ReasonLocalResourceClaimed = "LocalResourceClaimed"
	// ReasonReleasing: the PublishedResource is being deleted (or its
	// synchronization disabled) and the edge waits for its local copies to
	// go or for the broker to release the objects in kcp.
	ReasonReleasing = "Releasing"
	// ReasonDisabled: synchronization is disabled; the objects are released.
	ReasonDisabled = "SyncDisabled"
)

// +kubebuilder:object:root=true

// PublishedResourceList is a list of PublishedResources.
type PublishedResourceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PublishedResource `json:"items"`
}

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
	// synced along with it (e.g. a Secret with credentials).
	// +optional
	// +listType=map
	// +listMapKey=identifier
	// +kubebuilder:validation:MaxItems=32
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
// publish. Exactly one of version and versions is set.
// +kubebuilder:validation:XValidation:rule="has(self.version) != has(self.versions)",message="exactly one of version and versions must be set"
type SourceResource struct {
	// APIGroup of the CRD, e.g. "cert-manager.io".
	// +required
	// +kubebuilder:validation:MinLength=1
	APIGroup string `json:"apiGroup"`

	// Version publishes a single version, e.g. "v1".
	// +optional
	// +kubebuilder:validation:MinLength=1
	Version string `json:"version,omitempty"`

	// Versions publishes several versions of a multi-version CRD.
	// +optional
	// +kubebuilder:validation:MinItems=1
	// +listType=set
	Versions []string `json:"versions,omitempty"`

	// Kind of the CRD, e.g. "Certificate".
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

	// Plural resource name in kcp; a lowercase DNS label.
	// +optional
	// +kubebuilder:validation:Pattern=`^[a-z]([-a-z0-9]*[a-z0-9])?$`
	// +kubebuilder:validation:MaxLength=63
	Plural string `json:"plural,omitempty"`

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

// ResourceFilter selects kcp objects by labels.
type ResourceFilter struct {
	// Namespace selects by the labels of the object's namespace in kcp.
	// +optional
	Namespace *metav1.LabelSelector `json:"namespace,omitempty"`
	// Resource selects by the object's own labels.
	// +optional
	Resource *metav1.LabelSelector `json:"resource,omitempty"`
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
// +kubebuilder:validation:XValidation:rule="(has(self.delete) ? 1 : 0) + (has(self.regex) ? 1 : 0) + (has(self.template) ? 1 : 0) + (has(self.cel) ? 1 : 0) == 1",message="a mutation sets exactly one of delete, regex, template and cel"
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
	// Replacement, which may refer to groups as $1.
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
}

// Condition types and reasons of a PublishedResource.
const (
	// ConditionPublished is True once the schema is part of the APIExport.
	ConditionPublished = "Published"
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
	ReasonWatching          = "Watching"
	ReasonLocalWatchFailed  = "LocalWatchFailed"
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

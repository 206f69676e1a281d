package v1alpha1

// LocalEditsPolicy is how the edge treats edits made in the service cluster
// to fields of a local copy that the kcp object sets (spec.localEdits).
// +kubebuilder:validation:Enum=Repair;Keep
type LocalEditsPolicy string

// Local edits policies.
const (
	// LocalEditsRepair: kcp wins at once. A local edit of a field the kcp
	// object sets is undone within seconds.
	LocalEditsRepair LocalEditsPolicy = "Repair"
	// LocalEditsKeep: a local edit of a field the kcp object sets survives
	// until the kcp object changes that field (three-way, as kubectl apply
	// and api-syncagent do).
	LocalEditsKeep LocalEditsPolicy = "Keep"
)

// EffectiveLocalEdits is spec.localEdits with its default (Repair) applied.
func (s *PublishedResourceSpec) EffectiveLocalEdits() LocalEditsPolicy {
	if s.LocalEdits == LocalEditsKeep {
		return LocalEditsKeep
	}
	return LocalEditsRepair
}

// ReasonServiceOwnedPathsInvalid: spec.serviceOwnedPaths names a path
// ferry cannot hand over to the service cluster.
const ReasonServiceOwnedPathsInvalid = "ServiceOwnedPathsInvalid"

// ConsumerDeletionPolicy says whether the consumer's per-object deletion
// policy is honoured (spec.consumerDeletionPolicy).
// +kubebuilder:validation:Enum=Allow;Ignore
type ConsumerDeletionPolicy string

// Consumer deletion policies.
const (
	// ConsumerDeletionAllow honours AnnotationDeletionPolicy on kcp objects.
	ConsumerDeletionAllow ConsumerDeletionPolicy = "Allow"
	// ConsumerDeletionIgnore ignores it (the copy is deleted) and tells the
	// consumer so with an Event on the kcp object.
	ConsumerDeletionIgnore ConsumerDeletionPolicy = "Ignore"
)

// AnnotationDeletionPolicy, on a kcp object, is the consumer's deletion
// policy for that object's local copy. Its one value, DeletionOrphan, keeps
// the copy in the service cluster when the kcp object is deleted, if the
// PublishedResource allows it (spec.consumerDeletionPolicy Allow).
const AnnotationDeletionPolicy = "ferry.dev/deletion-policy"

// DeletionOrphan is AnnotationDeletionPolicy's value that keeps the copy.
const DeletionOrphan = "Orphan"

// AnnotationOrphanedFrom, on a local object, names the kcp object it was
// the copy of until that object was deleted with AnnotationDeletionPolicy
// Orphan: "<logical cluster>|<resource>.<group>|<namespace>/<name>|<uid>".
// ferry's labels and other annotations are gone from it: it is no copy any
// more, and ferry never writes or deletes it again.
const AnnotationOrphanedFrom = "ferry.dev/orphaned-from"

// ConsumerOrphanAllowed tells whether the consumer's Orphan annotation is
// honoured (spec.consumerDeletionPolicy Allow; the default is Ignore).
func (s *PublishedResourceSpec) ConsumerOrphanAllowed() bool {
	return s.ConsumerDeletionPolicy == ConsumerDeletionAllow
}

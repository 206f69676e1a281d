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

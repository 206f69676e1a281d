package v1alpha1

// ConflictPolicy is Fail or Adopt.
//
// A conflict is a local object at the name and namespace spec.naming gives
// a kcp object that is not ferry's copy of it: the service owner made it,
// or a tool ferry replaces did. Fail is the default because the local
// objects are often real resources (a database, a bucket): taking one over
// means ferry writes the kcp object's content into it, which must be the
// service owner's decision. Either way the edge never deletes or recreates
// the local object.
//
//   - Fail: the kcp object is refused with a CONFLICT (a SyncFailed Event on
//     it) and counted in status.objects.conflicting; the local object is untouched.
//   - Adopt: the local object is taken over in place (same UID): ferry's
//     labels and annotations are set on it, the kcp object's content is
//     applied to it (fields ferry does not set stay as they are), and the
//     annotation ferry.dev/adopted records when and from what; an
//     Adopted Event is recorded on it. Containment still holds: an object
//     in a namespace the edge may not write (see
//     spec.naming.allowExistingNamespaces), or ferry's copy of another kcp
//     object, is never adopted (it stays a conflict).
//
// +kubebuilder:validation:Enum=Fail;Adopt
type ConflictPolicy string

// Conflict policies.
const (
	ConflictPolicyFail  ConflictPolicy = "Fail"
	ConflictPolicyAdopt ConflictPolicy = "Adopt"
)

// EffectiveConflictPolicy is spec.conflictPolicy with its default (Fail)
// applied; anything but Adopt means Fail.
func (s *PublishedResourceSpec) EffectiveConflictPolicy() ConflictPolicy {
	if s.ConflictPolicy == ConflictPolicyAdopt {
		return ConflictPolicyAdopt
	}
	return ConflictPolicyFail
}

// AdoptSource names the sync agent whose copies are adopted.
// +kubebuilder:validation:Enum=APISyncAgent
type AdoptSource string

// Adopt sources.
const (
	// AdoptFromAPISyncAgent adopts the copies kcp-dev/api-syncagent made.
	AdoptFromAPISyncAgent AdoptSource = "APISyncAgent"
)

// AdoptSpec takes over, in place, the copies another sync agent made of this
// resource's kcp objects, when ferry replaces it.
//
// Why a field of its own and not a value of conflictPolicy: the other
// agent's copies are proven to be copies of exactly one kcp object (its
// labels and annotations name the workspace, namespace and name), they may
// sit where the other agent's naming rules put them rather than where
// ferry's would, and taking them over also changes kcp (the other agent's
// finalizer on the kcp object is replaced with ferry's) and deletes the
// other agent's bookkeeping (its last-known-state Secrets). An object at
// the copy's name that carries no such proof is a conflict, decided by
// conflictPolicy. Switching adoption on is the service owner's explicit
// step of a migration, naming the agent, so copies of a second api-syncagent
// on the same cluster (another agentName) are never taken.
//
// api-syncagent:
//   - a local object is its copy of a kcp object when its labels
//     syncagent.kcp.io/agent-name (= agentName) and
//     syncagent.kcp.io/remote-object-cluster (= the kcp object's logical
//     cluster), and its annotations syncagent.kcp.io/remote-object-namespace
//     and -name, name exactly that kcp object (its name and namespace hash
//     labels agree). Its labels carry no kcp UID: the proof is by name, and
//     the copy of an earlier kcp object of the same name is adopted by the
//     object that replaced it, as api-syncagent itself would.
//   - it is adopted where it is (ferry keeps the local place; the
//     namespace must be one the edge may write, see
//     spec.naming.allowExistingNamespaces: api-syncagent's namespaces are
//     not ferry's), with the same UID, never deleted or recreated.
//   - its labels and annotations are left on it: they block nothing, and
//     they let api-syncagent find its copies again after a rollback.
//   - the broker replaces the finalizer syncagent.kcp.io/cleanup on the kcp
//     object with ferry's once the edge reports the adoption.
//   - api-syncagent's last-known-state Secret of the adopted object (in
//     stateNamespace, named and labelled for exactly that kcp object) is
//     deleted.
//   - a kcp object deleted before its copy was adopted (only api-syncagent's
//     finalizer on it) has api-syncagent's copy of exactly that object
//     deleted, and api-syncagent's finalizer released.
//
// +kubebuilder:validation:XValidation:rule="self.from != 'APISyncAgent' || has(self.agentName)",message="adopt.from APISyncAgent needs adopt.agentName: the value of api-syncagent's --agent-name (its label syncagent.kcp.io/agent-name on the copies)"
type AdoptSpec struct {
	// From is the sync agent whose copies are adopted: APISyncAgent.
	// +required
	From AdoptSource `json:"from"`

	// AgentName is the other agent's name as its copies are labelled
	// (api-syncagent: --agent-name, the label syncagent.kcp.io/agent-name).
	// Only that agent's copies are adopted.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$`
	AgentName string `json:"agentName,omitempty"`

	// StateNamespace is the namespace of the service cluster where the other
	// agent keeps its last-known-state Secrets (api-syncagent: its
	// --namespace). The Secret of each adopted object is deleted there.
	// Empty: no Secret is deleted (remove them by hand).
	// +optional
	// +kubebuilder:validation:MaxLength=63
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`
	StateNamespace string `json:"stateNamespace,omitempty"`
}

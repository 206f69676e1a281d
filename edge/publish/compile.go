package publish

import (
	"errors"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/edge/replication"
	"github.com/ferry-dev/ferry/pkg/mutation"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/projection"
	"github.com/ferry-dev/ferry/pkg/templating"
)

// The pure steps of publishing a PublishedResource: they read only the
// PublishedResource and its CRD, so the controller and `ferry-edge render`
// (offline) refuse the same documents with the same condition.

// Refusal is why a PublishedResource is not published: the reason and
// message of its Published condition.
type Refusal struct {
	Reason  string
	Message string
}

func (r *Refusal) Error() string { return r.Reason + ": " + r.Message }

// Project projects pr's CRD into group (the APIExport's name). A refusal
// is a *Refusal; any other error is worth retrying.
func Project(pr *ferryv1alpha1.PublishedResource, crd *apiextensionsv1.CustomResourceDefinition, group string) (*projection.Result, error) {
	proj, err := projection.Project(&pr.Spec, crd, group)
	var pe *projection.Error
	if errors.As(err, &pe) {
		return nil, &Refusal{Reason: pe.Reason, Message: pe.Message}
	}
	return proj, err
}

// CompileRules compiles pr's naming rules and mutations into the parts of
// a replication.Published they shape (Naming, SpecMutator, StatusMutator,
// ServiceOwned, AllowExistingNamespaces); a refusal names the invalid rule.
func CompileRules(pr *ferryv1alpha1.PublishedResource, crd *apiextensionsv1.CustomResourceDefinition) (*replication.Published, *Refusal) {
	if pr.Spec.Filter != nil {
		// Admission cannot check filter.namespace's type (a string or a
		// selector, see NamespaceFilter): refused here instead.
		if err := pr.Spec.Filter.Namespace.Validate(); err != nil {
			return nil, &Refusal{Reason: ferryv1alpha1.ReasonFilterInvalid, Message: err.Error()}
		}
	}
	rules, err := naming.Compile(pr.Spec.Naming)
	if err != nil {
		return nil, &Refusal{Reason: ferryv1alpha1.ReasonNamingInvalid, Message: err.Error()}
	}
	// Templates are tried on a sample object of the kind: one naming data
	// the model lacks would fail on every object, so it is refused here.
	sampleAPIVersion := crd.Spec.Group + "/" + localResource(crd).Version
	if crd.Spec.Group == "" {
		sampleAPIVersion = localResource(crd).Version
	}
	namespaced := crd.Spec.Scope == apiextensionsv1.NamespaceScoped
	sample := templating.SampleData(sampleAPIVersion, crd.Spec.Names.Kind, namespaced)
	if err := rules.Check(sampleAPIVersion, crd.Spec.Names.Kind, namespaced); err != nil {
		return nil, &Refusal{Reason: ferryv1alpha1.ReasonNamingInvalid, Message: err.Error()}
	}
	// Schema-only publishing makes no local copy: no two workspaces can
	// meet on one.
	if msg := namingCollisionRefusal(pr.Spec.Naming, rules, namespaced); msg != "" && !pr.Spec.SyncDisabled() {
		return nil, &Refusal{Reason: ferryv1alpha1.ReasonNamingInvalid, Message: msg}
	}
	var specMuts, statusMuts []ferryv1alpha1.ResourceMutation
	if m := pr.Spec.Mutation; m != nil {
		specMuts, statusMuts = m.Spec, m.Status
	}
	specMutator, err := mutation.Compile("spec.mutation.spec", specMuts)
	var statusMutator *mutation.Mutator
	if err == nil {
		statusMutator, err = mutation.Compile("spec.mutation.status", statusMuts)
	}
	if err == nil {
		err = errors.Join(specMutator.Check(sample), statusMutator.Check(sample))
	}
	if err != nil {
		return nil, &Refusal{Reason: ferryv1alpha1.ReasonMutationInvalid, Message: err.Error()}
	}
	serviceOwned, err := replication.CompileServiceOwned(pr.Spec.ServiceOwnedPaths)
	if err != nil {
		return nil, &Refusal{Reason: ferryv1alpha1.ReasonServiceOwnedPathsInvalid, Message: err.Error()}
	}
	return &replication.Published{
		Naming: rules, SpecMutator: specMutator, StatusMutator: statusMutator, ServiceOwned: serviceOwned,
		AllowExistingNamespaces: pr.Spec.Naming != nil && pr.Spec.Naming.AllowExistingNamespaces,
	}, nil
}

// NewPublished is how the sync engine maps pr's objects served as proj
// onto crd, with the rules CompileRules compiled (and related entries) in
// compiled.
func NewPublished(pr *ferryv1alpha1.PublishedResource, crd *apiextensionsv1.CustomResourceDefinition,
	proj *projection.Result, revision string, compiled *replication.Published,
) *replication.Published {
	served := proj.Resource
	localVersion := ""
	for src, dst := range proj.VersionMap {
		if dst == served.Version {
			localVersion = src
		}
	}
	return &replication.Published{
		Name:          pr.Name,
		Remote:        served,
		Local:         schema.GroupVersionResource{Group: crd.Spec.Group, Version: localVersion, Resource: crd.Spec.Names.Plural},
		LocalKind:     crd.Spec.Names.Kind,
		Namespaced:    crd.Spec.Scope == apiextensionsv1.NamespaceScoped,
		HasStatus:     hasStatusSubresource(crd, projection.SelectedVersions(&pr.Spec.Resource, crd)),
		Naming:        compiled.Naming,
		SpecMutator:   compiled.SpecMutator,
		StatusMutator: compiled.StatusMutator,
		Related:       compiled.Related,
		Revision:      revision,
		Shape:         copyShape(pr, crd),

		AllowExistingNamespaces: compiled.AllowExistingNamespaces,
		KeepLocalEdits:          pr.Spec.EffectiveLocalEdits() == ferryv1alpha1.LocalEditsKeep,
		ServiceOwned:            compiled.ServiceOwned,
		ConflictPolicy:          pr.Spec.EffectiveConflictPolicy(),
		Adopt:                   pr.Spec.Adopt.DeepCopy(),
	}
}

package replication

import (
	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/fieldpath"
	"github.com/ferry-dev/ferry/pkg/mutation"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/related"
)

// Published is a PublishedResource whose objects are synced: how a kcp-side
// resource maps onto the local one.
type Published struct {
	// Name of the PublishedResource.
	Name string
	// Remote is the resource as served in kcp (the broker's intents use it).
	Remote schema.GroupVersionResource
	// Local is the CRD's resource and version matching Remote's version.
	Local schema.GroupVersionResource
	// LocalKind is the CRD's kind.
	LocalKind string
	// Namespaced tells whether the local resource is namespaced.
	Namespaced bool
	// HasStatus tells whether status is reported back.
	HasStatus bool
	// Naming are the compiled naming rules.
	Naming *naming.Rules
	// SpecMutator rewrites objects going to the service cluster.
	SpecMutator *mutation.Mutator
	// StatusMutator rewrites status going back to kcp.
	StatusMutator *mutation.Mutator
	// Related are the compiled related[] entries.
	Related []Related
	// AllowExistingNamespaces admits namespaces ferry did not create
	// (spec.naming.allowExistingNamespaces).
	AllowExistingNamespaces bool
	// Revision identifies the publish this was derived from; a registration
	// with the same name and revision is unchanged.
	Revision string
	// Shape identifies the settings that shape a copy beyond the kcp
	// object's content (spec mutations, naming, the local resource): a copy
	// applied under another shape is applied again, though its kcp content
	// did not change.
	Shape string
	// KeepLocalEdits keeps local edits of fields the kcp object sets until
	// kcp changes them (spec.localEdits Keep, localedits.go); otherwise kcp
	// wins at once.
	KeepLocalEdits bool
	// ServiceOwned are the paths ferry sets when it creates a copy and
	// never applies again (spec.serviceOwnedPaths, serviceowned.go).
	ServiceOwned []fieldpath.Path
	// ConflictPolicy is spec.conflictPolicy, its default applied: Adopt
	// takes over an object nobody marked at a copy's place (adopt.go).
	ConflictPolicy ferryv1alpha1.ConflictPolicy
	// Adopt is spec.adopt: another sync agent's copies to take over in
	// place (syncagent.go); nil: none.
	Adopt *ferryv1alpha1.AdoptSpec
}

// LocalGVK is the local group/version/kind.
func (p *Published) LocalGVK() schema.GroupVersionKind {
	return p.Local.GroupVersion().WithKind(p.LocalKind)
}

// placement is where objects of workspace may land (placement.go).
func (p *Published) placement(workspace string) placement {
	pl := placement{workspace: workspace, allowExisting: p.AllowExistingNamespaces, primary: true}
	if ns, ok := p.Naming.StaticNamespace(); ok {
		pl.static = []string{ns}
	}
	return pl
}

// Related is a related[] entry with its resource in the service cluster.
type Related struct {
	*related.Reference
	// Local is the related kind's resource as the service cluster serves it.
	Local schema.GroupVersionResource
}

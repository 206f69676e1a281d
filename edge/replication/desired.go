package replication

import (
	"fmt"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ferry-dev/ferry/pkg/mutation"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/objects"
)

// Copy says where and from what a local copy is written.
type Copy struct {
	// Agent is the edge's agent name (the ferry.dev/agent label).
	Agent string
	// Remote is the kcp object the copy belongs to.
	Remote naming.Remote
	// Namespace and Name are where the copy goes (naming rules, or where an
	// existing copy already is).
	Namespace, Name string
	// Existing is the current local copy's content (nil for a new one);
	// mutations may read it.
	Existing map[string]any
	// ResourceVersion is the kcp resourceVersion applied (an annotation).
	ResourceVersion string
	// ContentHash is the broker's hash of the desired state ("" when unknown).
	ContentHash string
}

// DesiredCopy is the local copy of obj (the kcp object as the broker sends
// it) that the edge applies: the desired state re-typed to the local kind,
// spec mutations applied, then ferry's identity labels and bookkeeping
// annotations set. It reads nothing but its arguments, so `ferry-edge
// render` shows exactly what the engine writes.
func (p *Published) DesiredCopy(obj *unstructured.Unstructured, c Copy) (*unstructured.Unstructured, error) {
	local := objects.DesiredState(obj)
	objects.Retype(local, p.LocalGVK())
	identify := func() {
		local.SetNamespace(c.Namespace)
		local.SetName(c.Name)
		local.SetLabels(objects.MergeStrings(objects.MergeStrings(local.GetLabels(), naming.Labels(c.Agent, c.Remote)), p.ownerLabels()))
	}
	// Mutations see where the copy goes and which workspace it comes from
	// (metadata.namespace/name are the local ones, the ferry.dev/remote-*
	// labels and annotations are set), so a service owner can derive
	// unique names of related objects from them.
	identify()
	local.SetAnnotations(objects.MergeStrings(local.GetAnnotations(), naming.Annotations(c.Remote)))
	if err := p.SpecMutator.Apply(local.Object, mutation.Objects{Local: c.Existing, Remote: obj.Object}); err != nil {
		return nil, fmt.Errorf("mutation failed: %w", err)
	}
	// Identity and bookkeeping are set after mutations, which cannot change them.
	identify()
	ann := objects.MergeStrings(local.GetAnnotations(), naming.Annotations(c.Remote))
	ann[naming.AnnotationResourceVersion] = c.ResourceVersion
	if c.ContentHash != "" {
		ann[naming.AnnotationContentHash] = c.ContentHash
	}
	if p.Shape != "" {
		ann[naming.AnnotationShape] = p.Shape
	}
	local.SetAnnotations(ann)
	return local, nil
}

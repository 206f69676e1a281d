package publish

import (
	"context"
	"fmt"
	"slices"
	"strings"

	apisv1alpha2 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha2"
	"github.com/kcp-dev/logicalcluster/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/pkg/related"
)

// The kind in kcp of a projected related entry.
//
// Without a projection both sides serve the same kind, and the edge sends
// the one the service cluster resolved. With one, the kind in kcp may be
// another (a projected resource is another resource), and only the broker
// can see kcp: it finds the kind here and hands it to the sync engine in
// PublishResult.related_kinds.
//   - The APIExport's own resources (group: the export's name, e.g. a CRD
//     another PublishedResource of this edge publishes, schema-only) are
//     not served in the export's own workspace: their kind is the one in
//     the APIResourceSchema the APIExport names for the resource.
//   - Any other resource: kcp's discovery in the export's workspace (the
//     same that relatedScopeProblem checks).

// kindLookup finds the kind in kcp of a projected entry's resource.
type kindLookup struct {
	ownGroup string
	// self is the resource this Publish serves (plural) and its kind: an
	// entry may relate the primary's own kind, which is not in the
	// APIExport yet on the first publish.
	self, selfKind string
	// ownSchema returns the APIResourceSchema name the APIExport serves
	// ownGroup's resource plural with ("" when none).
	ownSchema func(plural string) (string, error)
	// schemaKind returns the kind an APIResourceSchema defines and the
	// versions it serves.
	schemaKind func(schemaName string) (kind string, versions []string, err error)
	// resourcesFor is kcp's discovery of a group/version.
	resourcesFor func(groupVersion string) (*metav1.APIResourceList, error)
}

// kinds resolves every projected entry of specs. A refusal is a problem of
// the input (the message says what to write); an error is worth retrying
// (kcp unreachable, or an own resource another PublishedResource has not
// published yet).
func (l kindLookup) kinds(specs []ferryv1alpha1.RelatedResourceSpec) (out []*ferryv1.RelatedKind, refusal string, err error) {
	for i := range specs {
		s := &specs[i]
		if s.Projection == nil {
			continue
		}
		gvr := related.KCPResource(s)
		kind, refusal, err := l.kind(gvr)
		if err != nil {
			return nil, "", fmt.Errorf("spec.related[%s]: %w", s.EffectiveIdentifier(), err)
		}
		if refusal != "" {
			return nil, fmt.Sprintf("spec.related[%s]: %s", s.EffectiveIdentifier(), refusal), nil
		}
		out = append(out, &ferryv1.RelatedKind{Identifier: s.EffectiveIdentifier(), Kind: kind})
	}
	return out, "", nil
}

func (l kindLookup) kind(gvr schema.GroupVersionResource) (kind, refusal string, err error) {
	if gvr.Group == l.ownGroup {
		if gvr.Resource == l.self && l.selfKind != "" {
			return l.selfKind, "", nil
		}
		name, err := l.ownSchema(gvr.Resource)
		if err != nil {
			return "", "", fmt.Errorf("cannot read the APIExport %s: %w", l.ownGroup, err)
		}
		if name == "" {
			return "", "", fmt.Errorf("the APIExport does not serve %s yet: publish it first (e.g. a PublishedResource of its CRD with synchronization.enabled: false)",
				gvr.GroupResource())
		}
		kind, versions, err := l.schemaKind(name)
		if err != nil {
			return "", "", fmt.Errorf("cannot read APIResourceSchema %s: %w", name, err)
		}
		if !slices.Contains(versions, gvr.Version) {
			// The broker would watch and write a version kcp does not
			// serve: nothing would ever sync.
			return "", fmt.Sprintf("the APIExport serves %s in version(s) %s, not %s: set the version of kcp's side to one of them (projection.version for origin service, version for origin kcp)",
				gvr.GroupResource(), strings.Join(versions, ", "), gvr.Version), nil
		}
		return kind, "", nil
	}
	list, err := l.resourcesFor(gvr.GroupVersion().String())
	if err != nil {
		// relatedScopeProblem has refused what kcp does not serve.
		return "", "", fmt.Errorf("cannot read kcp's discovery of %s: %w", gvr.GroupVersion(), err)
	}
	i := slices.IndexFunc(list.APIResources, func(a metav1.APIResource) bool { return a.Name == gvr.Resource })
	if i < 0 || list.APIResources[i].Kind == "" {
		return "", "", fmt.Errorf("kcp's discovery of %s has no kind for %s", gvr.GroupVersion(), gvr.Resource)
	}
	return list.APIResources[i].Kind, "", nil
}

// projectedKinds finds the kinds in kcp of the projected entries of specs
// for a Publish serving plural (of kind) in export.
func (p *Publisher) projectedKinds(ctx context.Context, export config.APIExportRef, plural, kind string, specs []ferryv1alpha1.RelatedResourceSpec) ([]*ferryv1.RelatedKind, string, error) {
	if !slices.ContainsFunc(specs, func(s ferryv1alpha1.RelatedResourceSpec) bool { return s.Projection != nil }) {
		return nil, "", nil
	}
	path := logicalcluster.NewPath(export.Workspace)
	l := kindLookup{
		ownGroup: export.Name, self: plural, selfKind: kind,
		ownSchema: func(plural string) (string, error) {
			ex, err := p.client.Cluster(path).ApisV1alpha2().APIExports().Get(ctx, export.Name, metav1.GetOptions{})
			if err != nil {
				return "", err
			}
			return exportSchema(ex, export.Name, plural), nil
		},
		schemaKind: func(name string) (string, []string, error) {
			ars, err := p.client.Cluster(path).ApisV1alpha1().APIResourceSchemas().Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return "", nil, err
			}
			var versions []string
			for _, v := range ars.Spec.Versions {
				if v.Served {
					versions = append(versions, v.Name)
				}
			}
			return ars.Spec.Names.Kind, versions, nil
		},
		resourcesFor: p.client.Cluster(path).Discovery().ServerResourcesForGroupVersion,
	}
	return l.kinds(specs)
}

// exportSchema is the APIResourceSchema the export serves group's resource
// plural with ("" when none).
func exportSchema(ex *apisv1alpha2.APIExport, group, plural string) string {
	for _, r := range ex.Spec.Resources {
		if r.Group == group && r.Name == plural {
			return r.Schema
		}
	}
	return ""
}

// Package publish is the broker's half of publishing: it turns an edge's
// Publish (PublishedResource spec + CRD) into an APIResourceSchema in the
// APIExport's workspace and merges it into the APIExport. Schemas are
// created, never updated (their names carry a content hash); APIExport
// entries of other resources and existing permission claims are kept;
// nothing is ever removed from the APIExport.
package publish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"

	"github.com/ferry-dev/ferry/pkg/logging"

	"github.com/go-logr/logr"
	apisv1alpha2 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha2"
	kcpclientset "github.com/kcp-dev/kcp/sdk/client/clientset/versioned/cluster"
	"github.com/kcp-dev/logicalcluster/v3"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/util/retry"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/pkg/projection"
	"github.com/ferry-dev/ferry/pkg/related"
)

// claimVerbs are the verbs claimed on related resources' kinds: the broker
// reads, writes and deletes related objects in consumer workspaces.
var claimVerbs = []string{"get", "list", "watch", "create", "update", "patch", "delete"}

// Owners records which PublishedResource publishes which kcp resource
// (plural) of one APIExport, so two cannot silently overwrite each other.
// Owned by one session's publish worker; not safe for concurrent use.
type Owners map[string]string

// Publisher applies publishes to kcp. Safe for concurrent use.
type Publisher struct {
	client kcpclientset.ClusterInterface
	log    logr.Logger
}

// NewPublisher returns a publisher writing through client.
func NewPublisher(client kcpclientset.ClusterInterface, log logr.Logger) *Publisher {
	return &Publisher{client: client, log: log}
}

// Apply publishes msg into export. Problems with the input become a FAILED
// result; an error is returned only for failures worth retrying (kcp
// unreachable, conflicts).
func (p *Publisher) Apply(ctx context.Context, export config.APIExportRef, owners Owners, msg *ferryv1.Publish) (*ferryv1.PublishResult, error) {
	res := &ferryv1.PublishResult{
		PublishedResource: msg.GetPublishedResource(),
		Generation:        msg.GetGeneration(),
		Revision:          msg.GetRevision(),
	}
	fail := func(reason, format string, args ...any) (*ferryv1.PublishResult, error) {
		res.State, res.Reason, res.Message = ferryv1.PublishState_PUBLISH_STATE_FAILED, reason, fmt.Sprintf(format, args...)
		return res, nil
	}

	var spec ferryv1alpha1.PublishedResourceSpec
	if err := json.Unmarshal(msg.GetSpec(), &spec); err != nil {
		return fail(ferryv1alpha1.ReasonProjectionInvalid, "the broker cannot decode the PublishedResource spec: %v", err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := json.Unmarshal(msg.GetCustomResourceDefinition(), &crd); err != nil {
		return fail(ferryv1alpha1.ReasonProjectionInvalid, "the broker cannot decode the CRD: %v", err)
	}
	proj, err := projection.Project(&spec, &crd, export.Name)
	if err != nil {
		var pe *projection.Error
		if errors.As(err, &pe) {
			return fail(pe.Reason, "%s", pe.Message)
		}
		return fail(ferryv1alpha1.ReasonProjectionInvalid, "%v", err)
	}
	plural := proj.Resource.Resource
	if owner, ok := owners[plural]; ok && owner != msg.GetPublishedResource() {
		return fail(ferryv1alpha1.ReasonSchemaConflict, "PublishedResource %q already publishes %s.%s in APIExport %s",
			owner, plural, export.Name, export)
	}

	path := logicalcluster.NewPath(export.Workspace)
	if msg, err := relatedScopeProblem(export.Name, spec.Related, p.client.Cluster(path).Discovery().ServerResourcesForGroupVersion); err != nil || msg != "" {
		if err != nil {
			return nil, err
		}
		return fail(ferryv1alpha1.ReasonBrokerRefused, "%s", msg)
	}
	relatedKinds, refusal, err := p.projectedKinds(ctx, export, plural, proj.Kind, spec.Related)
	switch {
	case err != nil:
		return nil, err
	case refusal != "":
		return fail(ferryv1alpha1.ReasonBrokerRefused, "%s", refusal)
	}
	ars := proj.Schema
	if _, err := p.client.Cluster(path).ApisV1alpha1().APIResourceSchemas().Create(ctx, ars, metav1.CreateOptions{}); err != nil {
		if !apierrors.IsAlreadyExists(err) {
			return nil, fmt.Errorf("cannot create APIResourceSchema %s in %s: %w", ars.Name, export.Workspace, err)
		}
	} else {
		p.log.Info("created APIResourceSchema", "schema", ars.Name, logging.KeyExport, export.String())
	}

	claims := relatedClaims(export.Name, spec.Related)
	if msg := identityClaimProblem(claims); msg != "" {
		return fail(ferryv1alpha1.ReasonBrokerRefused, "%s", msg)
	}
	if spec.Synchronization == nil || spec.Synchronization.Enabled == nil || *spec.Synchronization.Enabled {
		// Sync failures are reported as Events on the kcp objects.
		claims = append(claims, eventsClaim())
		switch {
		case len(spec.Related) > 0:
			// A related copy may go into a namespace that does not exist
			// in the workspace yet: the broker creates it.
			claims = append(claims, apisv1alpha2.PermissionClaim{
				GroupResource: apisv1alpha2.GroupResource{Resource: "namespaces"}, Verbs: []string{"get", "list", "watch", "create"},
			})
		case spec.Filter != nil && hasNamespaceSelector(spec.Filter.Namespace):
			// Filtering by namespace labels needs to read namespaces.
			claims = append(claims, apisv1alpha2.PermissionClaim{
				GroupResource: apisv1alpha2.GroupResource{Resource: "namespaces"}, Verbs: []string{"get", "list", "watch"},
			})
		}
	}
	var rewrite string // a claim this publish would have to rewrite
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		current, err := p.client.Cluster(path).ApisV1alpha2().APIExports().Get(ctx, export.Name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if rewrite = claimRewriteProblem(export, current.Spec.PermissionClaims, claims); rewrite != "" {
			return nil
		}
		if !mergeExport(&current.Spec, export.Name, plural, ars.Name, claims) {
			return nil
		}
		_, err = p.client.Cluster(path).ApisV1alpha2().APIExports().Update(ctx, current, metav1.UpdateOptions{})
		if err == nil {
			p.log.Info("updated APIExport", logging.KeyExport, export.String(), "resource", plural, "schema", ars.Name)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("cannot update APIExport %s: %w", export, err)
	}
	if rewrite != "" {
		return fail(ferryv1alpha1.ReasonBrokerRefused, "%s", rewrite)
	}

	// Ownership moves only once the export says so.
	for pl, o := range owners {
		if o == msg.GetPublishedResource() && pl != plural {
			delete(owners, pl)
		}
	}
	owners[plural] = msg.GetPublishedResource()

	res.State = ferryv1.PublishState_PUBLISH_STATE_PUBLISHED
	res.Reason = ferryv1alpha1.ReasonPublished
	res.Message = fmt.Sprintf("served as %s in APIExport %s", proj.Resource.GroupResource(), export)
	res.ResourceSchemaName = ars.Name
	res.ProjectedKind = proj.Kind
	res.ServedResource = &ferryv1.GroupVersionResource{Group: proj.Resource.Group, Version: proj.Resource.Version, Resource: plural}
	res.RelatedKinds = relatedKinds
	return res, nil
}

// Forget drops the ownership of a PublishedResource that was unpublished.
// Its schema stays in the APIExport.
func Forget(owners Owners, publishedResource string) {
	for pl, o := range owners {
		if o == publishedResource {
			delete(owners, pl)
		}
	}
}

// mergeExport points the entry of group/plural at schema (adding it when
// absent) and adds missing claims; it reports whether spec changed. Other
// entries and existing claims are kept as they are.
func mergeExport(spec *apisv1alpha2.APIExportSpec, group, plural, schemaName string, claims []apisv1alpha2.PermissionClaim) bool {
	changed := false
	i := slices.IndexFunc(spec.Resources, func(r apisv1alpha2.ResourceSchema) bool { return r.Group == group && r.Name == plural })
	want := projection.ExportEntry(group, plural, schemaName)
	switch {
	case i < 0:
		spec.Resources = append(spec.Resources, want)
		changed = true
	case spec.Resources[i].Schema != schemaName || spec.Resources[i].Storage.CRD == nil:
		spec.Resources[i] = want
		changed = true
	}
	for _, c := range claims {
		if !slices.ContainsFunc(spec.PermissionClaims, c.EqualGRI) {
			spec.PermissionClaims = append(spec.PermissionClaims, c)
			changed = true
		}
	}
	return changed
}

// eventsClaim lets the broker record Events in consumer workspaces: one
// per object and reason, updated on repeats (get, update). An existing claim
// is never rewritten (bindings accepted it as it is): an export claimed by
// an older broker with "create" only gets one Event per object and reason,
// without counts.
func eventsClaim() apisv1alpha2.PermissionClaim {
	return apisv1alpha2.PermissionClaim{GroupResource: apisv1alpha2.GroupResource{Resource: "events"}, Verbs: []string{"create", "get", "update"}}
}

// relatedResource is the resource a related entry names in kcp: its
// resource (api-syncagent's spelling) when set, else the plural of its
// kind; with a projection, the projected resource for origin service (the
// edge derives the same pair, pkg/related).
func relatedResource(r ferryv1alpha1.RelatedResourceSpec) schema.GroupVersionResource {
	return related.KCPResource(&r)
}

// relatedClaims are the permission claims related resources need; the
// APIExport's own resources (group ownGroup, the export's name) need none:
// its virtual workspace serves them in every bound workspace.
func relatedClaims(ownGroup string, related []ferryv1alpha1.RelatedResourceSpec) []apisv1alpha2.PermissionClaim {
	var out []apisv1alpha2.PermissionClaim
	for _, r := range related {
		plural := relatedResource(r)
		if plural.Group == ownGroup {
			continue
		}
		c := apisv1alpha2.PermissionClaim{
			GroupResource: apisv1alpha2.GroupResource{Group: plural.Group, Resource: plural.Resource},
			Verbs:         slices.Clone(claimVerbs),
			// A kind another APIExport provides is claimed with that
			// export's identity; kcp serves it to ferry's virtual
			// workspace only in workspaces that bind that export.
			IdentityHash: r.IdentityHash,
		}
		if !slices.ContainsFunc(out, c.EqualGRI) {
			out = append(out, c)
		}
	}
	return out
}

// relatedScopeProblem refuses (a message) related kinds that kcp serves
// cluster-scoped or not at all, as its discovery (resourcesFor) tells: the
// broker claims and writes related objects only inside a namespace of a
// consumer's workspace, whatever the edge checked on its side. An error is
// worth retrying.
//
// The APIExport's own resources (group ownGroup) are not served in its
// workspace, only to bound workspaces: their scope is the one their
// PublishedResource publishes, and the edge checked it on its CRD. A kind
// of another APIExport (identityHash) is checked where the APIExport's
// workspace serves it (it binds that export) and let through where it does
// not: kcp serves such a kind only in workspaces that bind its export, and
// finding that export by its identity needs reads across all workspaces
// the broker is not given. Containment holds without the check: the edge
// refuses a related kind that is cluster-scoped in the service cluster,
// and the broker reads and writes related objects only under a namespace
// (namespaced paths of a cluster-scoped resource are not found in kcp).
func relatedScopeProblem(ownGroup string, specs []ferryv1alpha1.RelatedResourceSpec, resourcesFor func(groupVersion string) (*metav1.APIResourceList, error)) (string, error) {
	for _, r := range specs {
		plural := relatedResource(r)
		if plural.Group == ownGroup {
			continue
		}
		gv := plural.GroupVersion()
		list, err := resourcesFor(gv.String())
		if apierrors.IsNotFound(err) {
			if r.IdentityHash != "" {
				continue // not served here: see above
			}
			return fmt.Sprintf("spec.related[%s]: kcp does not serve %s", r.Identifier, plural.GroupResource()), nil
		}
		if err != nil {
			return "", fmt.Errorf("cannot read kcp's discovery of %s: %w", gv, err)
		}
		i := slices.IndexFunc(list.APIResources, func(a metav1.APIResource) bool { return a.Name == plural.Resource })
		switch {
		case i < 0 && r.IdentityHash != "":
			continue // not served here: see above
		case i < 0:
			return fmt.Sprintf("spec.related[%s]: kcp does not serve %s", r.Identifier, plural.GroupResource()), nil
		case !list.APIResources[i].Namespaced:
			return fmt.Sprintf("spec.related[%s]: %s is cluster-scoped in kcp; related objects must be namespaced", r.Identifier, plural.GroupResource()), nil
		}
	}
	return "", nil
}

// hasNamespaceSelector tells whether filter.namespace selects namespaces by
// labels (a namespace name needs no namespace reads).
func hasNamespaceSelector(f *ferryv1alpha1.NamespaceFilter) bool {
	_, ok := f.LabelSelector()
	return ok
}

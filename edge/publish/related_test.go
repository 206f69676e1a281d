package publish

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

// TestRelatedResourceSpelling: an entry naming the resource
// (api-syncagent's spelling) is resolved to its kind through the service
// cluster's discovery, and the Publish carries that kind so the broker
// writes copies of the right kind; a resource the service cluster does
// not serve, a cluster-scoped kind and a .ClusterPath template without
// workspace paths are refused with what to write instead.
func TestRelatedResourceSpelling(t *testing.T) {
	mapper := meta.NewDefaultRESTMapper(nil)
	mapper.Add(schema.GroupVersionKind{Version: "v1", Kind: "Secret"}, meta.RESTScopeNamespace)
	mapper.Add(schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Gizmo"}, meta.RESTScopeNamespace)
	mapper.Add(schema.GroupVersionKind{Version: "v1", Kind: "Namespace"}, meta.RESTScopeRoot)
	objRef := &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
		Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: "spec.secretName"}}}
	tmpl := func(text string) *ferryv1alpha1.RelatedResourceObject {
		return &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
			Template: &ferryv1alpha1.TemplateExpression{Template: text}}}
	}
	for _, tc := range []struct {
		name           string
		entry          ferryv1alpha1.RelatedResourceSpec
		workspacePaths bool
		wantKind       string
		wantLocal      string
		wantErr        string
	}{
		{name: "core resource", entry: ferryv1alpha1.RelatedResourceSpec{Resource: "secrets", Version: "v1", Object: objRef},
			wantKind: "Secret", wantLocal: "/v1, Resource=secrets"},
		{name: "custom resource", entry: ferryv1alpha1.RelatedResourceSpec{Group: "example.com", Version: "v1", Resource: "gizmos", Object: tmpl("{{ .Object.metadata.name }}")},
			wantKind: "Gizmo", wantLocal: "example.com/v1, Resource=gizmos"},
		{name: "ferry's kind", entry: ferryv1alpha1.RelatedResourceSpec{Kind: "Secret", Object: objRef},
			wantKind: "Secret", wantLocal: "/v1, Resource=secrets"},
		{name: "not served", entry: ferryv1alpha1.RelatedResourceSpec{Resource: "widgetsecrets", Object: objRef},
			wantErr: "resource /v1, Resource=widgetsecrets is not served by the service cluster (write the lowercase plural"},
		{name: "cluster-scoped", entry: ferryv1alpha1.RelatedResourceSpec{Resource: "namespaces", Object: objRef},
			wantErr: "related objects must be namespaced"},
		{name: "cluster path without workspace paths", entry: ferryv1alpha1.RelatedResourceSpec{Resource: "secrets", Object: tmpl("{{ .ClusterPath }}")},
			wantErr: "known only with spec.enableWorkspacePaths"},
		{name: "cluster path with workspace paths", entry: ferryv1alpha1.RelatedResourceSpec{Resource: "secrets", Object: tmpl("{{ .ClusterPath }}")},
			workspacePaths: true, wantKind: "Secret", wantLocal: "/v1, Resource=secrets"},
		{name: "list reference with a mutation", entry: ferryv1alpha1.RelatedResourceSpec{Resource: "secrets", Version: "v1",
			Object: &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
				Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: "spec.users.#.name"}}},
			Mutation: &ferryv1alpha1.ResourceMutationSpec{Spec: []ferryv1alpha1.ResourceMutation{
				{Template: &ferryv1alpha1.TemplateMutation{Path: "metadata.labels.owner", Template: "{{ .Object.metadata.name }}"}}}}},
			wantKind: "Secret", wantLocal: "/v1, Resource=secrets"},
		{name: "mutation template reading what the data model lacks", entry: ferryv1alpha1.RelatedResourceSpec{Resource: "secrets", Object: objRef,
			Mutation: &ferryv1alpha1.ResourceMutationSpec{Spec: []ferryv1alpha1.ResourceMutation{
				{Template: &ferryv1alpha1.TemplateMutation{Path: "metadata.labels.owner", Template: "{{ .Workspace }}"}}}}},
			wantErr: "spec.related[creds]: mutation.spec[0].template"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pr := widgetPR("widgets", time.Now(), nil)
			pr.Spec.EnableWorkspacePaths = tc.workspacePaths
			tc.entry.Identifier, tc.entry.Origin = "creds", ferryv1alpha1.OriginService
			pr.Spec.Related = []ferryv1alpha1.RelatedResourceSpec{tc.entry}
			r := &Reconciler{Mapper: mapper}
			refs, err := r.compileRelated(pr, widgetCRD())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := refs[0].Kind.Kind; got != tc.wantKind {
				t.Errorf("kind = %q, want %q", got, tc.wantKind)
			}
			if got := refs[0].Local.String(); got != tc.wantLocal {
				t.Errorf("local resource = %s, want %s", got, tc.wantLocal)
			}
			msg, err := newPublish(pr, widgetCRD(), refs)
			if err != nil {
				t.Fatal(err)
			}
			var sent ferryv1alpha1.PublishedResourceSpec
			if err := json.Unmarshal(msg.GetSpec(), &sent); err != nil {
				t.Fatal(err)
			}
			if got := sent.Related[0].Kind; got != tc.wantKind {
				t.Errorf("the Publish carries kind %q, want %q", got, tc.wantKind)
			}
			if pr.Spec.Related[0].Kind != tc.entry.Kind {
				t.Error("newPublish changed the PublishedResource's own spec")
			}
		})
	}
}

// TestCRDEventReachesPublishedResourcesRelatingIt: a PublishedResource
// whose related[] names a kind the service cluster did not serve yet is
// reconciled again when that CRD appears (it stayed RelatedInvalid until
// something else touched it).
func TestCRDEventReachesPublishedResourcesRelatingIt(t *testing.T) {
	byResource := widgetPR("by-resource", time.Now(), nil)
	byResource.Spec.Related = []ferryv1alpha1.RelatedResourceSpec{{Identifier: "g", Origin: ferryv1alpha1.OriginService, Group: "grants.example", Resource: "grants",
		Object: &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
			Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: "spec.grant"}}}}}
	byKind := widgetPR("by-kind", time.Now(), nil)
	byKind.Spec.Related = []ferryv1alpha1.RelatedResourceSpec{{Identifier: "g", Origin: ferryv1alpha1.OriginService, Group: "grants.example", Kind: "Grant",
		Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.grant"}}}}
	unrelated := widgetPR("unrelated", time.Now(), nil)
	h := newHarness(t, byResource, byKind, unrelated)
	grants := &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "grants.grants.example"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: "grants.example",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: "Grant", Plural: "grants"}},
	}
	var got []string
	for _, req := range h.r.forCRD(context.Background(), grants) {
		got = append(got, req.Name)
	}
	slices.Sort(got)
	if !slices.Equal(got, []string{"by-kind", "by-resource"}) {
		t.Errorf("requests %v, want by-kind and by-resource", got)
	}
}

// TestRelatedProjectionOnTheEdge: the edge resolves the service cluster's
// side of a projected entry — the configured resource for origin service,
// the projected one for origin kcp — and sends the spec as written: the
// kind in kcp is the broker's to find (the service cluster's kind may
// differ from it). A projected resource the service cluster does not serve
// says that the projection names the service cluster's side; and a CRD of
// the projected resource wakes an origin-kcp entry.
func TestRelatedProjectionOnTheEdge(t *testing.T) {
	mapper := meta.NewDefaultRESTMapper(nil)
	mapper.Add(schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}, meta.RESTScopeNamespace)
	mapper.Add(schema.GroupVersionKind{Group: "db.corp.example", Version: "v1alpha1", Kind: "UserDatabase"}, meta.RESTScopeNamespace)
	objRef := &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
		Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: "spec.secretName"}}}
	for _, tc := range []struct {
		name          string
		entry         ferryv1alpha1.RelatedResourceSpec
		wantLocalKind string
		wantLocal     string
		wantErr       string
	}{
		{name: "origin service: the configured resource is local",
			entry: ferryv1alpha1.RelatedResourceSpec{Origin: ferryv1alpha1.OriginService, Group: "db.corp.example", Version: "v1alpha1", Resource: "userdatabases",
				Projection: &ferryv1alpha1.RelatedResourceProjection{Group: "widgets.example.com", Version: "v1"}, Object: objRef},
			wantLocalKind: "UserDatabase", wantLocal: "db.corp.example/v1alpha1, Resource=userdatabases"},
		{name: "origin kcp: the projected resource is local",
			entry: ferryv1alpha1.RelatedResourceSpec{Origin: ferryv1alpha1.OriginKCP, Resource: "secrets",
				Projection: &ferryv1alpha1.RelatedResourceProjection{Resource: "configmaps"}, Object: objRef},
			wantLocalKind: "ConfigMap", wantLocal: "/v1, Resource=configmaps"},
		{name: "origin kcp: the projected resource is not served",
			entry: ferryv1alpha1.RelatedResourceSpec{Origin: ferryv1alpha1.OriginKCP, Group: "widgets.example.com", Resource: "userdatabases",
				Projection: &ferryv1alpha1.RelatedResourceProjection{Group: "db.corp.example", Version: "v2"}, Object: objRef},
			wantErr: "for origin kcp, projection names the service cluster's group, version and resource"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pr := widgetPR("widgets", time.Now(), nil)
			tc.entry.Identifier = "db"
			pr.Spec.Related = []ferryv1alpha1.RelatedResourceSpec{tc.entry}
			r := &Reconciler{Mapper: mapper}
			refs, err := r.compileRelated(pr, widgetCRD())
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := refs[0].ServiceKind; got != tc.wantLocalKind {
				t.Errorf("local kind = %q, want %q", got, tc.wantLocalKind)
			}
			if got := refs[0].Local.String(); got != tc.wantLocal {
				t.Errorf("local resource = %s, want %s", got, tc.wantLocal)
			}
			if refs[0].Kind.Kind != "" {
				t.Errorf("the edge set the kind in kcp to %q; it is the broker's to find", refs[0].Kind.Kind)
			}
			msg, err := newPublish(pr, widgetCRD(), refs)
			if err != nil {
				t.Fatal(err)
			}
			var sent ferryv1alpha1.PublishedResourceSpec
			if err := json.Unmarshal(msg.GetSpec(), &sent); err != nil {
				t.Fatal(err)
			}
			if got := sent.Related[0].Kind; got != "" {
				t.Errorf("the Publish carries kind %q for a projected entry, want none", got)
			}
		})
	}

	reverse := widgetPR("reverse", time.Now(), nil)
	reverse.Spec.Related = []ferryv1alpha1.RelatedResourceSpec{{Identifier: "db", Origin: ferryv1alpha1.OriginKCP, Group: "widgets.example.com", Version: "v1", Resource: "userdbs",
		Projection: &ferryv1alpha1.RelatedResourceProjection{Group: "db.corp.example", Version: "v1alpha1", Resource: "userdatabases"}, Object: objRef}}
	crd := &apiextensionsv1.CustomResourceDefinition{Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: "db.corp.example",
		Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: "UserDatabase", Plural: "userdatabases"}}}
	if !relatesCRD(reverse, crd) {
		t.Error("the CRD of an origin-kcp entry's projected resource does not wake its PublishedResource")
	}
	kcpSide := &apiextensionsv1.CustomResourceDefinition{Spec: apiextensionsv1.CustomResourceDefinitionSpec{Group: "widgets.example.com",
		Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: "Userdb", Plural: "userdbs"}}}
	if relatesCRD(reverse, kcpSide) {
		t.Error("a CRD of the kcp side's resource wakes an origin-kcp entry that writes the projected one")
	}
}

package publish

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	apiextensionsinternal "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	crdvalidation "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/validation"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/openapi"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

// fakeOpenAPI serves one document for every group version it lists and
// counts the documents read.
type fakeOpenAPI struct {
	doc   []byte
	paths []string
	reads int
}

func (f *fakeOpenAPI) PathsWithContext(context.Context) (map[string]openapi.GroupVersionWithContext, error) {
	out := map[string]openapi.GroupVersionWithContext{}
	for _, p := range f.paths {
		out[p] = fakeGV{f: f, url: "/openapi/v3/" + p + "?hash=1"}
	}
	return out, nil
}

type fakeGV struct {
	f   *fakeOpenAPI
	url string
}

func (g fakeGV) SchemaWithContext(context.Context, string) ([]byte, error) {
	g.f.reads++
	return g.f.doc, nil
}

func (g fakeGV) ServerRelativeURL() string { return g.url }

// builtinMapper knows ConfigMap (core/v1), Role (rbac v1) and Widget (a
// CRD's kind in example.com).
func builtinMapper() meta.RESTMapper {
	// A mapper asked without versions answers in the order of its
	// default group versions (discovery's preference order in the edge's).
	m := meta.NewDefaultRESTMapper([]schema.GroupVersion{{Version: "v1"}, {Group: "rbac.authorization.k8s.io", Version: "v1"}, {Group: "example.com", Version: "v1"}})
	m.Add(schema.GroupVersionKind{Version: "v1", Kind: "ConfigMap"}, meta.RESTScopeNamespace)
	m.Add(schema.GroupVersionKind{Group: "rbac.authorization.k8s.io", Version: "v1", Kind: "Role"}, meta.RESTScopeNamespace)
	m.Add(schema.GroupVersionKind{Group: "example.com", Version: "v1", Kind: "Widget"}, meta.RESTScopeNamespace)
	return m
}

func newBuiltins(t *testing.T, h *harness) (*Builtins, *fakeOpenAPI) {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "pkg", "openapischema", "testdata", "sample.json"))
	if err != nil {
		t.Fatal(err)
	}
	oa := &fakeOpenAPI{doc: doc, paths: []string{"api/v1", "apis/rbac.authorization.k8s.io/v1"}}
	return &Builtins{Mapper: builtinMapper(), Reader: h.c, OpenAPI: oa}, oa
}

// TestBuiltinKindsAreDescribedAsCRDs: a built-in kind of the service
// cluster becomes a CRD the API server's own CRD validation accepts, which
// projects into an APIResourceSchema like any CRD; a CRD's kind, a kind
// the cluster does not serve and an unserved version are not mistaken for
// built-ins.
func TestBuiltinKindsAreDescribedAsCRDs(t *testing.T) {
	for _, tc := range []struct {
		name      string
		src       ferryv1alpha1.SourceResource
		crd       string // the CRD's name, "" for none
		namespace bool
		projErr   string // the projection's refusal reason
	}{
		{name: "ConfigMap", src: ferryv1alpha1.SourceResource{Version: "v1", Kind: "ConfigMap"}, crd: "configmaps", namespace: true},
		{name: "rbac Role", src: ferryv1alpha1.SourceResource{APIGroup: "rbac.authorization.k8s.io", Version: "v1", Kind: "Role"}, crd: "roles.rbac.authorization.k8s.io", namespace: true},
		{name: "a version the cluster does not serve", src: ferryv1alpha1.SourceResource{Version: "v2", Kind: "ConfigMap"}, crd: "configmaps", namespace: true,
			projErr: ferryv1alpha1.ReasonVersionNotFound},
		{name: "a kind the cluster does not serve", src: ferryv1alpha1.SourceResource{Version: "v1", Kind: "Gizmo"}},
		{name: "a CRD's kind (the CRD cache lags)", src: ferryv1alpha1.SourceResource{APIGroup: "example.com", Version: "v1", Kind: "Widget"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, widgetCRD())
			b, _ := newBuiltins(t, h)
			crd, err := b.CRDFor(context.Background(), tc.src)
			if err != nil {
				t.Fatal(err)
			}
			if tc.crd == "" {
				if crd != nil {
					t.Fatalf("described %s as a built-in kind: %s", tc.src.Kind, crd.Name)
				}
				return
			}
			if crd == nil || crd.Name != tc.crd || (crd.Spec.Scope == apiextensionsv1.NamespaceScoped) != tc.namespace {
				t.Fatalf("CRD %+v, want %s (namespaced %v)", crd, tc.crd, tc.namespace)
			}
			proj, err := Project(&ferryv1alpha1.PublishedResource{Spec: ferryv1alpha1.PublishedResourceSpec{Resource: tc.src}}, crd, testExport)
			if tc.projErr != "" {
				var refusal *Refusal
				if !errors.As(err, &refusal) || refusal.Reason != tc.projErr {
					t.Fatalf("projection error %v, want reason %s", err, tc.projErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if crd.Spec.Versions[0].Subresources != nil {
				t.Errorf("%s has a status subresource, want none", tc.src.Kind)
			}
			if proj.Resource.Group != testExport || proj.Kind != tc.src.Kind {
				t.Errorf("projected as %s kind %s", proj.Resource, proj.Kind)
			}
			// The API server's CRD validation needs a group outside the
			// core and the protected *.k8s.io ones: the description is
			// checked under a stand-in group.
			named := crd.DeepCopy()
			named.Spec.Group, named.Name = "builtin.example.com", crd.Spec.Names.Plural+".builtin.example.com"
			assertValidCRD(t, named)
		})
	}
}

// TestBuiltinSchemasAreReadOnce: the converted schema of a document is
// kept (by the document's URL, which carries its content hash).
func TestBuiltinSchemasAreReadOnce(t *testing.T) {
	h := newHarness(t)
	b, oa := newBuiltins(t, h)
	for range 3 {
		if crd, err := b.CRDFor(context.Background(), ferryv1alpha1.SourceResource{Version: "v1", Kind: "ConfigMap"}); err != nil || crd == nil {
			t.Fatalf("CRDFor: %v, %v", crd, err)
		}
	}
	if oa.reads != 1 {
		t.Fatalf("read the document %d times, want once", oa.reads)
	}
}

// TestPublishingABuiltinKind: a PublishedResource naming ConfigMap (core
// group) is published (a Publish carrying its description as a CRD) and
// synced without status, where before it was refused with CRDNotFound.
func TestPublishingABuiltinKind(t *testing.T) {
	h := newHarness(t)
	h.r.Builtins, _ = newBuiltins(t, h)
	h.r.Mapper = builtinMapper()
	pr := &ferryv1alpha1.PublishedResource{
		ObjectMeta: metav1.ObjectMeta{Name: "settings"},
		Spec: ferryv1alpha1.PublishedResourceSpec{
			Resource:   ferryv1alpha1.SourceResource{Version: "v1", Kind: "ConfigMap"},
			Projection: &ferryv1alpha1.ResourceProjection{Kind: "Setting"},
		},
	}
	if err := h.c.Create(context.Background(), pr); err != nil {
		t.Fatal(err)
	}
	h.reconcile("settings")
	got := h.get("settings")
	if c := meta.FindStatusCondition(got.Status.Conditions, ferryv1alpha1.ConditionPublished); c == nil || c.Reason == ferryv1alpha1.ReasonCRDNotFound {
		t.Fatalf("Published condition %+v, want it sent to the broker", c)
	}
	var sent *ferryv1.Publish
	for _, m := range h.store.Outgoing() {
		if p := m.GetPublish(); p != nil && p.GetPublishedResource() == "settings" {
			sent = p
		}
	}
	if sent == nil {
		t.Fatal("no Publish sent")
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := json.Unmarshal(sent.GetCustomResourceDefinition(), &crd); err != nil {
		t.Fatal(err)
	}
	if crd.Spec.Names.Kind != "ConfigMap" || crd.Spec.Names.Plural != "configmaps" || len(crd.Spec.Versions) != 1 {
		t.Fatalf("sent CRD %+v", crd.Spec)
	}
	if !slices.Contains(h.sync.set, "settings=settings") {
		t.Fatalf("sync registrations %v, want settings=settings", h.sync.set)
	}
}

// assertValidCRD fails unless the API server's CRD validation accepts crd.
func assertValidCRD(t *testing.T, crd *apiextensionsv1.CustomResourceDefinition) {
	t.Helper()
	var internal apiextensionsinternal.CustomResourceDefinition
	if err := apiextensionsv1.Convert_v1_CustomResourceDefinition_To_apiextensions_CustomResourceDefinition(crd, &internal, nil); err != nil {
		t.Fatal(err)
	}
	internal.Status.StoredVersions = []string{crd.Spec.Versions[0].Name}
	if errs := crdvalidation.ValidateCustomResourceDefinition(context.Background(), &internal); len(errs) > 0 {
		t.Fatalf("the API server would refuse the CRD: %v", errs.ToAggregate())
	}
}

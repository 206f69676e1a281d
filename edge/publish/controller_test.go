package publish

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/edge/replication"
)

const testExport = "export.example"

// fakeSync records what the reconciler registers, withdraws and deletes.
type fakeSync struct {
	set     []string // name=remote resource, per SetPublished
	removed []string
	// withdrawn: WithdrawPublished (invalid for now; deletions go on)
	withdrawn []string
	deleted   []schema.GroupVersionResource
}

func (f *fakeSync) SetPublished(p *replication.Published) {
	f.set = append(f.set, p.Name+"="+p.Remote.Resource)
}

func (f *fakeSync) RemovePublished(name string) { f.removed = append(f.removed, name) }

func (f *fakeSync) WithdrawPublished(name string) { f.withdrawn = append(f.withdrawn, name) }

func (f *fakeSync) DeleteCopies(_ context.Context, _ schema.GroupResource, local schema.GroupVersionResource, _ []replication.Related) (int, error) {
	f.deleted = append(f.deleted, local)
	return 0, nil
}

func widgetCRD() *apiextensionsv1.CustomResourceDefinition {
	return &apiextensionsv1.CustomResourceDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "widgets.example.com"},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: "example.com",
			Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: "Widget", ListKind: "WidgetList", Plural: "widgets", Singular: "widget"},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema:       &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{Type: "object", XPreserveUnknownFields: ptr(true)}},
				Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
			}},
		},
	}
}

func ptr[T any](v T) *T { return &v }

// widgetPR is a PublishedResource of widgetCRD created at created.
func widgetPR(name string, created time.Time, proj *ferryv1alpha1.ResourceProjection) *ferryv1alpha1.PublishedResource {
	return &ferryv1alpha1.PublishedResource{
		ObjectMeta: metav1.ObjectMeta{Name: name, Generation: 1, CreationTimestamp: metav1.NewTime(created),
			Finalizers: []string{ferryv1alpha1.PublishedResourceFinalizer}},
		Spec: ferryv1alpha1.PublishedResourceSpec{
			Resource:   ferryv1alpha1.SourceResource{APIGroup: "example.com", Version: "v1", Kind: "Widget"},
			Projection: proj,
		},
	}
}

type harness struct {
	t     *testing.T
	c     client.Client
	r     *Reconciler
	sync  *fakeSync
	store *Store
}

func newHarness(t *testing.T, objs ...client.Object) *harness {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := ferryv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := apiextensionsv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).
		WithStatusSubresource(&ferryv1alpha1.PublishedResource{}).
		WithIndex(&apiextensionsv1.CustomResourceDefinition{}, crdGroupKindIndex, crdGroupKind).
		WithIndex(&ferryv1alpha1.PublishedResource{}, prGroupKindIndex, prGroupKind).
		Build()
	store := NewStore("broker.example:443", func() {})
	store.Attach(&ferryv1.BrokerHello{Export: &ferryv1.ExportStatus{Export: &ferryv1.APIExportReference{WorkspacePath: "root:org", Name: testExport}}})
	sync := &fakeSync{}
	return &harness{t: t, c: c, sync: sync, store: store, r: &Reconciler{
		Client: c, Mapper: meta.NewDefaultRESTMapper(nil), Store: store, Sync: sync, Log: logr.Discard(),
	}}
}

func (h *harness) reconcile(name string) {
	h.t.Helper()
	if _, err := h.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Name: name}}); err != nil {
		h.t.Fatalf("reconcile %s: %v", name, err)
	}
}

func (h *harness) get(name string) *ferryv1alpha1.PublishedResource {
	h.t.Helper()
	pr := &ferryv1alpha1.PublishedResource{}
	if err := h.c.Get(context.Background(), types.NamespacedName{Name: name}, pr); err != nil {
		h.t.Fatal(err)
	}
	return pr
}

// publishes lists the PublishedResources a Publish is now sent for.
func (h *harness) publishes() []string {
	var out []string
	for _, m := range h.store.Outgoing() {
		if p := m.GetPublish(); p != nil {
			out = append(out, p.GetPublishedResource())
		}
	}
	return out
}

// answerPublished has the broker accept the last Publish of name as
// served.
func (h *harness) answerPublished(name string) {
	h.t.Helper()
	h.store.mu.Lock()
	msg := h.store.desired[name]
	h.store.mu.Unlock()
	if msg == nil {
		h.t.Fatalf("no Publish for %s", name)
	}
	var spec ferryv1alpha1.PublishedResourceSpec
	plural, kind := "widgets", "Widget"
	if err := json.Unmarshal(msg.GetSpec(), &spec); err != nil {
		h.t.Fatal(err)
	}
	if p := spec.Projection; p != nil && p.Plural != "" {
		plural = p.Plural
	}
	if p := spec.Projection; p != nil && p.Kind != "" {
		kind = p.Kind
	}
	if err := h.store.Handle(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_PublishResult{PublishResult: &ferryv1.PublishResult{
		PublishedResource: name, Generation: msg.GetGeneration(), Revision: msg.GetRevision(),
		State: ferryv1.PublishState_PUBLISH_STATE_PUBLISHED, Message: "published",
		ServedResource: &ferryv1.GroupVersionResource{Group: testExport, Version: "v1", Resource: plural},
		ProjectedKind:  kind, ResourceSchemaName: "v1." + plural + "." + testExport,
	}}}); err != nil {
		h.t.Fatal(err)
	}
}

func published(pr *ferryv1alpha1.PublishedResource) *metav1.Condition {
	return meta.FindStatusCondition(pr.Status.Conditions, ferryv1alpha1.ConditionPublished)
}

// TestProjectionChangeOfAPublishedResourceIsRefused: a published
// PublishedResource whose projection now serves another resource keeps its
// registration and its Publish (moving them would delete every local
// copy) and says so in its Published condition. Failed before the fix: the
// reconciler registered and sent the new projection.
func TestProjectionChangeOfAPublishedResourceIsRefused(t *testing.T) {
	cases := []struct {
		name string
		// published says whether the broker served the first projection.
		published bool
		to        *ferryv1alpha1.ResourceProjection
		refused   bool
		wantSet   string // registration after the change, "" for none
	}{
		{name: "plural", published: true, to: &ferryv1alpha1.ResourceProjection{Plural: "gadgets"}, refused: true},
		{name: "kind (and so plural)", published: true, to: &ferryv1alpha1.ResourceProjection{Kind: "Gadget"}, refused: true},
		{name: "kind, same plural", published: true, to: &ferryv1alpha1.ResourceProjection{Kind: "Gadget", Plural: "widgets"}, refused: true},
		{name: "short names only", published: true, to: &ferryv1alpha1.ResourceProjection{ShortNames: []string{"wd"}}, wantSet: "widgets=widgets"},
		{name: "never published", published: false, to: &ferryv1alpha1.ResourceProjection{Plural: "gadgets"}, wantSet: "widgets=gadgets"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, widgetCRD(), widgetPR("widgets", time.Unix(1000, 0), nil))
			h.reconcile("widgets")
			if got := h.publishes(); len(got) != 1 {
				t.Fatalf("first Publish: %v", got)
			}
			if tc.published {
				h.answerPublished("widgets")
				h.reconcile("widgets")
				if pr := h.get("widgets"); pr.Status.ServedResource != "widgets."+testExport+"/v1" || published(pr).Status != metav1.ConditionTrue {
					t.Fatalf("not published: %+v", pr.Status)
				}
			}
			h.sync.set, h.sync.removed, h.sync.withdrawn = nil, nil, nil

			pr := h.get("widgets")
			pr.Spec.Projection = tc.to
			pr.Generation++
			if err := h.c.Update(context.Background(), pr); err != nil {
				t.Fatal(err)
			}
			h.reconcile("widgets")

			pr = h.get("widgets")
			cond := published(pr)
			if !tc.refused {
				if cond.Reason == ferryv1alpha1.ReasonProjectionChanged {
					t.Fatalf("refused: %s", cond.Message)
				}
				if len(h.sync.set) != 1 || h.sync.set[0] != tc.wantSet {
					t.Fatalf("registered %v, want %s", h.sync.set, tc.wantSet)
				}
				return
			}
			if cond.Status != metav1.ConditionFalse || cond.Reason != ferryv1alpha1.ReasonProjectionChanged {
				t.Fatalf("Published condition %s/%s: %s, want False/%s", cond.Status, cond.Reason, cond.Message, ferryv1alpha1.ReasonProjectionChanged)
			}
			for _, want := range []string{"widgets." + testExport + "/v1", "Orphan"} {
				if !strings.Contains(cond.Message, want) {
					t.Errorf("message %q does not name %q", cond.Message, want)
				}
			}
			if len(h.sync.set) != 0 || len(h.sync.removed) != 0 || len(h.sync.withdrawn) != 0 {
				t.Errorf("registration changed: set %v, removed %v, withdrawn %v; want it kept as it was", h.sync.set, h.sync.removed, h.sync.withdrawn)
			}
			if got := h.publishes(); len(got) != 0 {
				t.Errorf("sent a Publish of the new projection for %v", got)
			}
			if out := h.store.Outgoing(); len(out) != 0 {
				t.Errorf("sent %v; want nothing (no Unpublish either)", out)
			}
			if pr.Status.ServedResource != "widgets."+testExport+"/v1" {
				t.Errorf("status.servedResource = %q, want the published one", pr.Status.ServedResource)
			}
			if len(h.sync.deleted) != 0 {
				t.Errorf("deleted local copies of %v", h.sync.deleted)
			}

			// Restoring the projection publishes again, as before.
			pr.Spec.Projection = nil
			pr.Generation++
			if err := h.c.Update(context.Background(), pr); err != nil {
				t.Fatal(err)
			}
			h.reconcile("widgets")
			if cond := published(h.get("widgets")); cond.Status != metav1.ConditionTrue {
				t.Errorf("after restoring the projection: Published %s/%s: %s", cond.Status, cond.Reason, cond.Message)
			}
		})
	}
}

// TestSecondPublishedResourceOnOneCRDIsRefused: the younger of two
// PublishedResources naming the same CRD is neither registered nor sent,
// with a condition naming the elder, even when it projects onto another
// plural. Failed before the fix: both were registered.
func TestSecondPublishedResourceOnOneCRDIsRefused(t *testing.T) {
	elder := widgetPR("widgets", time.Unix(1000, 0), nil)
	younger := widgetPR("gadgets", time.Unix(2000, 0), &ferryv1alpha1.ResourceProjection{Kind: "Gadget"})
	h := newHarness(t, widgetCRD(), elder, younger)
	h.reconcile("widgets")
	h.reconcile("gadgets")

	if len(h.sync.set) != 1 || h.sync.set[0] != "widgets=widgets" {
		t.Errorf("registered %v, want only widgets=widgets", h.sync.set)
	}
	if got := h.publishes(); len(got) != 1 || got[0] != "widgets" {
		t.Errorf("Publish sent for %v, want only widgets", got)
	}
	cond := published(h.get("gadgets"))
	if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != ferryv1alpha1.ReasonLocalResourceClaimed {
		t.Fatalf("younger's Published condition %+v, want False/%s", cond, ferryv1alpha1.ReasonLocalResourceClaimed)
	}
	if !strings.Contains(cond.Message, `"widgets"`) {
		t.Errorf("message %q does not name the elder", cond.Message)
	}
	if cond := published(h.get("widgets")); cond.Reason == ferryv1alpha1.ReasonLocalResourceClaimed {
		t.Errorf("the elder is refused: %s", cond.Message)
	}

	// Once the elder is gone, the younger takes over.
	if err := h.c.Delete(context.Background(), h.get("widgets")); err != nil {
		t.Fatal(err)
	}
	pr := h.get("widgets")
	pr.Finalizers = nil
	if err := h.c.Update(context.Background(), pr); err != nil {
		t.Fatal(err)
	}
	if got := h.r.forOthers(context.Background(), elder); len(got) != 1 || got[0].Name != "gadgets" {
		t.Errorf("the elder's deletion requeues %v, want gadgets", got)
	}
	h.sync.set = nil
	h.reconcile("gadgets")
	if len(h.sync.set) != 1 || h.sync.set[0] != "gadgets=gadgets" {
		t.Errorf("after the elder went: registered %v, want gadgets=gadgets", h.sync.set)
	}
}

// TestDeletingAPublishedResourceThatOwnsNoCopiesDeletesNone: with
// deletionPolicy Delete, only the PublishedResource whose copies they are
// deletes local copies. Failed before the fix for the younger of two on
// one CRD and for one never published: both deleted every copy of the CRD.
func TestDeletingAPublishedResourceThatOwnsNoCopiesDeletesNone(t *testing.T) {
	const served = "widgets." + testExport + "/v1"
	cases := []struct {
		name       string
		withElder  bool
		served     string
		wantDelete bool
	}{
		{name: "younger of two on one CRD", withElder: true, served: "", wantDelete: false},
		{name: "younger of two, published before the elder claimed", withElder: true, served: "gadgets." + testExport + "/v1", wantDelete: false},
		{name: "never published", served: "", wantDelete: false},
		{name: "published owner", served: served, wantDelete: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pr := widgetPR("gadgets", time.Unix(2000, 0), &ferryv1alpha1.ResourceProjection{Kind: "Gadget"})
			pr.Spec.DeletionPolicy = ferryv1alpha1.DeletionPolicyDelete
			pr.Status.ServedResource = tc.served
			objs := []client.Object{widgetCRD(), pr}
			if tc.withElder {
				objs = append(objs, widgetPR("widgets", time.Unix(1000, 0), nil))
			}
			h := newHarness(t, objs...)
			if err := h.c.Delete(context.Background(), h.get("gadgets")); err != nil {
				t.Fatal(err)
			}
			h.reconcile("gadgets")
			if got := len(h.sync.deleted) > 0; got != tc.wantDelete {
				t.Errorf("DeleteCopies called: %v, want %v (%v)", got, tc.wantDelete, h.sync.deleted)
			}
			// Either way the broker is asked to release the objects.
			var release *ferryv1.Unpublish
			for _, m := range h.store.Outgoing() {
				if u := m.GetUnpublish(); u != nil {
					release = u
				}
			}
			if release == nil || release.GetRelease() != ferryv1.ReleasePolicy_RELEASE_POLICY_DELETE {
				t.Errorf("release sent: %v", release)
			}
		})
	}
}

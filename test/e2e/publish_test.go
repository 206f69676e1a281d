package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	apisv1alpha1 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha1"
	apisv1alpha2 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha2"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/test/framework"
)

func TestPublishProjectsCRDIntoAPIExport(t *testing.T) {
	ctx := context.Background()
	e := newPubEnv(t)
	group := "projects.example.com"
	apply(t, testCRD(group, "Widget", "widgets", apiextensionsv1.NamespaceScoped, "v1", "v1beta1"))
	spec := ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: group, Kind: "Widget", Version: "v1"},
		Projection: &ferryv1alpha1.ResourceProjection{
			Kind: "Gadget", Version: "v2", ShortNames: []string{"gd"}, Categories: []string{"toys"},
		},
	}
	e.publish(t, "widgets", spec)
	pr := e.waitCondition(t, "widgets", metav1.ConditionTrue, ferryv1alpha1.ReasonPublished)
	// No workspace binds the export yet: kcp lists no virtual workspace.
	if msg := e.waitPRCondition(t, "widgets", ferryv1alpha1.ConditionVirtualWorkspaceReady, metav1.ConditionFalse, ferryv1alpha1.ReasonWaitingForBinding); !strings.Contains(msg, "once the APIExport is bound") {
		t.Errorf("VirtualWorkspaceReady message %q does not say what it waits for", msg)
	}

	schemas := e.schemas(t, "gadgets")
	if len(schemas) != 1 {
		t.Fatalf("want one APIResourceSchema for gadgets, got %d", len(schemas))
	}
	ars := schemas[0]
	if pr.Status.ResourceSchemaName != ars.Name || pr.Status.ProjectedKind != "Gadget" || pr.Status.ServedResource != "gadgets."+e.export.Name+"/v2" {
		t.Errorf("status %+v does not describe schema %s", pr.Status, ars.Name)
	}
	s := ars.Spec
	if s.Group != e.export.Name || s.Names.Kind != "Gadget" || s.Names.Plural != "gadgets" || s.Names.Singular != "gadget" ||
		strings.Join(s.Names.ShortNames, ",") != "gd" || strings.Join(s.Names.Categories, ",") != "toys" || s.Scope != apiextensionsv1.NamespaceScoped {
		t.Errorf("projected names/scope wrong: group %s names %+v scope %s", s.Group, s.Names, s.Scope)
	}
	if len(s.Versions) != 1 || s.Versions[0].Name != "v2" || !s.Versions[0].Storage {
		t.Fatalf("want exactly the selected version, renamed to v2: %+v", s.Versions)
	}
	if raw := string(s.Versions[0].Schema.Raw); !strings.Contains(raw, "fieldV1") || strings.Contains(raw, "fieldV1beta1") {
		t.Errorf("schema not copied verbatim from v1: %s", raw)
	}
	if got := exportSchema(e.apiExport(t), e.export.Name, "gadgets"); got != ars.Name {
		t.Fatalf("APIExport lists schema %q for gadgets, want %q", got, ars.Name)
	}

	// Re-applying the unchanged PublishedResource, and restarting the edge
	// (which re-sends every Publish), creates no schema and updates none.
	rv := ars.ResourceVersion
	e.publish(t, "widgets", spec)
	if err := e.edge.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	e.edge = e.startEdge(t)
	// The new process's own line (the log file is shared with the first).
	waitLog(t, e.edge, time.Minute, "connected to broker")
	// The re-sent Publish was handled by the engine that outlived the
	// stream, from memory.
	waitLogCount(t, e.broker.Process, 30*time.Second, 1, "publish unchanged", `"publishedResource":"widgets"`)
	e.waitCondition(t, "widgets", metav1.ConditionTrue, ferryv1alpha1.ReasonPublished)
	if after := e.schemas(t, "gadgets"); len(after) != 1 || after[0].ResourceVersion != rv {
		t.Errorf("unchanged input touched the schemas: before rv %s, after %d schemas %v", rv, len(after), names(after))
	}

	// A changed CRD schema yields a new schema, which replaces the entry.
	crd := testCRD(group, "Widget", "widgets", apiextensionsv1.NamespaceScoped, "v1", "v1beta1")
	crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Description = "changed"
	apply(t, crd)
	err := framework.Eventually(ctx, time.Minute, 200*time.Millisecond, func(context.Context) (bool, string) {
		now := exportSchema(e.apiExport(t), e.export.Name, "gadgets")
		return now != "" && now != ars.Name, "APIExport still lists " + now
	})
	if err != nil {
		t.Fatal(err)
	}
	if after := e.schemas(t, "gadgets"); len(after) != 2 {
		t.Errorf("want the old and the new schema, got %v", names(after))
	}
}

func names(list []apisv1alpha1.APIResourceSchema) []string {
	var out []string
	for _, s := range list {
		out = append(out, s.Name)
	}
	return out
}

func TestPublishVersionsAndScope(t *testing.T) {
	e := newPubEnv(t)
	group := "versions.example.com"
	apply(t, testCRD(group, "Thing", "things", apiextensionsv1.NamespaceScoped, "v1", "v1beta1", "v1alpha1"))

	e.publish(t, "two-versions", ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: group, Kind: "Thing", Versions: []string{"v1beta1", "v1"}},
	})
	e.waitCondition(t, "two-versions", metav1.ConditionTrue, ferryv1alpha1.ReasonPublished)
	ars := e.schemas(t, "things")
	if len(ars) != 1 {
		t.Fatalf("want one schema, got %v", names(ars))
	}
	var got []string
	for _, v := range ars[0].Spec.Versions {
		got = append(got, v.Name)
	}
	if strings.Join(got, ",") != "v1beta1,v1" {
		t.Errorf("published versions %v, want exactly v1beta1,v1", got)
	}

	// A CRD as a cluster-scoped resource under another name (another CRD:
	// one CRD is published by one PublishedResource at most).
	apply(t, testCRD(group, "Gear", "gears", apiextensionsv1.NamespaceScoped, "v1"))
	e.publish(t, "cluster-scoped", ferryv1alpha1.PublishedResourceSpec{
		Resource:   ferryv1alpha1.SourceResource{APIGroup: group, Kind: "Gear", Version: "v1"},
		Projection: &ferryv1alpha1.ResourceProjection{Kind: "GlobalThing", Scope: ferryv1alpha1.ClusterScoped},
	})
	e.waitCondition(t, "cluster-scoped", metav1.ConditionTrue, ferryv1alpha1.ReasonPublished)
	global := e.schemas(t, "globalthings")
	if len(global) != 1 || global[0].Spec.Scope != apiextensionsv1.ClusterScoped {
		t.Fatalf("want one cluster-scoped schema for globalthings, got %+v", global)
	}
}

func TestPublishKeepsForeignSchemasAndNeverRemoves(t *testing.T) {
	ctx := context.Background()
	e := newPubEnv(t)

	// Someone added a schema for another resource to the APIExport by hand.
	foreign := &apisv1alpha1.APIResourceSchema{
		ObjectMeta: metav1.ObjectMeta{Name: "v1.handmades." + e.export.Name},
		Spec: apisv1alpha1.APIResourceSchemaSpec{
			Group: e.export.Name, Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: "Handmade", ListKind: "HandmadeList", Plural: "handmades", Singular: "handmade"},
			Versions: []apisv1alpha1.APIResourceVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: runtime.RawExtension{Raw: []byte(`{"type":"object","x-kubernetes-preserve-unknown-fields":true}`)},
			}},
		},
	}
	if _, err := e.kcp.Cluster(e.path).ApisV1alpha1().APIResourceSchemas().Create(ctx, foreign, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		ex := e.apiExport(t)
		ex.Spec.Resources = append(ex.Spec.Resources, apisv1alpha2.ResourceSchema{
			Group: e.export.Name, Name: "handmades", Schema: foreign.Name,
			Storage: apisv1alpha2.ResourceSchemaStorage{CRD: &apisv1alpha2.ResourceSchemaStorageCRD{}},
		})
		_, err := e.kcp.Cluster(e.path).ApisV1alpha2().APIExports().Update(ctx, ex, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}

	group := "keep.example.com"
	apply(t, testCRD(group, "Keeper", "keepers", apiextensionsv1.NamespaceScoped, "v1"))
	e.publish(t, "keepers", ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: group, Kind: "Keeper", Version: "v1"},
		Related: []ferryv1alpha1.RelatedResourceSpec{{
			Identifier: "credentials", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
			Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
		}},
	})
	pr := e.waitCondition(t, "keepers", metav1.ConditionTrue, ferryv1alpha1.ReasonPublished)
	ex := e.apiExport(t)
	if exportSchema(ex, e.export.Name, "handmades") != foreign.Name {
		t.Errorf("the hand-added schema was removed or changed: %+v", ex.Spec.Resources)
	}
	if exportSchema(ex, e.export.Name, "keepers") != pr.Status.ResourceSchemaName {
		t.Errorf("the published schema is not listed: %+v", ex.Spec.Resources)
	}
	claimed := false
	for _, c := range ex.Spec.PermissionClaims {
		claimed = claimed || (c.Group == "" && c.Resource == "secrets")
	}
	if !claimed {
		t.Errorf("no permission claim for the related Secrets: %+v", ex.Spec.PermissionClaims)
	}

	// Deleting the PublishedResource withdraws it; the schema stays.
	dyn, err := dynamic.NewForConfig(env.service.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := dyn.Resource(framework.PublishedResourceGVR).Delete(ctx, "keepers", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLog(t, e.broker.Process, 30*time.Second, "withdrawn", "keepers")
	ex = e.apiExport(t)
	if exportSchema(ex, e.export.Name, "keepers") != pr.Status.ResourceSchemaName || exportSchema(ex, e.export.Name, "handmades") != foreign.Name {
		t.Errorf("a schema was removed from the APIExport: %+v", ex.Spec.Resources)
	}
}

func TestPublishedKindIsServedInConsumerWorkspace(t *testing.T) {
	ctx := context.Background()
	e := newPubEnv(t)
	group := "served.example.com"
	apply(t, testCRD(group, "Sprocket", "sprockets", apiextensionsv1.NamespaceScoped, "v1"))
	e.publish(t, "sprockets", ferryv1alpha1.PublishedResourceSpec{
		Resource:   ferryv1alpha1.SourceResource{APIGroup: group, Kind: "Sprocket", Version: "v1"},
		Projection: &ferryv1alpha1.ResourceProjection{Kind: "Cog", ShortNames: []string{"cg"}, Categories: []string{"machinery"}},
	})
	e.waitCondition(t, "sprockets", metav1.ConditionTrue, ferryv1alpha1.ReasonPublished)

	consumer, err := framework.CreateWorkspace(ctx, env.kcp.Config, "root", "consumer-"+e.label)
	if err != nil {
		t.Fatal(err)
	}
	if err := framework.BindAPIExport(ctx, env.kcp.Config, consumer, e.path, e.export.Name); err != nil {
		t.Fatal(err)
	}
	cfg := rest.CopyConfig(env.kcp.Config)
	base, _, _ := strings.Cut(cfg.Host, "/clusters/")
	cfg.Host = base + "/clusters/" + consumer.String()
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = framework.Eventually(ctx, time.Minute, 250*time.Millisecond, func(context.Context) (bool, string) {
		list, err := dc.ServerResourcesForGroupVersion(e.export.Name + "/v1")
		if err != nil {
			return false, err.Error()
		}
		for _, r := range list.APIResources {
			if r.Name == "cogs" {
				if r.Kind != "Cog" || strings.Join(r.ShortNames, ",") != "cg" || strings.Join(r.Categories, ",") != "machinery" || !r.Namespaced {
					return false, "discovery shows " + r.String()
				}
				return true, ""
			}
		}
		return false, "cogs not in discovery"
	})
	if err != nil {
		t.Fatal(err)
	}
	// The broker reports the now-served virtual workspace to the edge.
	waitLog(t, e.edge, 30*time.Second, "APIExport status changed", `"virtualWorkspaceReady":true`)
}

func TestPublishBadInputGetsConditions(t *testing.T) {
	ctx := context.Background()
	e := newPubEnv(t)
	group := "bad.example.com"

	// A PublishedResource whose CRD does not exist yet...
	e.publish(t, "late-crd", ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: group, Kind: "Late", Version: "v1"},
	})
	pr := e.waitCondition(t, "late-crd", metav1.ConditionFalse, ferryv1alpha1.ReasonCRDNotFound)
	if msg := pr.Status.Conditions[0].Message; !strings.Contains(msg, "Late") || !strings.Contains(msg, group) {
		t.Errorf("CRDNotFound message should name kind and group: %q", msg)
	}
	// ...is published by itself once the CRD appears.
	apply(t, testCRD(group, "Late", "lates", apiextensionsv1.NamespaceScoped, "v1"))
	e.waitCondition(t, "late-crd", metav1.ConditionTrue, ferryv1alpha1.ReasonPublished)

	// Each bad PublishedResource names a CRD of its own: a second one on a
	// CRD is refused as LocalResourceClaimed (checked below).
	apply(t, testCRD(group, "Odd", "odds", apiextensionsv1.NamespaceScoped, "v1"))
	apply(t, testCRD(group, "Lost", "losts", apiextensionsv1.NamespaceScoped, "v1"))
	apply(t, testCRD(group, "Warped", "warpeds", apiextensionsv1.NamespaceScoped, "v1"))
	apply(t, testCRD(group, "Even", "evens", apiextensionsv1.NamespaceScoped, "v1"))
	e.publish(t, "missing-version", ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: group, Kind: "Lost", Version: "v7"},
	})
	pr = e.waitCondition(t, "missing-version", metav1.ConditionFalse, ferryv1alpha1.ReasonVersionNotFound)
	if msg := pr.Status.Conditions[0].Message; !strings.Contains(msg, "v7") {
		t.Errorf("VersionNotFound message should name the version: %q", msg)
	}
	e.publish(t, "bad-projection", ferryv1alpha1.PublishedResourceSpec{
		Resource:   ferryv1alpha1.SourceResource{APIGroup: group, Kind: "Warped", Version: "v1"},
		Projection: &ferryv1alpha1.ResourceProjection{Versions: map[string]string{"v9": "v2"}},
	})
	pr = e.waitCondition(t, "bad-projection", metav1.ConditionFalse, ferryv1alpha1.ReasonProjectionInvalid)
	if msg := pr.Status.Conditions[0].Message; !strings.Contains(msg, "v9") {
		t.Errorf("ProjectionInvalid message should name the bad version: %q", msg)
	}

	// Two PublishedResources projecting onto the same resource: the newer
	// one gets SchemaConflict, the older stays published.
	e.publish(t, "first-odd", ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: group, Kind: "Odd", Version: "v1"},
	})
	e.waitCondition(t, "first-odd", metav1.ConditionTrue, ferryv1alpha1.ReasonPublished)
	time.Sleep(1100 * time.Millisecond) // creation timestamps have one-second resolution
	e.publish(t, "second-odd", ferryv1alpha1.PublishedResourceSpec{
		Resource:   ferryv1alpha1.SourceResource{APIGroup: group, Kind: "Even", Version: "v1"},
		Projection: &ferryv1alpha1.ResourceProjection{Kind: "Odd"},
	})
	pr = e.waitCondition(t, "second-odd", metav1.ConditionFalse, ferryv1alpha1.ReasonSchemaConflict)
	if msg := pr.Status.Conditions[0].Message; !strings.Contains(msg, "first-odd") {
		t.Errorf("SchemaConflict message should name the other PublishedResource: %q", msg)
	}
	// A second PublishedResource on the same CRD (even under another name)
	// would take the first one's copies for its own: refused.
	e.publish(t, "odd-again", ferryv1alpha1.PublishedResourceSpec{
		Resource:   ferryv1alpha1.SourceResource{APIGroup: group, Kind: "Odd", Version: "v1"},
		Projection: &ferryv1alpha1.ResourceProjection{Kind: "Oddity"},
	})
	pr = e.waitCondition(t, "odd-again", metav1.ConditionFalse, ferryv1alpha1.ReasonLocalResourceClaimed)
	if msg := pr.Status.Conditions[0].Message; !strings.Contains(msg, "first-odd") {
		t.Errorf("LocalResourceClaimed message should name the elder: %q", msg)
	}
	e.waitCondition(t, "first-odd", metav1.ConditionTrue, ferryv1alpha1.ReasonPublished)

	// The CRD's validation refuses a change of spec.resource and a spec with
	// both version and versions.
	dyn, err := dynamic.NewForConfig(env.service.Config)
	if err != nil {
		t.Fatal(err)
	}
	prs := dyn.Resource(framework.PublishedResourceGVR)
	u, err := prs.Get(ctx, "first-odd", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(u.Object, "Late", "spec", "resource", "kind"); err != nil {
		t.Fatal(err)
	}
	if _, err := prs.Update(ctx, u, metav1.UpdateOptions{}); err == nil || !strings.Contains(err.Error(), "spec.resource is immutable") {
		t.Errorf("changing spec.resource: want a rejection saying it is immutable, got %v", err)
	}
	// Once published, the projected resource cannot change either.
	if u, err = prs.Get(ctx, "first-odd", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(u.Object, "oddballs", "spec", "projection", "plural"); err != nil {
		t.Fatal(err)
	}
	if _, err := prs.Update(ctx, u, metav1.UpdateOptions{}); err == nil || !strings.Contains(err.Error(), "cannot change once published") {
		t.Errorf("changing the projection of a published resource: want a rejection, got %v", err)
	}
	both, err := framework.ToUnstructured(&ferryv1alpha1.PublishedResource{
		TypeMeta:   metav1.TypeMeta{APIVersion: "ferry.dev/v1alpha1", Kind: "PublishedResource"},
		ObjectMeta: metav1.ObjectMeta{Name: "both-versions"},
		Spec: ferryv1alpha1.PublishedResourceSpec{Resource: ferryv1alpha1.SourceResource{
			APIGroup: group, Kind: "Odd", Version: "v1", Versions: []string{"v1"},
		}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := prs.Create(ctx, both, metav1.CreateOptions{}); err == nil || !strings.Contains(err.Error(), "set at most one of version and versions") {
		t.Errorf("version and versions together: want a rejection, got %v", err)
	}
}

func TestPublishTooLargeIsReportedWithoutDroppingTheStream(t *testing.T) {
	e := newPubEnv(t, "--max-message-bytes", "65536")
	group := "large.example.com"
	crd := testCRD(group, "Huge", "huges", apiextensionsv1.NamespaceScoped, "v1")
	crd.Spec.Versions[0].Schema.OpenAPIV3Schema.Description = strings.Repeat("x", 70_000)
	apply(t, crd)
	apply(t, testCRD(group, "Small", "smalls", apiextensionsv1.NamespaceScoped, "v1"))

	e.publish(t, "huge", ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: group, Kind: "Huge", Version: "v1"},
	})
	pr := e.waitCondition(t, "huge", metav1.ConditionFalse, ferryv1alpha1.ReasonTooLarge)
	if msg := pr.Status.Conditions[0].Message; !strings.Contains(msg, "65536") {
		t.Errorf("TooLarge message should name the limit: %q", msg)
	}
	// The stream survived: another PublishedResource still gets published,
	// and the edge never had to reconnect.
	e.publish(t, "small", ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: group, Kind: "Small", Version: "v1"},
	})
	e.waitCondition(t, "small", metav1.ConditionTrue, ferryv1alpha1.ReasonPublished)
	assertLogLacks(t, e.edge, "reconnecting")
}

func TestPublishWaitsForTheBroker(t *testing.T) {
	ctx := context.Background()
	e := newPubEnv(t)
	if err := e.broker.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	group := "waits.example.com"
	apply(t, testCRD(group, "Patient", "patients", apiextensionsv1.NamespaceScoped, "v1"))
	e.publish(t, "patients", ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: group, Kind: "Patient", Version: "v1"},
	})
	pr := e.waitCondition(t, "patients", metav1.ConditionFalse, ferryv1alpha1.ReasonBrokerUnavailable)
	if msg := pr.Status.Conditions[0].Message; !strings.Contains(msg, e.broker.Address) {
		t.Errorf("BrokerUnavailable message should name the broker address: %q", msg)
	}
	// The broker comes back: the edge reconnects and publishes by itself.
	if err := e.broker.Restart(ctx, false); err != nil {
		t.Fatal(err)
	}
	e.waitCondition(t, "patients", metav1.ConditionTrue, ferryv1alpha1.ReasonPublished)
}

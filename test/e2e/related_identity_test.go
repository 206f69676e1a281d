package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	apisv1alpha1 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha1"
	apisv1alpha2 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha2"
	"github.com/kcp-dev/logicalcluster/v3"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/pkg/projection"
	"github.com/ferry-dev/ferry/test/framework"
)

// otherProvider creates another provider's APIExport in a workspace of its
// own (name, under root), serving one namespaced kind (v1 only, any
// content), and returns the workspace and the export's identity hash.
func otherProvider(t testing.TB, name, group, kind, plural string) (logicalcluster.Path, string) {
	t.Helper()
	ctx := context.Background()
	path, err := framework.CreateWorkspace(ctx, env.kcp.Config, "root", name)
	if err != nil {
		t.Fatal(err)
	}
	client, err := framework.KCPClient(env.kcp.Config)
	if err != nil {
		t.Fatal(err)
	}
	ars := &apisv1alpha1.APIResourceSchema{
		ObjectMeta: metav1.ObjectMeta{Name: "v1." + plural + "." + group},
		Spec: apisv1alpha1.APIResourceSchemaSpec{
			Group: group, Scope: apiextensionsv1.NamespaceScoped,
			Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: kind, ListKind: kind + "List", Plural: plural, Singular: strings.ToLower(kind)},
			Versions: []apisv1alpha1.APIResourceVersion{{
				Name: "v1", Served: true, Storage: true,
				Schema: runtime.RawExtension{Raw: []byte(`{"type":"object","x-kubernetes-preserve-unknown-fields":true}`)},
			}},
		},
	}
	if _, err := client.Cluster(path).ApisV1alpha1().APIResourceSchemas().Create(ctx, ars, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	export := &apisv1alpha2.APIExport{
		ObjectMeta: metav1.ObjectMeta{Name: group},
		Spec:       apisv1alpha2.APIExportSpec{Resources: []apisv1alpha2.ResourceSchema{projection.ExportEntry(group, plural, ars.Name)}},
	}
	if _, err := client.Cluster(path).ApisV1alpha2().APIExports().Create(ctx, export, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	var hash string
	err = framework.Eventually(ctx, time.Minute, 250*time.Millisecond, func(ctx context.Context) (bool, string) {
		ex, err := client.Cluster(path).ApisV1alpha2().APIExports().Get(ctx, group, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		hash = ex.Status.IdentityHash
		return hash != "", "no status.identityHash yet"
	})
	if err != nil {
		t.Fatalf("APIExport %s in %s: %v", group, path, err)
	}
	return path, hash
}

// newPubEnvRelating is newPubEnv with a broker whose configuration lets
// the edge relate the resources named (resource.group) besides the
// defaults.
func newPubEnvRelating(t testing.TB, resources ...string) *pubEnv {
	t.Helper()
	e := &pubEnv{label: sanitize(t.Name()), path: env.provider}
	if len(e.label) > 63 {
		e.label = e.label[:63]
	}
	e.export = newExport(t)
	e.pki = newPKI(t, "pki", "edge", "admin")
	e.broker = startBroker(t, e.pki, config.Config{
		Edges: []config.Edge{{Identity: devpki.IdentityFor("edge"), APIExport: e.export,
			RelatedResources: append(slices.Clone(config.DefaultRelatedResources), resources...)}},
		Admins: []string{devpki.IdentityFor("admin")},
	})
	e.edge = e.startEdge(t)
	if _, err := framework.WaitEdgeState(context.Background(), adminConn(t, e.broker, e.pki), devpki.IdentityFor("edge"),
		ferryv1.EdgeState_EDGE_STATE_CONNECTED, time.Minute); err != nil {
		t.Fatal(err)
	}
	var err error
	if e.kcp, err = framework.KCPClient(env.kcp.Config); err != nil {
		t.Fatal(err)
	}
	return e
}

// identityEnv is a syncEnv whose PublishedResource relates a kind another
// APIExport provides (related, given the identity hash), bound in a
// consumer workspace that binds the other export too.
type identityEnv struct {
	*syncEnv
	gvr  schema.GroupVersionResource // the related kind, the same on both sides
	hash string
}

// newIdentityEnv creates another provider's APIExport serving
// group/kind/plural (workspace otherWS), the same kind as a CRD in the
// service cluster, and publishes primary with the related entry made by
// related(hash). The consumer binds the other provider's export, then
// ferry's, accepting its claims (the one with the identity hash among
// them).
func newIdentityEnv(t *testing.T, otherWS, group, kind, plural string, primary *apiextensionsv1.CustomResourceDefinition,
	related func(hash string) ferryv1alpha1.RelatedResourceSpec) *identityEnv {
	t.Helper()
	ctx := context.Background()
	otherPath, hash := otherProvider(t, otherWS, group, kind, plural)
	apply(t, testCRD(group, kind, plural, apiextensionsv1.NamespaceScoped, "v1"))

	p := newPubEnvRelating(t, plural+"."+group)
	apply(t, primary)
	p.publish(t, primary.Spec.Names.Plural, ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: primary.Spec.Group, Kind: primary.Spec.Names.Kind, Version: "v1"},
		Related:  []ferryv1alpha1.RelatedResourceSpec{related(hash)},
	})
	e := publishedSyncEnv(t, p, primary)

	claimed := false
	for _, c := range p.apiExport(t).Spec.PermissionClaims {
		claimed = claimed || (c.Group == group && c.Resource == plural && c.IdentityHash == hash)
	}
	if !claimed {
		t.Fatalf("no permission claim of %s.%s with identity %s: %+v", plural, group, hash, p.apiExport(t).Spec.PermissionClaims)
	}

	consumer, err := framework.CreateWorkspace(ctx, env.kcp.Config, "root", "c-"+p.label[:min(len(p.label), 60)])
	if err != nil {
		t.Fatal(err)
	}
	if err := framework.BindAPIExport(ctx, env.kcp.Config, consumer, otherPath, group); err != nil {
		t.Fatal(err)
	}
	if err := framework.BindAPIExport(ctx, env.kcp.Config, consumer, p.path, p.export.Name); err != nil {
		t.Fatal(err)
	}
	e.useConsumer(t, consumer)
	return &identityEnv{syncEnv: e, gvr: schema.GroupVersionResource{Group: group, Version: "v1", Resource: plural}, hash: hash}
}

// TestRelatedKindOfAnotherExport: a related entry with identityHash
// relates a kind another APIExport provides in kcp. Ferry's APIExport
// claims it with that identity; a consumer that binds both exports and
// accepts the claim gets the object it creates in kcp synced to the
// service cluster (where the same kind is a CRD), updates follow, and the
// copy goes with the primary.
func TestRelatedKindOfAnotherExport(t *testing.T) {
	ctx := context.Background()
	const group, kind = "quota.other.example.com", "Allotment"
	ie := newIdentityEnv(t, "idhash-other", group, kind, "allotments",
		testCRD("idhash.example.com", "Mailbox", "mailboxes", apiextensionsv1.NamespaceScoped, "v1"),
		func(hash string) ferryv1alpha1.RelatedResourceSpec {
			return ferryv1alpha1.RelatedResourceSpec{
				Identifier: "quota", Origin: ferryv1alpha1.OriginKCP, Group: group, Kind: kind, IdentityHash: hash,
				Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.quotaName"}},
			}
		})
	e, gvr := ie.syncEnv, ie.gvr

	kcpDyn, err := dynamic.NewForConfig(e.consumerConfig())
	if err != nil {
		t.Fatal(err)
	}
	allotments := kcpDyn.Resource(gvr).Namespace("default")
	if _, err := allotments.Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": group + "/v1", "kind": kind,
		"metadata": map[string]any{"name": "quota-a"},
		"spec":     map[string]any{"limit": "10"},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.createRemote(t, "default", "inbox", map[string]any{"quotaName": "quota-a"})
	local := e.waitLocal(t, "default", "inbox", func(*unstructured.Unstructured) (bool, string) { return true, "" })

	svcDyn, err := dynamic.NewForConfig(env.service.Config)
	if err != nil {
		t.Fatal(err)
	}
	localAllotments := svcDyn.Resource(gvr).Namespace(local.GetNamespace())
	waitLimit := func(want string) {
		t.Helper()
		waitFor(t, "the Allotment in the service cluster with limit "+want, func(ctx context.Context) (bool, string) {
			a, err := localAllotments.Get(ctx, "quota-a", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			got, _, _ := unstructured.NestedString(a.Object, "spec", "limit")
			return got == want, fmt.Sprintf("spec.limit %q", got)
		})
	}
	waitLimit("10")

	// Updates in kcp flow down.
	a, err := allotments.Get(ctx, "quota-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedField(a.Object, "20", "spec", "limit"); err != nil {
		t.Fatal(err)
	}
	if _, err := allotments.Update(ctx, a, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitLimit("20")

	// Deleting the primary removes the related copy, then the finalizer;
	// the consumer's own Allotment stays.
	if err := e.remote.Namespace("default").Delete(ctx, "inbox", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitRemote(t, "default", "inbox", func(_ *unstructured.Unstructured, err error) (bool, string) {
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	if _, err := localAllotments.Get(ctx, "quota-a", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the local Allotment outlived its primary: %v", err)
	}
	if _, err := allotments.Get(ctx, "quota-a", metav1.GetOptions{}); err != nil {
		t.Errorf("the consumer's Allotment: %v", err)
	}

	// Another identity for the resource the APIExport claims already is
	// refused, naming the identity to keep; the claim stays as accepted.
	changed := strings.Repeat("0", 64)
	e.publish(t, "mailboxes", ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: "idhash.example.com", Kind: "Mailbox", Version: "v1"},
		Related: []ferryv1alpha1.RelatedResourceSpec{{
			Identifier: "quota", Origin: ferryv1alpha1.OriginKCP, Group: group, Kind: kind, IdentityHash: changed,
			Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.quotaName"}},
		}},
	})
	msg := e.waitPRCondition(t, "mailboxes", ferryv1alpha1.ConditionPublished, metav1.ConditionFalse, ferryv1alpha1.ReasonBrokerRefused)
	if want := "already claims allotments." + group + " with identity " + ie.hash + ", and ferry never rewrites a claim consumers accepted: set identityHash to " + ie.hash; !strings.Contains(msg, want) {
		t.Errorf("refusal %q does not contain %q", msg, want)
	}
	for _, c := range e.apiExport(t).Spec.PermissionClaims {
		if c.Group == group && c.IdentityHash != ie.hash {
			t.Errorf("the APIExport claims %s with another identity: %+v", c.Resource, e.apiExport(t).Spec.PermissionClaims)
		}
	}
}

// TestRelatedKindOfAnotherExportFromService: the other way round, an
// object of a kind another APIExport provides, made in the service
// cluster, is written into the consumer's workspace through ferry's
// APIExport virtual workspace (the claim with the identity hash), and is
// deleted there with the primary.
func TestRelatedKindOfAnotherExportFromService(t *testing.T) {
	ctx := context.Background()
	const group, kind = "meter.other.example.com", "Reading"
	ie := newIdentityEnv(t, "idhash-other-svc", group, kind, "readings",
		testCRD("idhash-svc.example.com", "Meterbox", "meterboxes", apiextensionsv1.NamespaceScoped, "v1"),
		func(hash string) ferryv1alpha1.RelatedResourceSpec {
			return ferryv1alpha1.RelatedResourceSpec{
				Identifier: "reading", Origin: ferryv1alpha1.OriginService, Group: group, Kind: kind, IdentityHash: hash,
				Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.readingName"}},
			}
		})
	e, gvr := ie.syncEnv, ie.gvr

	e.createRemote(t, "default", "meter", map[string]any{"readingName": "latest"})
	local := e.waitLocal(t, "default", "meter", func(*unstructured.Unstructured) (bool, string) { return true, "" })
	svcDyn, err := dynamic.NewForConfig(env.service.Config)
	if err != nil {
		t.Fatal(err)
	}
	// The service's controller writes the Reading beside the local copy.
	if _, err := svcDyn.Resource(gvr).Namespace(local.GetNamespace()).Create(ctx, &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": group + "/v1", "kind": kind,
		"metadata": map[string]any{"name": "latest"},
		"spec":     map[string]any{"kwh": "42"},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kcpDyn, err := dynamic.NewForConfig(e.consumerConfig())
	if err != nil {
		t.Fatal(err)
	}
	readings := kcpDyn.Resource(gvr).Namespace("default")
	waitFor(t, "the Reading in the consumer's workspace", func(ctx context.Context) (bool, string) {
		r, err := readings.Get(ctx, "latest", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		got, _, _ := unstructured.NestedString(r.Object, "spec", "kwh")
		return got == "42", fmt.Sprintf("spec.kwh %q", got)
	})

	if err := e.remote.Namespace("default").Delete(ctx, "meter", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitRemote(t, "default", "meter", func(_ *unstructured.Unstructured, err error) (bool, string) {
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	waitFor(t, "the Reading gone from the consumer's workspace", func(ctx context.Context) (bool, string) {
		_, err := readings.Get(ctx, "latest", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

package e2e

import (
	"context"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/dynamic"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/test/framework"
)

// The tests in this file play a compromised peer: a broker that sends the
// edge intents it has no business sending, and an edge (its certificate
// stolen) that sends the broker claims the broker can check. Each side must
// refuse, answer with an error and write nothing.

// TestEdgeRefusesAMaliciousBroker: a broker that speaks the protocol
// correctly but is malicious cannot make a real edge write outside what its
// PublishedResources allow: not an unpublished kind (a ClusterRoleBinding),
// not into kube-system (through a workspace named like it, or through a
// related object's reference), not into a namespace ferry created for
// another workspace. Legitimate intents of the same stream still land.
func TestEdgeRefusesAMaliciousBroker(t *testing.T) {
	ctx := context.Background()
	pki := newPKI(t, "pki", "edge")
	exportName := "malicious.e2e.ferry.dev"
	broker := startFakeBroker(t, pki, exportName)

	label := sanitize(t.Name())
	if len(label) > 63 {
		label = label[:63]
	}
	suffix := rand.String(5)
	const agent = "mal-edge"
	wsA, wsB := "mal-a-"+suffix, "mal-b-"+suffix // logical clusters the broker makes up
	shared := "mal-shared-" + suffix             // ferry's namespace of ws-b, which a naming rule maps ws-a onto too

	kube := serviceKube(t)
	if _, err := kube.RbacV1().ClusterRoleBindings().Get(ctx, "evil-admin", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("ClusterRoleBinding evil-admin exists before the test (or cannot be read): %v", err)
	}
	// The namespace ferry created for workspace ws-b (made by hand here, as
	// the edge would have).
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: shared, Labels: map[string]string{naming.LabelAgent: agent, naming.LabelWorkspace: wsB},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	startEdge(t, agent, pki, "edge", broker.addr, "--published-resource-selector", testLabel+"="+label)
	// The edge installs its CRDs before it dials.
	broker.waitConnected(t, 2*time.Minute)

	const group = "malicious.example.com"
	boxes := testCRD(group, "Strongbox", "strongboxes", apiextensionsv1.NamespaceScoped, "v1")
	lockers := testCRD(group, "Locker", "lockers", apiextensionsv1.NamespaceScoped, "v1")
	apply(t, boxes)
	apply(t, lockers)
	publishLabelled := func(name string, spec ferryv1alpha1.PublishedResourceSpec) {
		t.Helper()
		apply(t, &ferryv1alpha1.PublishedResource{
			TypeMeta:   metav1.TypeMeta{APIVersion: "ferry.dev/v1alpha1", Kind: "PublishedResource"},
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{testLabel: label}},
			Spec:       spec,
		})
	}
	// Default naming (namespace = the workspace's logical cluster), and a
	// Secret from kcp whose namespace the primary's spec names.
	publishLabelled("strongboxes", ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: group, Kind: "Strongbox", Version: "v1"},
		Related: []ferryv1alpha1.RelatedResourceSpec{{
			Identifier: "creds", Origin: ferryv1alpha1.OriginKCP, Kind: "Secret",
			Reference: &ferryv1alpha1.RelatedResourceReference{
				Name:      ferryv1alpha1.ResourceLocator{Path: "spec.secretName"},
				Namespace: &ferryv1alpha1.ResourceLocator{Path: "spec.secretNamespace"},
			},
		}},
	})
	// A naming rule that maps every workspace's namespace "x" onto the
	// local namespace "x".
	publishLabelled("lockers", ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: group, Kind: "Locker", Version: "v1"},
		Naming:   &ferryv1alpha1.ResourceNaming{Namespace: "{{ .Namespace }}"},
	})
	for _, name := range []string{"strongboxes", "lockers"} {
		if _, err := framework.WaitPublishedCondition(ctx, env.service.Config, name, metav1.ConditionTrue, ferryv1alpha1.ReasonPublished, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	boxGVR, lockerGVR := broker.served(t, "strongboxes"), broker.served(t, "lockers")
	if boxGVR.GetGroup() != exportName || boxGVR.GetResource() != "strongboxes" {
		t.Fatalf("the fake broker served strongboxes as %v", boxGVR)
	}

	key := func(cluster string, gvr *ferryv1.GroupVersionResource, ns, name string) *ferryv1.ObjectKey {
		return &ferryv1.ObjectKey{Cluster: cluster, Resource: gvr, Namespace: ns, Name: name, Uid: string(uuid.NewUUID())}
	}
	box := func(name string, spec map[string]any) map[string]any {
		return map[string]any{
			"apiVersion": exportName + "/v1", "kind": "Strongbox",
			"metadata": map[string]any{"name": name, "namespace": "default"},
			"spec":     spec,
		}
	}
	applied := func(what string, res *ferryv1.IntentResult) {
		t.Helper()
		if res.GetError() != nil {
			t.Fatalf("%s: the edge refused a legitimate intent: %v", what, res.GetError())
		}
	}
	refused := func(what string, res *ferryv1.IntentResult, want ferryv1.ApplyErrorReason) {
		t.Helper()
		switch ae := res.GetError(); {
		case ae == nil:
			t.Errorf("%s: the edge applied it (local copy %s/%s)", what, res.GetLocalNamespace(), res.GetLocalName())
		case ae.GetReason() != want:
			t.Errorf("%s: refused with %s (%q), want %s", what, ae.GetReason(), ae.GetMessage(), want)
		default:
			t.Logf("%s: refused: %s %q", what, ae.GetReason(), ae.GetMessage())
			if want == ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN && ae.GetRetryable() {
				t.Errorf("%s: a forbidden placement must be final, got retryable", what)
			}
		}
	}

	// Legitimate: two strongboxes of ws-a. The first names a Secret in
	// kube-system, the second one in its own namespace.
	evilBox := key(wsA, boxGVR, "default", "evil-box")
	applied("upsert of ws-a's strongbox evil-box", broker.exchange(t, upsertIntent("strongboxes", evilBox,
		box("evil-box", map[string]any{"secretName": "evil-creds", "secretNamespace": "kube-system"}))))
	goodBox := key(wsA, boxGVR, "default", "good-box")
	goodRes := broker.exchange(t, upsertIntent("strongboxes", goodBox,
		box("good-box", map[string]any{"secretName": "own-creds", "secretNamespace": wsA})))
	applied("upsert of ws-a's strongbox good-box", goodRes)

	// (a) A kind no PublishedResource names, claimed to belong to one.
	crb := map[string]any{
		"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
		"metadata": map[string]any{"name": "evil-admin"},
		"roleRef":  map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
		"subjects": []any{map[string]any{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "mallory"}},
	}
	refused("(a) ClusterRoleBinding evil-admin", broker.exchange(t, upsertIntent("strongboxes",
		key(wsA, &ferryv1.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"}, "", "evil-admin"), crb)),
		ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_PUBLISHED)

	// (b) A workspace called kube-system: default naming would put its
	// copies into the existing namespace kube-system.
	refused("(b) strongbox of workspace kube-system", broker.exchange(t, upsertIntent("strongboxes",
		key("kube-system", boxGVR, "default", "evil"), box("evil", map[string]any{"fieldV1": "owned"}))),
		ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN)

	// (c) A Secret from kcp for evil-box, whose spec points into kube-system.
	secret := func(name string) map[string]any {
		return map[string]any{
			"apiVersion": "v1", "kind": "Secret",
			"metadata": map[string]any{"name": name, "namespace": "default"},
			"data":     map[string]any{"token": "ZXZpbA=="},
		}
	}
	secretsGVR := &ferryv1.GroupVersionResource{Version: "v1", Resource: "secrets"}
	evilSecret := upsertIntent("strongboxes", key(wsA, secretsGVR, "default", "evil-creds"), secret("evil-creds"))
	evilSecret.RelatedTo = &ferryv1.RelatedTo{Primary: evilBox, Identifier: "creds"}
	refused("(c) related Secret kube-system/evil-creds", broker.exchange(t, evilSecret), ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN)
	// ...or into ws-b's namespace, through a third strongbox of ws-a.
	tenantBox := key(wsA, boxGVR, "default", "tenant-box")
	applied("upsert of ws-a's strongbox tenant-box", broker.exchange(t, upsertIntent("strongboxes", tenantBox,
		box("tenant-box", map[string]any{"secretName": "stolen-creds", "secretNamespace": shared}))))
	tenantSecret := upsertIntent("strongboxes", key(wsA, secretsGVR, "default", "stolen-creds"), secret("stolen-creds"))
	tenantSecret.RelatedTo = &ferryv1.RelatedTo{Primary: tenantBox, Identifier: "creds"}
	refused("(c) related Secret in ws-b's namespace", broker.exchange(t, tenantSecret), ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN)
	// The same for good-box, whose reference stays in its own namespace,
	// lands: the refusal above is about the place, not the kind.
	goodSecret := upsertIntent("strongboxes", key(wsA, secretsGVR, "default", "own-creds"), secret("own-creds"))
	goodSecret.RelatedTo = &ferryv1.RelatedTo{Primary: goodBox, Identifier: "creds"}
	applied("related Secret of good-box", broker.exchange(t, goodSecret))

	// (d) Workspace ws-b's locker lands in ws-b's namespace; ws-a's, which
	// the naming rule maps onto the same namespace, does not.
	locker := func(ns, name string) map[string]any {
		return map[string]any{
			"apiVersion": exportName + "/v1", "kind": "Locker",
			"metadata": map[string]any{"name": name, "namespace": ns},
			"spec":     map[string]any{"fieldV1": name},
		}
	}
	applied("upsert of ws-b's locker", broker.exchange(t, upsertIntent("lockers", key(wsB, lockerGVR, shared, "own"), locker(shared, "own"))))
	refused("(d) ws-a's locker in ws-b's namespace", broker.exchange(t, upsertIntent("lockers",
		key(wsA, lockerGVR, shared, "grab"), locker(shared, "grab"))), ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN)
	// The same naming rule and a kcp namespace called kube-system.
	refused("(b) ws-a's locker of kcp namespace kube-system", broker.exchange(t, upsertIntent("lockers",
		key(wsA, lockerGVR, "kube-system", "grab"), locker("kube-system", "grab"))), ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN)

	// The service cluster: nothing of the above was written...
	dyn, err := dynamic.NewForConfig(env.service.Config)
	if err != nil {
		t.Fatal(err)
	}
	localBoxes := dyn.Resource(schema.GroupVersionResource{Group: group, Version: "v1", Resource: "strongboxes"})
	localLockers := dyn.Resource(schema.GroupVersionResource{Group: group, Version: "v1", Resource: "lockers"})
	if _, err := kube.RbacV1().ClusterRoleBindings().Get(ctx, "evil-admin", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("ClusterRoleBinding evil-admin: want NotFound, got %v", err)
	}
	if list, err := localBoxes.Namespace("kube-system").List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) != 0 {
		t.Errorf("strongboxes in kube-system: %v %v", err, itemNames(list))
	}
	if list, err := localLockers.Namespace("kube-system").List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) != 0 {
		t.Errorf("lockers in kube-system: %v %v", err, itemNames(list))
	}
	if list, err := localBoxes.List(ctx, metav1.ListOptions{LabelSelector: naming.LabelRemoteCluster + "=kube-system"}); err != nil || len(list.Items) != 0 {
		t.Errorf("copies of workspace kube-system: %v %v", err, itemNames(list))
	}
	if s, err := kube.CoreV1().Secrets("kube-system").Get(ctx, "evil-creds", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("Secret kube-system/evil-creds: want NotFound, got %v (labels %v)", err, s.GetLabels())
	}
	if list, err := kube.CoreV1().Secrets("kube-system").List(ctx, metav1.ListOptions{LabelSelector: naming.LabelAgent + "=" + agent}); err != nil || len(list.Items) != 0 {
		t.Errorf("Secrets of agent %s in kube-system: %v %d", agent, err, len(list.Items))
	}
	if list, err := localLockers.Namespace(shared).List(ctx, metav1.ListOptions{LabelSelector: naming.LabelRemoteCluster + "=" + wsA}); err != nil || len(list.Items) != 0 {
		t.Errorf("ws-a's lockers in ws-b's namespace %s: %v %v", shared, err, itemNames(list))
	}
	if list, err := kube.CoreV1().Secrets(shared).List(ctx, metav1.ListOptions{}); err != nil || len(list.Items) != 0 {
		t.Errorf("Secrets in ws-b's namespace %s: %v %d", shared, err, len(list.Items))
	}

	// ...while the legitimate intents did land.
	if ns, err := kube.CoreV1().Namespaces().Get(ctx, wsA, metav1.GetOptions{}); err != nil {
		t.Errorf("namespace of ws-a: %v", err)
	} else if ns.Labels[naming.LabelAgent] != agent || ns.Labels[naming.LabelWorkspace] != wsA {
		t.Errorf("namespace %s was not created by the edge for ws-a: labels %v", wsA, ns.Labels)
	}
	if list, err := localBoxes.Namespace(wsA).List(ctx, metav1.ListOptions{LabelSelector: naming.LabelRemoteCluster + "=" + wsA}); err != nil || len(list.Items) != 3 {
		t.Errorf("ws-a's strongboxes in %s: want evil-box, tenant-box and good-box, got %v %v", wsA, err, itemNames(list))
	}
	if s, err := kube.CoreV1().Secrets(wsA).Get(ctx, "own-creds", metav1.GetOptions{}); err != nil {
		t.Errorf("related Secret of good-box: %v", err)
	} else if s.Labels[naming.LabelRelatedTo] != goodBox.GetUid() {
		t.Errorf("related Secret %s/own-creds: labels %v", wsA, s.Labels)
	}
	if goodRes.GetLocalNamespace() != wsA {
		t.Errorf("good-box landed in %q, want %q", goodRes.GetLocalNamespace(), wsA)
	}
	if list, err := localLockers.Namespace(shared).List(ctx, metav1.ListOptions{LabelSelector: naming.LabelRemoteCluster + "=" + wsB}); err != nil || len(list.Items) != 1 {
		t.Errorf("ws-b's locker in %s: %v %v", shared, err, itemNames(list))
	}
	// The refusals did not cost the stream.
	if n := broker.connections(); n != 1 {
		t.Errorf("the edge connected %d times; refusals must not end the stream", n)
	}
}

// TestBrokerRefusesForgedReports: an edge's certificate in the wrong hands
// cannot make the broker release a finalizer it did not ask to release, or
// write status or related objects into an object it does not sync for that
// edge. Each forged report is answered with a final error and counted.
func TestBrokerRefusesForgedReports(t *testing.T) {
	ctx := context.Background()
	e := newSyncEnv(t, "forged.example.com", "Ledger", "ledgers", func(s *ferryv1alpha1.PublishedResourceSpec) {
		s.Filter = &ferryv1alpha1.ResourceFilter{Resource: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "blue"}}}
	})
	x := e.createRemote(t, "default", "x", map[string]any{"fieldV1": "in scope"})
	e.waitFinalizer(t, "default", "x", true)
	e.waitLocal(t, "default", "x", func(*unstructured.Unstructured) (bool, string) { return true, "" })
	y := e.createRemote(t, "default", "y", map[string]any{"fieldV1": "out of scope"}, "team=red")
	before := e.engineStatus(t).GetRefusedMessages()

	// The real edge goes; a fake one with its certificate takes its place.
	if err := e.edge.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitEdgeState(ctx, adminConn(t, e.broker, e.pki), devpki.IdentityFor("edge"),
		ferryv1.EdgeState_EDGE_STATE_DISCONNECTED, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	fake := dialFakeEdge(t, e.broker.Address, e.pki, "edge")

	gvr := &ferryv1.GroupVersionResource{Group: e.remoteGVR.Group, Version: e.remoteGVR.Version, Resource: e.remoteGVR.Resource}
	keyOf := func(u *unstructured.Unstructured) *ferryv1.ObjectKey {
		return &ferryv1.ObjectKey{Cluster: e.consumerLC, Resource: gvr, Namespace: u.GetNamespace(), Name: u.GetName(), Uid: string(u.GetUID())}
	}
	forged := map[uint64]string{
		1: "deletion confirmation for x (not being deleted)",
		2: "status report for y (outside the filter)",
		3: "related object report for y (outside the filter, no such related entry)",
	}
	fake.send(t, &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_DeletionConfirmation{DeletionConfirmation: &ferryv1.DeletionConfirmation{
		ReportId: 1, Key: keyOf(x),
	}}})
	fake.send(t, &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_StatusReport{StatusReport: &ferryv1.StatusReport{
		ReportId: 2, Key: keyOf(y), Status: []byte(`{"phase":"Forged"}`), LocalResourceVersion: "1",
	}}})
	fake.send(t, &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_RelatedObjectReport{RelatedObjectReport: &ferryv1.RelatedObjectReport{
		ReportId: 3, RelatedTo: &ferryv1.RelatedTo{Primary: keyOf(y), Identifier: "tls"},
		Resource: &ferryv1.GroupVersionResource{Version: "v1", Resource: "secrets"}, LocalNamespace: "kube-system", LocalName: "forged",
		State: &ferryv1.RelatedObjectReport_Object{Object: []byte(`{"apiVersion":"v1","kind":"Secret","data":{"token":"Zm9yZ2Vk"}}`)},
	}}})
	for id, res := range fake.waitReportResults(t, time.Minute, 1, 2, 3) {
		switch ae := res.GetError(); {
		case ae == nil:
			t.Errorf("%s: the broker accepted it", forged[id])
		case ae.GetRetryable():
			t.Errorf("%s: refused with a retryable error, want a final one: %v", forged[id], ae)
		default:
			t.Logf("%s: refused: %s %q", forged[id], ae.GetReason(), ae.GetMessage())
		}
	}

	// kcp: x keeps its finalizer, y got no status.
	gotX, err := e.remote.Namespace("default").Get(ctx, "x", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(gotX.GetFinalizers(), brokerFinalizer) || gotX.GetDeletionTimestamp() != nil {
		t.Errorf("x: finalizers %v, deletionTimestamp %v; want the broker's finalizer and no deletion", gotX.GetFinalizers(), gotX.GetDeletionTimestamp())
	}
	gotY, err := e.remote.Namespace("default").Get(ctx, "y", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st, found := gotY.Object["status"]; found {
		t.Errorf("y: status %v was written", st)
	}
	if len(gotY.GetFinalizers()) != 0 {
		t.Errorf("y (outside the filter) has finalizers %v", gotY.GetFinalizers())
	}
	list, err := e.consumerKube(t).CoreV1().Secrets("default").List(ctx, metav1.ListOptions{LabelSelector: naming.LabelRelatedTo})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 0 {
		t.Errorf("related copies were written in the consumer workspace: %d", len(list.Items))
	}

	// The broker counted the refusals (the deletion confirmation and the
	// status report; a related report for an entry that does not exist is
	// refused without being counted).
	after := e.engineStatus(t).GetRefusedMessages()
	if after < before+2 {
		t.Errorf("refusedMessages went from %d to %d; want at least 2 more", before, after)
	}
	t.Logf("refusedMessages %d → %d", before, after)
}

// itemNames lists the names of a list's items (nil-safe).
func itemNames(list *unstructured.UnstructuredList) []string {
	if list == nil {
		return nil
	}
	var out []string
	for _, u := range list.Items {
		out = append(out, u.GetNamespace()+"/"+u.GetName())
	}
	return out
}

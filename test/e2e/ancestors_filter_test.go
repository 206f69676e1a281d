package e2e

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// TestSyncNamespaceFilterByName: filter.namespace written as a namespace
// name (the seeds' spelling) is accepted by the real API server and syncs
// only objects in that kcp namespace; a value that is neither a name nor a
// selector (a number) is refused on the condition with what to write.
func TestSyncNamespaceFilterByName(t *testing.T) {
	ctx := context.Background()
	e := newSyncEnv(t, "nsbyname.example.com", "Logbook", "logbooks", func(s *ferryv1alpha1.PublishedResourceSpec) {
		s.Filter = &ferryv1alpha1.ResourceFilter{Namespace: &ferryv1alpha1.NamespaceFilter{Name: "my-app"}}
	})
	// Stored as the seeds write it: a string.
	dyn, err := dynamic.NewForConfig(e.serviceCluster().Config)
	if err != nil {
		t.Fatal(err)
	}
	pr, err := dyn.Resource(ferryv1alpha1.GroupVersion.WithResource("publishedresources")).Get(ctx, "logbooks", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got, _, _ := unstructured.NestedString(pr.Object, "spec", "filter", "namespace"); got != "my-app" {
		t.Fatalf("spec.filter.namespace stored as %v, want the string my-app", pr.Object["spec"])
	}
	kube := e.consumerKube(t)
	for _, name := range []string{"my-app", "other"} {
		if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.createRemote(t, "other", "l-other", map[string]any{"fieldV1": "o"})
	e.createRemote(t, "my-app", "l-mine", map[string]any{"fieldV1": "m"})
	e.waitLocal(t, "my-app", "l-mine", func(*unstructured.Unstructured) (bool, string) { return true, "" })
	if list, err := e.local.List(ctx, metav1.ListOptions{LabelSelector: naming.LabelNameHash + "=" + naming.Hash("l-other")}); err != nil || len(list.Items) != 0 {
		t.Fatalf("an object outside filter.namespace was synced: %v %d", err, len(list.Items))
	}

	// A number passes admission (the API server allows no rule on the
	// typeless field) and is refused on the condition.
	apply(t, testCRD("nsnumber.example.com", "Tally", "tallies", apiextensionsv1.NamespaceScoped, "v1"))
	bad := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "ferry.dev/v1alpha1", "kind": "PublishedResource",
		"metadata": map[string]any{"name": "tallies", "labels": map[string]any{testLabel: e.label}},
		"spec": map[string]any{
			"resource": map[string]any{"apiGroup": "nsnumber.example.com", "version": "v1", "kind": "Tally"},
			"filter":   map[string]any{"namespace": int64(42)},
		},
	}}
	applyTo(t, e.serviceCluster(), bad)
	got := e.waitCondition(t, "tallies", metav1.ConditionFalse, ferryv1alpha1.ReasonFilterInvalid)
	for _, c := range got.Status.Conditions {
		if c.Type == ferryv1alpha1.ConditionPublished && !strings.Contains(c.Message, "write a kcp namespace name (a string such as my-app) or a label selector") {
			t.Errorf("FilterInvalid message %q does not say what to write", c.Message)
		}
	}
}

package e2e

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// TestSyncNamingFiltersWorkspacesAndAdoption covers custom naming, a label
// filter, two PublishedResources side by side (one without a status
// subresource), two workspaces, overly long names and a local copy whose
// labels were tampered with.
func TestSyncNamingFiltersWorkspacesAndAdoption(t *testing.T) {
	ctx := context.Background()
	noStatus := testCRD("nostatus.example.com", "Plain", "plains", apiextensionsv1.NamespaceScoped, "v1")
	noStatus.Spec.Versions[0].Subresources = nil
	envs := newSyncEnvs(t, "c",
		publication{
			crd: testCRD("custom.example.com", "Box", "boxes", apiextensionsv1.NamespaceScoped, "v1"),
			spec: func(s *ferryv1alpha1.PublishedResourceSpec) {
				s.Naming = &ferryv1alpha1.ResourceNaming{Namespace: "boxes-$remoteClusterName", Name: "{{ .Namespace }}-{{ .Name }}"}
				s.Filter = &ferryv1alpha1.ResourceFilter{Resource: &metav1.LabelSelector{MatchLabels: map[string]string{"sync": "yes"}}}
			},
		},
		publication{crd: noStatus},
	)
	boxes, plains := envs[0], envs[1]

	// Custom naming, and the filter.
	boxes.createRemote(t, "default", "kept", map[string]any{"fieldV1": "a"}, "sync=yes")
	boxes.createRemote(t, "default", "ignored", map[string]any{"fieldV1": "b"})
	kept := boxes.waitLocal(t, "default", "kept", func(*unstructured.Unstructured) (bool, string) { return true, "" })
	if kept.GetNamespace() != "boxes-"+boxes.consumerLC || kept.GetName() != "default-kept" {
		t.Errorf("custom naming gave %s/%s", kept.GetNamespace(), kept.GetName())
	}

	// An overly long name is shortened, deterministically and within limits.
	long := strings.Repeat("l", 250)
	boxes.createRemote(t, "default", long, map[string]any{"fieldV1": "c"}, "sync=yes")
	longCopy := boxes.waitLocal(t, "default", long, func(*unstructured.Unstructured) (bool, string) { return true, "" })
	if want := naming.Shorten("default-"+long, 253); longCopy.GetName() != want {
		t.Errorf("long name became %q, want %q", longCopy.GetName(), want)
	}

	// The filtered-out object got neither a finalizer nor a local copy
	// (checked after later objects made it through).
	ignored, err := boxes.remote.Namespace("default").Get(ctx, "ignored", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(ignored.GetFinalizers()) != 0 {
		t.Errorf("a filtered-out object got finalizers %v", ignored.GetFinalizers())
	}
	if list, err := boxes.local.List(ctx, metav1.ListOptions{LabelSelector: naming.LabelNameHash + "=" + naming.Hash("ignored")}); err != nil || len(list.Items) != 0 {
		t.Errorf("a filtered-out object was synced: %v %v", err, list)
	}

	// Tampered labels: the next sync adopts the copy instead of creating a
	// second one.
	labels := kept.GetLabels()
	labels[naming.LabelNameHash] = "tampered"
	kept.SetLabels(labels)
	if _, err := boxes.local.Namespace(kept.GetNamespace()).Update(ctx, kept, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	remote, err := boxes.remote.Namespace("default").Get(ctx, "kept", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(remote.Object, "changed", "spec", "fieldV1")
	if _, err := boxes.remote.Namespace("default").Update(ctx, remote, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	boxes.waitLocal(t, "default", "kept", func(u *unstructured.Unstructured) (bool, string) {
		v, _ := specField(u, "fieldV1")
		return v == "changed", "spec.fieldV1 = " + v
	})
	all, err := boxes.local.Namespace(kept.GetNamespace()).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(all.Items); n != 2 { // kept and the long one
		t.Errorf("want 2 local boxes after adoption, got %d", n)
	}

	// The same namespace/name in a second workspace gets its own copy.
	other := *boxes
	other.useConsumer(t, bindConsumer(t, boxes.pubEnv, "d"))
	other.createRemote(t, "default", "kept", map[string]any{"fieldV1": "other"}, "sync=yes")
	otherCopy := other.waitLocal(t, "default", "kept", func(u *unstructured.Unstructured) (bool, string) {
		v, _ := specField(u, "fieldV1")
		return v == "other", "spec.fieldV1 = " + v
	})
	if otherCopy.GetNamespace() == kept.GetNamespace() {
		t.Errorf("two workspaces share local namespace %s", kept.GetNamespace())
	}

	// A CRD without a status subresource: local status never reaches kcp.
	plains.createRemote(t, "default", "p1", map[string]any{"fieldV1": "x"})
	p1 := plains.waitLocal(t, "default", "p1", func(*unstructured.Unstructured) (bool, string) { return true, "" })
	_ = unstructured.SetNestedField(p1.Object, "Ready", "status", "phase")
	if _, err := plains.local.Namespace(p1.GetNamespace()).Update(ctx, p1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A round trip through kcp after the local status change...
	r1, err := plains.remote.Namespace("default").Get(ctx, "p1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(r1.Object, "y", "spec", "fieldV1")
	if _, err := plains.remote.Namespace("default").Update(ctx, r1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	plains.waitLocal(t, "default", "p1", func(u *unstructured.Unstructured) (bool, string) {
		v, _ := specField(u, "fieldV1")
		return v == "y", "spec.fieldV1 = " + v
	})
	// ...and the kcp object still has no status.
	r1, err = plains.remote.Namespace("default").Get(ctx, "p1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st, found := r1.Object["status"]; found {
		t.Errorf("status was written back for a CRD without status subresource: %v", st)
	}
	assertLogLacks(t, boxes.edge, "reconnecting")
}

func TestSyncNamespaceFilter(t *testing.T) {
	ctx := context.Background()
	e := newSyncEnv(t, "nsfilter.example.com", "Ticket", "tickets", func(s *ferryv1alpha1.PublishedResourceSpec) {
		s.Filter = &ferryv1alpha1.ResourceFilter{Namespace: &ferryv1alpha1.NamespaceFilter{Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"env": "prod"}}}}
	})
	kube := e.consumerKube(t)
	for name, labels := range map[string]map[string]string{"prod": {"env": "prod"}, "dev": nil} {
		if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	e.createRemote(t, "dev", "t-dev", map[string]any{"fieldV1": "d"})
	e.createRemote(t, "prod", "t-prod", map[string]any{"fieldV1": "p"})
	e.waitLocal(t, "prod", "t-prod", func(*unstructured.Unstructured) (bool, string) { return true, "" })
	if list, err := e.local.List(ctx, metav1.ListOptions{LabelSelector: naming.LabelNameHash + "=" + naming.Hash("t-dev")}); err != nil || len(list.Items) != 0 {
		t.Fatalf("an object in a filtered-out namespace was synced: %v %d", err, len(list.Items))
	}
	// Labelling the namespace brings its objects in.
	ns, err := kube.CoreV1().Namespaces().Get(ctx, "dev", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ns.Labels = map[string]string{"env": "prod"}
	if _, err := kube.CoreV1().Namespaces().Update(ctx, ns, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitLocal(t, "dev", "t-dev", func(*unstructured.Unstructured) (bool, string) { return true, "" })
}

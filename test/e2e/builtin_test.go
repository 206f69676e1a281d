package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/test/framework"
)

// TestPublishBuiltinKinds is issue 21's acceptance for built-in kinds: the
// service cluster's ConfigMap, which no CRD defines, is published through
// its OpenAPI v3 schema (projected as AppSetting into the APIExport's
// group, without a status subresource); an AppSetting created in a bound
// workspace is copied into the service cluster as a ConfigMap, updated,
// and deleted with it. rbac Role is published schema-only
// (synchronization disabled), as a kind used only by related objects.
func TestPublishBuiltinKinds(t *testing.T) {
	p := newPubEnv(t)
	p.publish(t, "builtin-configmaps", ferryv1alpha1.PublishedResourceSpec{
		Resource:   ferryv1alpha1.SourceResource{APIGroup: "", Version: "v1", Kind: "ConfigMap"},
		Projection: &ferryv1alpha1.ResourceProjection{Kind: "AppSetting"},
	})
	p.publish(t, "builtin-roles", ferryv1alpha1.PublishedResourceSpec{
		Resource:        ferryv1alpha1.SourceResource{APIGroup: "rbac.authorization.k8s.io", Version: "v1", Kind: "Role"},
		Synchronization: &ferryv1alpha1.SynchronizationSpec{Enabled: ptr(false)},
	})
	pr := p.waitCondition(t, "builtin-configmaps", metav1.ConditionTrue, ferryv1alpha1.ReasonPublished)
	if !strings.Contains(conditionMessage(pr), "no status subresource") {
		t.Errorf("the Published condition does not say that ConfigMaps have no status: %q", conditionMessage(pr))
	}
	roles := p.waitCondition(t, "builtin-roles", metav1.ConditionTrue, ferryv1alpha1.ReasonPublished)
	for plural, want := range map[string]string{"appsettings": pr.Status.ResourceSchemaName, "roles": roles.Status.ResourceSchemaName} {
		got := p.schemas(t, plural)
		if len(got) != 1 || got[0].Name != want {
			t.Fatalf("kcp has schemas %v for %s, want %s", schemaNames(got), plural, want)
		}
		if sub := got[0].Spec.Versions[0].Subresources; sub.Status != nil {
			t.Errorf("%s has a status subresource in kcp", plural)
		}
		if exportSchema(p.apiExport(t), p.export.Name, plural) != want {
			t.Errorf("the APIExport does not serve %s from %s", plural, want)
		}
	}

	// render, given the service cluster's OpenAPI document, names the
	// schema the edge derived from discovery and the broker created.
	kube, err := kubernetes.NewForConfig(p.serviceCluster().Config)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := kube.Discovery().RESTClient().Get().AbsPath("/openapi/v3/api/v1").Do(context.Background()).Raw()
	if err != nil {
		t.Fatal(err)
	}
	docFile := filepath.Join(t.TempDir(), "core-v1.json")
	prFile := filepath.Join(t.TempDir(), "configmaps.yaml")
	writeFile(t, docFile, string(doc))
	writeFile(t, prFile, `apiVersion: ferry.dev/v1alpha1
kind: PublishedResource
metadata:
  name: builtin-configmaps
spec:
  resource: {apiGroup: "", version: v1, kind: ConfigMap}
  projection: {kind: AppSetting}
`)
	out, err := exec.Command(env.bins.Edge, "render", "-f", prFile, "--openapi", docFile, "--export", p.export.Name).CombinedOutput()
	if err != nil {
		t.Fatalf("ferry-edge render: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "\n  name: "+pr.Status.ResourceSchemaName+"\n") {
		t.Fatalf("render does not name the broker's schema %s:\n%s", pr.Status.ResourceSchemaName, out)
	}

	e := &syncEnv{pubEnv: p, remoteKind: pr.Status.ProjectedKind}
	e.remoteGVR = schema.GroupVersionResource{Group: p.export.Name, Version: "v1", Resource: "appsettings"}
	e.localGVR = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}
	svcDyn, err := dynamic.NewForConfig(p.serviceCluster().Config)
	if err != nil {
		t.Fatal(err)
	}
	e.local = svcDyn.Resource(e.localGVR)
	e.useConsumer(t, bindConsumer(t, p, "bi"))

	ctx := context.Background()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": e.remoteGVR.GroupVersion().String(), "kind": "AppSetting",
		"metadata": map[string]any{"name": "colours", "namespace": "default"},
		"data":     map[string]any{"colour": "blue"},
	}}
	if _, err := e.remote.Namespace("default").Create(ctx, obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dataIs := func(want string) func(*unstructured.Unstructured) (bool, string) {
		return func(u *unstructured.Unstructured) (bool, string) {
			got, _, _ := unstructured.NestedString(u.Object, "data", "colour")
			return got == want, fmt.Sprintf("data.colour %q, want %q", got, want)
		}
	}
	local := e.waitLocal(t, "default", "colours", dataIs("blue"))
	if local.GetKind() != "ConfigMap" || local.GetLabels()[naming.LabelRemoteResource] != naming.ResourceLabelValue(e.remoteGVR.GroupResource()) {
		t.Fatalf("local copy %s %s/%s with labels %v", local.GetKind(), local.GetNamespace(), local.GetName(), local.GetLabels())
	}
	t.Logf("AppSetting default/colours synced as ConfigMap %s/%s", local.GetNamespace(), local.GetName())

	if _, err := e.remote.Namespace("default").Patch(ctx, "colours", "application/merge-patch+json",
		[]byte(`{"data":{"colour":"green"}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitLocal(t, "default", "colours", dataIs("green"))

	// A ConfigMap has no generation: a local edit of its data is found by
	// its content, and repaired like a CRD object's spec.
	if _, err := e.local.Namespace(local.GetNamespace()).Patch(ctx, local.GetName(), "application/merge-patch+json",
		[]byte(`{"data":{"colour":"red"}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitLocal(t, "default", "colours", dataIs("green"))

	if err := e.remote.Namespace("default").Delete(ctx, "colours", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitRemote(t, "default", "colours", func(_ *unstructured.Unstructured, err error) (bool, string) {
		return apierrors.IsNotFound(err), fmt.Sprintf("still there (%v)", err)
	})
	err = framework.Eventually(ctx, time.Minute, 100*time.Millisecond, func(ctx context.Context) (bool, string) {
		_, err := e.local.Namespace(local.GetNamespace()).Get(ctx, local.GetName(), metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("the local ConfigMap is still there (%v)", err)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func conditionMessage(pr *ferryv1alpha1.PublishedResource) string {
	for _, c := range pr.Status.Conditions {
		if c.Type == ferryv1alpha1.ConditionPublished {
			return c.Message
		}
	}
	return ""
}

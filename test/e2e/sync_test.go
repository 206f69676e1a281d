package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kcp-dev/logicalcluster/v3"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/test/framework"
)

// syncEnv is a pubEnv with one published resource bound in a consumer
// workspace.
type syncEnv struct {
	*pubEnv
	consumer    logicalcluster.Path
	consumerLC  string
	remote      dynamic.NamespaceableResourceInterface // kcp side, in the consumer workspace
	local       dynamic.NamespaceableResourceInterface // service cluster
	remoteGVR   schema.GroupVersionResource
	localGVR    schema.GroupVersionResource
	remoteKind  string
	remoteGroup string
}

// publication is one CRD published by a PublishedResource named like its
// plural.
type publication struct {
	crd  *apiextensionsv1.CustomResourceDefinition
	spec func(*ferryv1alpha1.PublishedResourceSpec)
}

func newSyncEnv(t testing.TB, group, kind, plural string, spec func(*ferryv1alpha1.PublishedResourceSpec)) *syncEnv {
	t.Helper()
	envs := newSyncEnvs(t, "c", publication{crd: testCRD(group, kind, plural, apiextensionsv1.NamespaceScoped, "v1"), spec: spec})
	return envs[0]
}

// newSyncEnvs publishes every publication through one broker and edge,
// binds the export in a new consumer workspace and returns one syncEnv per
// publication.
func newSyncEnvs(t testing.TB, consumerPrefix string, pubs ...publication) []*syncEnv {
	t.Helper()
	return newSyncEnvsWith(t, nil, consumerPrefix, pubs...)
}

// newSyncEnvsWith is newSyncEnvs with extra broker flags.
func newSyncEnvsWith(t testing.TB, brokerArgs []string, consumerPrefix string, pubs ...publication) []*syncEnv {
	t.Helper()
	return newSyncEnvsArgs(t, brokerArgs, nil, nil, consumerPrefix, pubs...)
}

// newSyncEnvsArgs is newSyncEnvs with extra broker and edge flags, and
// edges dialling via(the broker's address) when via is set.
func newSyncEnvsArgs(t testing.TB, brokerArgs, edgeArgs []string, via func(string) string, consumerPrefix string, pubs ...publication) []*syncEnv {
	t.Helper()
	p := newPubEnvArgs(t, brokerArgs, edgeArgs, via)
	for _, pb := range pubs {
		apply(t, pb.crd)
		prSpec := ferryv1alpha1.PublishedResourceSpec{Resource: ferryv1alpha1.SourceResource{
			APIGroup: pb.crd.Spec.Group, Kind: pb.crd.Spec.Names.Kind, Version: "v1",
		}}
		if pb.spec != nil {
			pb.spec(&prSpec)
		}
		p.publish(t, pb.crd.Spec.Names.Plural, prSpec)
	}
	var out []*syncEnv
	for _, pb := range pubs {
		out = append(out, publishedSyncEnv(t, p, pb.crd))
	}
	consumer := bindConsumer(t, p, consumerPrefix)
	for _, e := range out {
		e.useConsumer(t, consumer)
	}
	return out
}

// publishedSyncEnv waits until crd's PublishedResource (named like its
// plural) is published through p and returns a syncEnv for it, not yet
// pointed at a consumer workspace.
func publishedSyncEnv(t testing.TB, p *pubEnv, crd *apiextensionsv1.CustomResourceDefinition) *syncEnv {
	t.Helper()
	pr := p.waitCondition(t, crd.Spec.Names.Plural, metav1.ConditionTrue, ferryv1alpha1.ReasonPublished)
	e := &syncEnv{pubEnv: p}
	parts := strings.SplitN(pr.Status.ServedResource, "/", 2)
	res, grp, _ := strings.Cut(parts[0], ".")
	e.remoteGVR = schema.GroupVersionResource{Group: grp, Version: parts[1], Resource: res}
	e.remoteKind = pr.Status.ProjectedKind
	e.localGVR = schema.GroupVersionResource{Group: crd.Spec.Group, Version: "v1", Resource: crd.Spec.Names.Plural}
	svcDyn, err := dynamic.NewForConfig(p.serviceCluster().Config)
	if err != nil {
		t.Fatal(err)
	}
	e.local = svcDyn.Resource(e.localGVR)
	return e
}

// bindConsumer creates a consumer workspace and binds the export there.
func bindConsumer(t testing.TB, p *pubEnv, prefix string) logicalcluster.Path {
	t.Helper()
	ctx := context.Background()
	name := prefix + "-" + p.label
	if len(name) > 63 {
		name = name[:63]
	}
	consumer, err := framework.CreateWorkspace(ctx, env.kcp.Config, "root", strings.TrimRight(name, "-"))
	if err != nil {
		t.Fatal(err)
	}
	if err := framework.BindAPIExport(ctx, env.kcp.Config, consumer, p.path, p.export.Name); err != nil {
		t.Fatal(err)
	}
	return consumer
}

// useConsumer points the env's kcp-side client at a consumer workspace.
func (e *syncEnv) useConsumer(t testing.TB, consumer logicalcluster.Path) {
	t.Helper()
	lc, err := e.kcp.Cluster(consumer).CoreV1alpha1().LogicalClusters().Get(context.Background(), "cluster", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.consumer, e.consumerLC = consumer, logicalcluster.From(lc).String()
	kcpDyn, err := dynamic.NewForConfig(e.consumerConfig())
	if err != nil {
		t.Fatal(err)
	}
	e.remote = kcpDyn.Resource(e.remoteGVR)
}

// consumerConfig is the kcp admin config pointed at the consumer workspace.
func (e *syncEnv) consumerConfig() *rest.Config {
	return workspaceConfig(e.kcpRootConfig(), e.consumer)
}

// workspaceConfig is a copy of kcp config cfg pointed at the workspace path.
func workspaceConfig(cfg *rest.Config, path logicalcluster.Path) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	base, _, _ := strings.Cut(cfg.Host, "/clusters/")
	cfg.Host = base + "/clusters/" + path.String()
	return cfg
}

// consumerKube is a Kubernetes client for the consumer workspace.
func (e *syncEnv) consumerKube(t testing.TB) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(e.consumerConfig())
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func (e *syncEnv) createRemote(t testing.TB, ns, name string, spec map[string]any, labels ...string) *unstructured.Unstructured {
	t.Helper()
	l := map[string]any{"team": "blue"}
	for _, kv := range labels {
		k, v, _ := strings.Cut(kv, "=")
		l[k] = v
	}
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": e.remoteGVR.GroupVersion().String(), "kind": e.remoteKind,
		"metadata": map[string]any{"name": name, "namespace": ns, "labels": l},
		"spec":     spec,
	}}
	got, err := e.remote.Namespace(ns).Create(context.Background(), obj, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// waitLocal waits until the local copy of ns/name satisfies check.
func (e *syncEnv) waitLocal(t testing.TB, ns, name string, check func(*unstructured.Unstructured) (bool, string)) *unstructured.Unstructured {
	t.Helper()
	var got *unstructured.Unstructured
	err := framework.Eventually(context.Background(), time.Minute, 100*time.Millisecond, func(ctx context.Context) (bool, string) {
		list, err := e.local.List(ctx, metav1.ListOptions{LabelSelector: naming.LabelRemoteCluster + "=" + e.consumerLC + "," +
			naming.LabelNamespaceHash + "=" + naming.Hash(ns) + "," + naming.LabelNameHash + "=" + naming.Hash(name)})
		if err != nil {
			return false, err.Error()
		}
		if len(list.Items) != 1 {
			return false, fmt.Sprintf("%d local copies", len(list.Items))
		}
		got = &list.Items[0]
		return check(got)
	})
	if err != nil {
		t.Fatalf("local copy of %s/%s: %v", ns, name, err)
	}
	return got
}

func (e *syncEnv) waitRemote(t testing.TB, ns, name string, check func(*unstructured.Unstructured, error) (bool, string)) {
	t.Helper()
	err := framework.Eventually(context.Background(), time.Minute, 100*time.Millisecond, func(ctx context.Context) (bool, string) {
		return check(e.remote.Namespace(ns).Get(ctx, name, metav1.GetOptions{}))
	})
	if err != nil {
		t.Fatalf("kcp object %s/%s: %v", ns, name, err)
	}
}

func specField(u *unstructured.Unstructured, f string) (string, bool) {
	v, found, _ := unstructured.NestedString(u.Object, "spec", f)
	return v, found
}

func TestSyncCreateUpdateStatusDelete(t *testing.T) {
	ctx := context.Background()
	e := newSyncEnv(t, "sync.example.com", "Bucket", "buckets", func(s *ferryv1alpha1.PublishedResourceSpec) {
		s.EnableWorkspacePaths = true
	})

	e.createRemote(t, "default", "photos", map[string]any{"fieldV1": "small", "color": "red"})
	local := e.waitLocal(t, "default", "photos", func(u *unstructured.Unstructured) (bool, string) {
		v, _ := specField(u, "fieldV1")
		return v == "small", "spec.fieldV1 = " + v
	})
	// Default naming: namespace = logical cluster, name = hashes.
	if local.GetNamespace() != e.consumerLC || local.GetName() != naming.Hash("default")+"-"+naming.Hash("photos") {
		t.Errorf("default naming gave %s/%s", local.GetNamespace(), local.GetName())
	}
	if local.GetLabels()["team"] != "blue" || local.GetAnnotations()[naming.AnnotationName] != "photos" {
		t.Errorf("labels/annotations not carried: %v %v", local.GetLabels(), local.GetAnnotations())
	}
	if got := local.GetAnnotations()[naming.AnnotationWorkspacePath]; got != e.consumer.String() {
		t.Errorf("enableWorkspacePaths: annotation %q, want %q", got, e.consumer.String())
	}
	e.waitRemote(t, "default", "photos", func(u *unstructured.Unstructured, err error) (bool, string) {
		if err != nil {
			return false, err.Error()
		}
		return slices.Contains(u.GetFinalizers(), "ferry.dev/edge"), fmt.Sprintf("finalizers %v", u.GetFinalizers())
	})

	// Another controller on the service cluster sets a field; it survives
	// the next sync. A field removed in kcp disappears locally.
	patch := []byte(`{"apiVersion":"` + e.localGVR.GroupVersion().String() + `","kind":"Bucket","spec":{"region":"eu"}}`)
	if _, err := e.local.Namespace(local.GetNamespace()).Patch(ctx, local.GetName(), types.ApplyPatchType, patch,
		metav1.PatchOptions{FieldManager: "other-controller"}); err != nil {
		t.Fatal(err)
	}
	remote, err := e.remote.Namespace("default").Get(ctx, "photos", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(remote.Object, "large", "spec", "fieldV1")
	unstructured.RemoveNestedField(remote.Object, "spec", "color")
	if _, err := e.remote.Namespace("default").Update(ctx, remote, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	local = e.waitLocal(t, "default", "photos", func(u *unstructured.Unstructured) (bool, string) {
		v, _ := specField(u, "fieldV1")
		_, colored := specField(u, "color")
		return v == "large" && !colored, fmt.Sprintf("spec %v", u.Object["spec"])
	})
	if region, _ := specField(local, "region"); region != "eu" {
		t.Errorf("a field set by another controller was lost: spec %v", local.Object["spec"])
	}

	// Status written locally (as a controller would) reaches kcp.
	_ = unstructured.SetNestedField(local.Object, "Ready", "status", "phase")
	if _, err := e.local.Namespace(local.GetNamespace()).UpdateStatus(ctx, local, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitRemote(t, "default", "photos", func(u *unstructured.Unstructured, err error) (bool, string) {
		if err != nil {
			return false, err.Error()
		}
		phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
		return phase == "Ready", "status.phase = " + phase
	})

	// Deleting in kcp deletes the local copy, then releases the finalizer.
	if err := e.remote.Namespace("default").Delete(ctx, "photos", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitRemote(t, "default", "photos", func(u *unstructured.Unstructured, err error) (bool, string) {
		if apierrors.IsNotFound(err) {
			return true, ""
		}
		return false, fmt.Sprintf("still there: %v finalizers %v", err, u.GetFinalizers())
	})
	if _, err := e.local.Namespace(local.GetNamespace()).Get(ctx, local.GetName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("local copy still exists after the kcp object is gone: %v", err)
	}
	// All of it happened on one stream: no message ended it.
	assertLogLacks(t, e.edge, "reconnecting")
}

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/test/framework"
)

// editLocal patches the local copy's spec as a person with kubectl edit
// would (another field manager, an update).
func (e *syncEnv) editLocal(t testing.TB, copy *unstructured.Unstructured, spec string) {
	t.Helper()
	if _, err := e.local.Namespace(copy.GetNamespace()).Patch(context.Background(), copy.GetName(), types.MergePatchType,
		[]byte(`{"spec":`+spec+`}`), metav1.PatchOptions{FieldManager: "kubectl-edit"}); err != nil {
		t.Fatal(err)
	}
}

// patchRemote merge-patches the kcp object default/name's spec.
func (e *syncEnv) patchRemote(t testing.TB, name, spec string) {
	t.Helper()
	if _, err := e.remote.Namespace("default").Patch(context.Background(), name, types.MergePatchType,
		[]byte(`{"spec":`+spec+`}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// specIs checks spec fields of a copy (an empty want means absent).
func specIs(want map[string]string) func(*unstructured.Unstructured) (bool, string) {
	return func(u *unstructured.Unstructured) (bool, string) {
		for f, w := range want {
			if got, _ := specField(u, f); got != w {
				return false, fmt.Sprintf("spec.%s = %q, want %q", f, got, w)
			}
		}
		return true, ""
	}
}

// TestLocalEdits: with spec.localEdits Keep, a local edit of a field kcp
// sets survives the drift repair's resend, an unrelated kcp change and an
// edge restart, and gives way when kcp changes that field (or removes it);
// with Repair (the default) it is undone at once.
func TestLocalEdits(t *testing.T) {
	envs := newSyncEnvs(t, "le",
		publication{crd: testCRD("localedits.example.com", "Kettle", "kettles", apiextensionsv1.NamespaceScoped, "v1"),
			spec: func(s *ferryv1alpha1.PublishedResourceSpec) { s.LocalEdits = ferryv1alpha1.LocalEditsKeep }},
		publication{crd: testCRD("localedits.example.com", "Ladle", "ladles", apiextensionsv1.NamespaceScoped, "v1")})
	keep, repair := envs[0], envs[1]

	// Repair (default): undone within seconds.
	repair.createRemote(t, "default", "l1", map[string]any{"fieldV1": "a"})
	lc := repair.waitLocal(t, "default", "l1", specIs(map[string]string{"fieldV1": "a"}))
	start := time.Now()
	repair.editLocal(t, lc, `{"fieldV1":"local"}`)
	repair.waitLocal(t, "default", "l1", specIs(map[string]string{"fieldV1": "a"}))
	t.Logf("Repair: a local edit undone after %s", time.Since(start).Round(time.Millisecond))

	// Keep.
	keep.createRemote(t, "default", "k1", map[string]any{"fieldV1": "a", "color": "red", "size": "s"})
	kc := keep.waitLocal(t, "default", "k1", specIs(map[string]string{"fieldV1": "a", "color": "red"}))
	if kc.GetAnnotations()[naming.AnnotationLastApplied] == "" {
		t.Errorf("the copy carries no %s annotation", naming.AnnotationLastApplied)
	}
	keep.editLocal(t, kc, `{"fieldV1":"local","size":"xl"}`)
	// The edit is drift: the edge asks the broker for the desired state,
	// applies it, and keeps the edit.
	waitLog(t, keep.edge, time.Minute, "changed outside ferry", "default/k1")
	time.Sleep(3 * time.Second)
	keep.waitLocal(t, "default", "k1", specIs(map[string]string{"fieldV1": "local", "size": "xl", "color": "red"}))

	// An unrelated kcp change: applied, the edit kept.
	keep.patchRemote(t, "k1", `{"color":"blue"}`)
	keep.waitLocal(t, "default", "k1", specIs(map[string]string{"fieldV1": "local", "size": "xl", "color": "blue"}))

	// An edge restart: the base is on the copy, the edit stays.
	keep.edge.Kill()
	keep.edge = keep.startEdge(t)
	keep.patchRemote(t, "k1", `{"color":"green"}`)
	keep.waitLocal(t, "default", "k1", specIs(map[string]string{"fieldV1": "local", "size": "xl", "color": "green"}))

	// kcp changes the edited field: its value wins.
	keep.patchRemote(t, "k1", `{"fieldV1":"b"}`)
	keep.waitLocal(t, "default", "k1", specIs(map[string]string{"fieldV1": "b", "size": "xl", "color": "green"}))

	// kcp removes an edited field: removed.
	keep.patchRemote(t, "k1", `{"size":null}`)
	got := keep.waitLocal(t, "default", "k1", func(u *unstructured.Unstructured) (bool, string) {
		_, has := specField(u, "size")
		return !has, "spec.size still set"
	})
	if ok, why := specIs(map[string]string{"fieldV1": "b", "color": "green"})(got); !ok {
		t.Error(why)
	}
}

// ownsField tells whether manager's managedFields entry on u covers
// spec.<field>.
func ownsField(u *unstructured.Unstructured, manager, field string) bool {
	for _, mf := range u.GetManagedFields() {
		if mf.Manager == manager && mf.FieldsV1 != nil && strings.Contains(string(mf.FieldsV1.Raw), `"f:`+field+`"`) {
			return true
		}
	}
	return false
}

// TestServiceOwnedPaths: a path in spec.serviceOwnedPaths is set from kcp
// when the copy is created and never applied again: the service's own
// change (an autoscaler's) survives kcp changes and the drift repair, while
// other fields keep syncing. Paths ferry cannot hand over are refused at
// admission with a message saying what to write.
func TestServiceOwnedPaths(t *testing.T) {
	ctx := context.Background()
	e := newSyncEnv(t, "serviceowned.example.com", "Mixer", "mixers", func(s *ferryv1alpha1.PublishedResourceSpec) {
		s.ServiceOwnedPaths = []string{"spec.replicas"}
	})

	e.createRemote(t, "default", "m1", map[string]any{"fieldV1": "a", "replicas": int64(3)})
	copy := e.waitLocal(t, "default", "m1", func(u *unstructured.Unstructured) (bool, string) {
		r, _, _ := unstructured.NestedInt64(u.Object, "spec", "replicas")
		switch {
		case r != 3:
			return false, fmt.Sprintf("spec.replicas = %d", r)
		case ownsField(u, edgeFieldManager, "replicas"):
			return false, "the edge's field manager still owns spec.replicas"
		case !ownsField(u, serviceOwnedFieldManager, "replicas"):
			return false, "spec.replicas not handed over"
		}
		return true, ""
	})

	// The service scales the copy.
	if _, err := e.local.Namespace(copy.GetNamespace()).Patch(ctx, copy.GetName(), types.MergePatchType,
		[]byte(`{"spec":{"replicas":5}}`), metav1.PatchOptions{FieldManager: "autoscaler"}); err != nil {
		t.Fatal(err)
	}
	// kcp changes replicas and another field: only the other one arrives.
	e.patchRemote(t, "m1", `{"replicas":7,"fieldV1":"b"}`)
	e.waitLocal(t, "default", "m1", specIs(map[string]string{"fieldV1": "b"}))
	// The drift repair's resend (the scale moved the generation) leaves it.
	time.Sleep(3 * time.Second)
	got := e.waitLocal(t, "default", "m1", specIs(map[string]string{"fieldV1": "b"}))
	if r, _, _ := unstructured.NestedInt64(got.Object, "spec", "replicas"); r != 5 {
		t.Errorf("spec.replicas = %d, want the service's 5", r)
	}

	// Refused at admission.
	dyn, err := dynamic.NewForConfig(env.service.Config)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ path, want string }{
		{"metadata.labels", "metadata, status, apiVersion and kind cannot be owned by the service cluster"},
		{"spec.ports.0.port", "a path cannot index into a list"},
		{"spec..replicas", "without empty segments"},
	} {
		bad, err := framework.ToUnstructured(&ferryv1alpha1.PublishedResource{
			TypeMeta:   metav1.TypeMeta{APIVersion: "ferry.dev/v1alpha1", Kind: "PublishedResource"},
			ObjectMeta: metav1.ObjectMeta{Name: "serviceowned-refused"},
			Spec: ferryv1alpha1.PublishedResourceSpec{
				Resource:          ferryv1alpha1.SourceResource{APIGroup: "serviceowned.example.com", Kind: "Mixer", Version: "v1"},
				ServiceOwnedPaths: []string{tc.path},
			},
		})
		if err != nil {
			t.Fatal(err)
		}
		_, err = dyn.Resource(framework.PublishedResourceGVR).Create(ctx, bad, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("serviceOwnedPaths [%s]: want a refusal saying %q, got %v", tc.path, tc.want, err)
		}
	}
}

// The edge's field managers (edge/replication).
const (
	edgeFieldManager         = "ferry-edge"
	serviceOwnedFieldManager = "ferry-edge-service-owned"
)

// createRemoteAnnotated creates the kcp object default/name with the
// consumer's deletion policy annotation.
func (e *syncEnv) createRemoteAnnotated(t testing.TB, name, policy string) {
	t.Helper()
	obj := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": e.remoteGVR.GroupVersion().String(), "kind": e.remoteKind,
		"metadata": map[string]any{"name": name, "namespace": "default",
			"annotations": map[string]any{ferryv1alpha1.AnnotationDeletionPolicy: policy}},
		"spec": map[string]any{"fieldV1": "kept?"},
	}}
	if _, err := e.remote.Namespace("default").Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestConsumerDeletionPolicy: a consumer deleting a kcp object annotated
// ferry.dev/deletion-policy: Orphan keeps its local copy (no longer
// ferry's) when the PublishedResource allows it; when it does not
// (consumerDeletionPolicy Ignore, the default), the copy is deleted and a
// Warning Event on the kcp object says why.
func TestConsumerDeletionPolicy(t *testing.T) {
	ctx := context.Background()
	envs := newSyncEnvs(t, "cdp",
		publication{crd: testCRD("consumerdeletion.example.com", "Reliquary", "reliquaries", apiextensionsv1.NamespaceScoped, "v1"),
			spec: func(s *ferryv1alpha1.PublishedResourceSpec) {
				s.ConsumerDeletionPolicy = ferryv1alpha1.ConsumerDeletionAllow
			}},
		publication{crd: testCRD("consumerdeletion.example.com", "Cubby", "cubbies", apiextensionsv1.NamespaceScoped, "v1")})
	allow, ignore := envs[0], envs[1]

	// Allowed: the copy stays, unlabelled, annotated with its origin.
	allow.createRemoteAnnotated(t, "v1", ferryv1alpha1.DeletionOrphan)
	copy := allow.waitLocal(t, "default", "v1", specIs(map[string]string{"fieldV1": "kept?"}))
	allow.waitFinalizer(t, "default", "v1", true)
	allow.deleteRemoteAndWaitGone(t, "default", "v1")
	got, err := allow.local.Namespace(copy.GetNamespace()).Get(ctx, copy.GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the orphaned copy is gone: %v", err)
	}
	if got.GetUID() != copy.GetUID() {
		t.Errorf("the orphaned copy was recreated (uid %s, was %s)", got.GetUID(), copy.GetUID())
	}
	for l := range got.GetLabels() {
		if strings.HasPrefix(l, "ferry.dev/") {
			t.Errorf("the orphaned copy keeps label %s", l)
		}
	}
	if from := got.GetAnnotations()[ferryv1alpha1.AnnotationOrphanedFrom]; !strings.Contains(from, "default/v1") {
		t.Errorf("%s = %q, want the kcp object named", ferryv1alpha1.AnnotationOrphanedFrom, from)
	}
	if v, _ := specField(got, "fieldV1"); v != "kept?" {
		t.Errorf("the orphaned copy's spec.fieldV1 = %q", v)
	}
	// A new kcp object at the same name finds the place taken: the orphan
	// is never overwritten.
	allow.createRemote(t, "default", "v1", map[string]any{"fieldV1": "new"})
	time.Sleep(5 * time.Second)
	if again, err := allow.local.Namespace(copy.GetNamespace()).Get(ctx, copy.GetName(), metav1.GetOptions{}); err != nil {
		t.Errorf("the orphan is gone after a new kcp object took its name: %v", err)
	} else if v, _ := specField(again, "fieldV1"); v != "kept?" {
		t.Errorf("the orphan was overwritten by a new kcp object: spec.fieldV1 = %q", v)
	}
	_ = allow.local.Namespace(copy.GetNamespace()).Delete(ctx, copy.GetName(), metav1.DeleteOptions{})

	// Ignored: deleted, and the consumer is told.
	ignore.createRemoteAnnotated(t, "l1", ferryv1alpha1.DeletionOrphan)
	ignore.waitLocal(t, "default", "l1", specIs(map[string]string{"fieldV1": "kept?"}))
	ignore.waitFinalizer(t, "default", "l1", true)
	ignore.deleteRemoteAndWaitGone(t, "default", "l1")
	ignore.waitNoLocalCopy(t, "default", "l1")
	kube := ignore.consumerKube(t)
	err = framework.Eventually(ctx, time.Minute, 200*time.Millisecond, func(ctx context.Context) (bool, string) {
		events, err := kube.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, ev := range events.Items {
			if ev.InvolvedObject.Name == "l1" && ev.Reason == "DeletionPolicyIgnored" && ev.Type == "Warning" &&
				strings.Contains(ev.Message, "does not allow it") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events, none DeletionPolicyIgnored for l1", len(events.Items))
	})
	if err != nil {
		t.Fatal(err)
	}
}

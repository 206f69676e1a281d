package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
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

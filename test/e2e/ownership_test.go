package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// TestTenantsNeverOverwriteEachOthersCopies: naming rules that map two
// workspaces' default/app onto one local object are refused unless the
// PublishedResource opts in; with the opt-in, the first workspace keeps its
// copy untouched and the second is told (a CONFLICT on its kcp object), and
// a local object ferry did not make is never written.
func TestTenantsNeverOverwriteEachOthersCopies(t *testing.T) {
	ctx := context.Background()
	shared := strings.TrimRight(strings.ToLower("shared-"+sanitize(t.Name())[:24]), "-")
	sharedNaming := func(optIn bool) *ferryv1alpha1.ResourceNaming {
		return &ferryv1alpha1.ResourceNaming{Namespace: shared, Name: naming.PlaceholderName, AllowNameCollisions: optIn}
	}
	envs := newSyncEnvs(t, "c", publication{
		crd:  testCRD("owners.example.com", "Coffer", "coffers", apiextensionsv1.NamespaceScoped, "v1"),
		spec: func(s *ferryv1alpha1.PublishedResourceSpec) { s.Naming = sharedNaming(true) },
	})
	first := envs[0]

	// Without the opt-in the same rules are refused, and say how to opt in.
	refusedCRD := testCRD("owners2.example.com", "Strongroom", "strongrooms", apiextensionsv1.NamespaceScoped, "v1")
	apply(t, refusedCRD)
	first.publish(t, "strongrooms", ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: refusedCRD.Spec.Group, Kind: "Strongroom", Version: "v1"},
		Naming:   sharedNaming(false),
	})
	pr := first.waitCondition(t, "strongrooms", metav1.ConditionFalse, ferryv1alpha1.ReasonNamingInvalid)
	if c := pr.Status.Conditions; len(c) == 0 || !strings.Contains(fmt.Sprint(c), "allowNameCollisions") {
		t.Errorf("the refusal does not say how to opt in: %v", c)
	}

	// The first workspace's default/app is copied to <shared>/app.
	first.createRemote(t, "default", "app", map[string]any{"fieldV1": "first"})
	copyBefore := first.waitLocal(t, "default", "app", func(u *unstructured.Unstructured) (bool, string) {
		v, _ := specField(u, "fieldV1")
		return v == "first", "spec.fieldV1 = " + v
	})
	if copyBefore.GetNamespace() != shared || copyBefore.GetName() != "app" {
		t.Fatalf("copy at %s/%s, want %s/app", copyBefore.GetNamespace(), copyBefore.GetName(), shared)
	}

	// The second workspace's default/app maps onto the same local object.
	second := *first
	second.useConsumer(t, bindConsumer(t, first.pubEnv, "d"))
	second.createRemote(t, "default", "app", map[string]any{"fieldV1": "second"})
	waitEvent(t, second.consumerKube(t), "default", "app", "SyncFailed", "maps both objects onto one local name")

	// A local object the service owner made is never written either.
	own := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": first.localGVR.GroupVersion().String(), "kind": "Coffer",
		"metadata": map[string]any{"name": "owned", "namespace": shared},
		"spec":     map[string]any{"fieldV1": "service owner's"},
	}}
	ownBefore, err := first.local.Namespace(shared).Create(ctx, own, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	first.createRemote(t, "default", "owned", map[string]any{"fieldV1": "consumer's"})
	waitEvent(t, first.consumerKube(t), "default", "owned", "SyncFailed", "was not created by ferry")

	// Both refusals are final: the first copy and the service owner's
	// object stay as they were, and nothing was deleted.
	first.assertLocalUntouched(t, copyBefore)
	first.assertLocalUntouched(t, ownBefore)

	// Deleting the second workspace's object releases it without touching
	// the first workspace's copy.
	second.deleteRemoteAndWaitGone(t, "default", "app")
	first.assertLocalUntouched(t, copyBefore)
}

package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/test/framework"
)

// waitOneCopyOf waits until the kcp object default/name carries the
// broker's finalizer, is not being deleted, and has exactly one local copy,
// carrying its current UID and satisfying check.
func (e *syncEnv) waitOneCopyOf(t testing.TB, name string, check func(*unstructured.Unstructured) (bool, string)) *unstructured.Unstructured {
	t.Helper()
	remote := e.waitFinalizer(t, "default", name, true)
	return e.waitLocal(t, "default", name, func(u *unstructured.Unstructured) (bool, string) {
		if got := u.GetAnnotations()[naming.AnnotationUID]; got != string(remote.GetUID()) {
			return false, fmt.Sprintf("the copy carries UID %s, the kcp object has %s", got, remote.GetUID())
		}
		return check(u)
	})
}

func fieldIs(f, want string) func(*unstructured.Unstructured) (bool, string) {
	return func(u *unstructured.Unstructured) (bool, string) {
		v, _ := specField(u, f)
		return v == want, "spec." + f + " = " + v
	}
}

// TestBookkeepingFollowsTheObjectsLifecycle: records keyed by the whole
// identity (UID included) and reset on every path. A filter flip-flop, a
// delete and recreate with the same manifest, and a PublishedResource
// withdrawn (invalid), fixed and published again each end with exactly one
// copy carrying the current UID and no kcp object Terminating; while the
// PublishedResource is invalid, deletions still complete.
func TestBookkeepingFollowsTheObjectsLifecycle(t *testing.T) {
	ctx := context.Background()
	e := newSyncEnv(t, "ledger.example.com", "Journal", "journals", func(s *ferryv1alpha1.PublishedResourceSpec) {
		s.Filter = &ferryv1alpha1.ResourceFilter{Resource: &metav1.LabelSelector{MatchLabels: map[string]string{"sync": "yes"}}}
	})

	// Filter flip-flop: out of the filter and back before the edge answers.
	e.createRemote(t, "default", "flip", map[string]any{"fieldV1": "a"}, "sync=yes")
	e.waitOneCopyOf(t, "flip", fieldIs("fieldV1", "a"))
	for _, v := range []string{"no", "yes"} {
		patch := []byte(`{"metadata":{"labels":{"sync":"` + v + `"}}}`)
		if _, err := e.remote.Namespace("default").Patch(ctx, "flip", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// A later change reaching the copy proves nothing is stuck behind the
	// flip-flop.
	patch := []byte(`{"spec":{"fieldV1":"after flip-flop"}}`)
	if _, err := e.remote.Namespace("default").Patch(ctx, "flip", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitOneCopyOf(t, "flip", fieldIs("fieldV1", "after flip-flop"))

	// Delete and recreate with the same manifest at once.
	e.createRemote(t, "default", "again", map[string]any{"fieldV1": "same"}, "sync=yes")
	e.waitOneCopyOf(t, "again", fieldIs("fieldV1", "same"))
	if err := e.remote.Namespace("default").Delete(ctx, "again", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	err := framework.Eventually(ctx, time.Minute, 20*time.Millisecond, func(ctx context.Context) (bool, string) {
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": e.remoteGVR.GroupVersion().String(), "kind": e.remoteKind,
			"metadata": map[string]any{"name": "again", "namespace": "default", "labels": map[string]any{"sync": "yes", "team": "blue"}},
			"spec":     map[string]any{"fieldV1": "same"},
		}}
		_, err := e.remote.Namespace("default").Create(ctx, obj, metav1.CreateOptions{})
		return err == nil, fmt.Sprint(err)
	})
	if err != nil {
		t.Fatalf("recreating: %v", err)
	}
	e.waitOneCopyOf(t, "again", fieldIs("fieldV1", "same"))

	// Withdrawn (an invalid mutation), deletions still complete; fixed, the
	// objects created meanwhile sync.
	e.createRemote(t, "default", "goes", map[string]any{"fieldV1": "x"}, "sync=yes")
	e.waitOneCopyOf(t, "goes", fieldIs("fieldV1", "x"))
	spec := ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: "ledger.example.com", Kind: "Journal", Version: "v1"},
		Filter:   &ferryv1alpha1.ResourceFilter{Resource: &metav1.LabelSelector{MatchLabels: map[string]string{"sync": "yes"}}},
	}
	invalid := spec
	invalid.Mutation = &ferryv1alpha1.ResourceMutationSpec{Spec: []ferryv1alpha1.ResourceMutation{
		{CEL: &ferryv1alpha1.CELMutation{Path: "spec.fieldV1", Expression: "self +"}},
	}}
	e.publish(t, "journals", invalid)
	e.waitCondition(t, "journals", metav1.ConditionFalse, ferryv1alpha1.ReasonMutationInvalid)
	e.deleteRemoteAndWaitGone(t, "default", "goes")
	e.waitNoLocalCopy(t, "default", "goes")
	e.createRemote(t, "default", "meanwhile", map[string]any{"fieldV1": "m"}, "sync=yes")
	e.publish(t, "journals", spec)
	e.waitCondition(t, "journals", metav1.ConditionTrue, ferryv1alpha1.ReasonPublished)
	e.waitOneCopyOf(t, "meanwhile", fieldIs("fieldV1", "m"))
	e.waitOneCopyOf(t, "again", fieldIs("fieldV1", "same"))
}

// TestSpecMutationReachesExistingCopies: a spec mutation added to a live
// PublishedResource reaches every existing copy, not only objects that
// change in kcp later.
func TestSpecMutationReachesExistingCopies(t *testing.T) {
	const objects = 100
	e := newSyncEnv(t, "reshape.example.com", "Shape", "shapes", nil)
	var wg sync.WaitGroup
	errs := make(chan error, objects)
	for i := range objects {
		wg.Add(1)
		go func() {
			defer wg.Done()
			obj := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": e.remoteGVR.GroupVersion().String(), "kind": e.remoteKind,
				"metadata": map[string]any{"name": fmt.Sprintf("s%03d", i), "namespace": "default"},
				"spec":     map[string]any{"fieldV1": "v"},
			}}
			if _, err := e.remote.Namespace("default").Create(context.Background(), obj, metav1.CreateOptions{}); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	countCopies := func(check func(*unstructured.Unstructured) bool) func(context.Context) (bool, string) {
		return func(context.Context) (bool, string) {
			n := 0
			for _, u := range e.localCopies(t, "") {
				if check(&u) {
					n++
				}
			}
			return n == objects, fmt.Sprintf("%d of %d copies", n, objects)
		}
	}
	if err := framework.Eventually(context.Background(), 2*time.Minute, 200*time.Millisecond,
		countCopies(func(*unstructured.Unstructured) bool { return true })); err != nil {
		t.Fatal(err)
	}
	e.publish(t, "shapes", ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: "reshape.example.com", Kind: "Shape", Version: "v1"},
		Mutation: &ferryv1alpha1.ResourceMutationSpec{Spec: []ferryv1alpha1.ResourceMutation{
			{Template: &ferryv1alpha1.TemplateMutation{Path: "spec.reshaped", Template: "yes"}},
		}},
	})
	if err := framework.Eventually(context.Background(), 2*time.Minute, 200*time.Millisecond, countCopies(func(u *unstructured.Unstructured) bool {
		v, _ := specField(u, "reshaped")
		return v == "yes"
	})); err != nil {
		t.Fatalf("the new mutation did not reach the existing copies: %v", err)
	}
}

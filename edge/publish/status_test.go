package publish

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

// TestStatusIsWrittenOverAStaleCache: the reconciler writes Pending, and
// the broker's answer is reconciled before the cache shows Pending. The
// cached object still says Published (from before a restart of the
// stream), equal to what the answer calls for; the write must not be
// skipped, or the status stays Pending.
func TestStatusIsWrittenOverAStaleCache(t *testing.T) {
	ctx := context.Background()
	scheme := runtime.NewScheme()
	if err := ferryv1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	published := metav1.Condition{Type: ferryv1alpha1.ConditionPublished, Status: metav1.ConditionTrue, Reason: ferryv1alpha1.ReasonPublished, Message: "ok", ObservedGeneration: 1}
	pr := &ferryv1alpha1.PublishedResource{ObjectMeta: metav1.ObjectMeta{Name: "widgets", Generation: 1}}
	pr.Status.ObservedGeneration = 1
	meta.SetStatusCondition(&pr.Status.Conditions, published)
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(pr).WithStatusSubresource(pr).Build()
	r := &Reconciler{Client: c}

	stale := &ferryv1alpha1.PublishedResource{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(pr), stale); err != nil {
		t.Fatal(err)
	}
	if err := r.setStatus(ctx, stale.DeepCopy(), metav1.ConditionFalse, ferryv1alpha1.ReasonPending, "waiting", nil); err != nil {
		t.Fatal(err)
	}
	// The answer, reconciled with the stale copy (it still shows Published).
	err := r.setStatus(ctx, stale.DeepCopy(), metav1.ConditionTrue, ferryv1alpha1.ReasonPublished, "ok", nil)
	if err == nil {
		t.Log("written over the stale copy")
	} // a conflict is fine: the controller retries with a fresh copy
	fresh := &ferryv1alpha1.PublishedResource{}
	if err := c.Get(ctx, client.ObjectKeyFromObject(pr), fresh); err != nil {
		t.Fatal(err)
	}
	if err == nil {
		if got := meta.FindStatusCondition(fresh.Status.Conditions, ferryv1alpha1.ConditionPublished); got.Reason != ferryv1alpha1.ReasonPublished {
			t.Fatalf("the answer was not written: Published reason %s", got.Reason)
		}
		return
	}
	if err := r.setStatus(ctx, fresh, metav1.ConditionTrue, ferryv1alpha1.ReasonPublished, "ok", nil); err != nil {
		t.Fatal(err)
	}
	if err := c.Get(ctx, client.ObjectKeyFromObject(pr), fresh); err != nil {
		t.Fatal(err)
	}
	if got := meta.FindStatusCondition(fresh.Status.Conditions, ferryv1alpha1.ConditionPublished); got.Reason != ferryv1alpha1.ReasonPublished {
		t.Fatalf("the answer was not written after the retry: Published reason %s", got.Reason)
	}
}

func TestVirtualWorkspaceCondition(t *testing.T) {
	for _, tc := range []struct {
		name       string
		export     *ferryv1.ExportStatus
		wantStatus metav1.ConditionStatus
		wantReason string
		wantText   string
	}{
		{name: "no report yet", wantStatus: metav1.ConditionUnknown, wantReason: ferryv1alpha1.ReasonExportStatusUnknown, wantText: "not reported"},
		{name: "not bound anywhere", export: &ferryv1.ExportStatus{WaitingFor: "APIExportEndpointSlice root:p/e to list a virtual workspace URL"},
			wantStatus: metav1.ConditionFalse, wantReason: ferryv1alpha1.ReasonWaitingForBinding, wantText: "waiting for APIExportEndpointSlice"},
		{name: "a shard unreachable", export: &ferryv1.ExportStatus{VirtualWorkspaceReady: true, WaitingFor: "virtual workspace endpoints the broker cannot reach"},
			wantStatus: metav1.ConditionFalse, wantReason: ferryv1alpha1.ReasonEndpointsUnreachable, wantText: "cannot reach"},
		{name: "watched", export: &ferryv1.ExportStatus{VirtualWorkspaceReady: true, Endpoints: []*ferryv1.VirtualWorkspaceEndpoint{{Url: "a"}, {Url: "b"}}},
			wantStatus: metav1.ConditionTrue, wantReason: ferryv1alpha1.ReasonVirtualWorkspaceReady, wantText: "at 2 endpoint(s)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := virtualWorkspaceCondition(tc.export, 3)
			if c.Type != ferryv1alpha1.ConditionVirtualWorkspaceReady || c.Status != tc.wantStatus || c.Reason != tc.wantReason ||
				!strings.Contains(c.Message, tc.wantText) || c.ObservedGeneration != 3 {
				t.Fatalf("condition %+v, want %s/%s saying %q", c, tc.wantStatus, tc.wantReason, tc.wantText)
			}
		})
	}
}

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

	"github.com/ferry-dev/ferry/test/framework"
)

// TestSyncFailureIsVisibleInKCPAndRecovers makes the service cluster reject
// an object (a ValidatingAdmissionPolicy), expects a Warning Event on the
// kcp object saying why and no repeats (a refusal is final), then removes
// the policy, changes the object in kcp and expects it to sync.
func TestSyncFailureIsVisibleInKCPAndRecovers(t *testing.T) {
	ctx := context.Background()
	e := newSyncEnv(t, "failing.example.com", "Gizmo", "gizmos", nil)
	lift := denyFieldV1(t, e, "failing.example.com", "Gizmo", "gizmos")

	e.createRemote(t, "default", "bad", map[string]any{"fieldV1": "forbidden"})

	// The kcp user sees why.
	consumerKube := e.consumerKube(t)
	err := framework.Eventually(ctx, time.Minute, 200*time.Millisecond, func(ctx context.Context) (bool, string) {
		events, err := consumerKube.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		for _, ev := range events.Items {
			if ev.InvolvedObject.Name == "bad" && ev.Reason == "SyncFailed" && ev.Type == "Warning" &&
				strings.Contains(ev.Message, "fieldV1 may not be forbidden here") {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d events, none SyncFailed for bad with the policy's message", len(events.Items))
	})
	if err != nil {
		t.Fatal(err)
	}

	// A refusal is final: not retried (and not one Event per retry) until
	// the object changes. Before, it was retried with backoff (1 s, 2 s,
	// 4 s, …) and every retry created another Event.
	time.Sleep(15 * time.Second)
	events, err := consumerKube.CoreV1().Events("default").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var count int32
	for _, ev := range events.Items {
		if ev.InvolvedObject.Name == "bad" && ev.Reason == "SyncFailed" {
			n++
			count += ev.Count
		}
	}
	if n != 1 || count > 2 {
		t.Errorf("15 s after the refusal: %d SyncFailed Events with a total count of %d, want one Event counted at most twice", n, count)
	}

	// The cause goes away and the object changes in kcp: it syncs.
	lift()
	if _, err := e.remote.Namespace("default").Patch(ctx, "bad", types.MergePatchType, []byte(`{"spec":{"color":"green"}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitLocal(t, "default", "bad", func(u *unstructured.Unstructured) (bool, string) {
		v, _ := specField(u, "fieldV1")
		return v == "forbidden", "spec.fieldV1 = " + v
	})
}

// TestStatusTooLargeIsAWarningEvent: a local status larger than the broker
// accepts becomes a Warning Event on the kcp object, the stream stays up,
// and the next status that fits is synced.
func TestStatusTooLargeIsAWarningEvent(t *testing.T) {
	ctx := context.Background()
	e := newSyncEnvsWith(t, []string{"--max-message-bytes", "65536"}, "c",
		publication{crd: testCRD("bulky.example.com", "Bulk", "bulks", apiextensionsv1.NamespaceScoped, "v1")})[0]
	e.createRemote(t, "default", "big", map[string]any{"fieldV1": "v1"})
	local := e.waitLocal(t, "default", "big", func(*unstructured.Unstructured) (bool, string) { return true, "" })
	attachments := e.engineStatus(t).GetAttachments()

	huge := strings.Repeat("x", 100*1024)
	if _, err := e.local.Namespace(local.GetNamespace()).Patch(ctx, local.GetName(), types.MergePatchType,
		[]byte(`{"status":{"phase":"`+huge+`"}}`), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	waitEvent(t, e.consumerKube(t), "default", "big", "StatusNotSynced", "more than the broker accepts (65536)")

	if _, err := e.local.Namespace(local.GetNamespace()).Patch(ctx, local.GetName(), types.MergePatchType,
		[]byte(`{"status":{"phase":"small"}}`), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	e.waitRemote(t, "default", "big", func(u *unstructured.Unstructured, err error) (bool, string) {
		if err != nil {
			return false, err.Error()
		}
		p, _, _ := unstructured.NestedString(u.Object, "status", "phase")
		return p == "small", fmt.Sprintf("status.phase has %d bytes", len(p))
	})
	if got := e.engineStatus(t).GetAttachments(); got != attachments {
		t.Errorf("the stream was replaced: %d attachments before the large status, %d after", attachments, got)
	}
}

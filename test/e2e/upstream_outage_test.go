package e2e

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/ferry-dev/ferry/test/framework"
)

// TestBrokerRidesOutKCPOutage kills kcp and keeps it away for 30 s (this file sorts last: kcp
// is shared, and every test before it runs against the first kcp process).
// The broker and the edge stay up and connected; a status set locally during
// the outage reaches kcp once it is back, and a change made in kcp after
// that reaches the service cluster.
func TestBrokerRidesOutKCPOutage(t *testing.T) {
	const outage = 60 * time.Second // kcp then takes ~10 s to be ready
	ctx := context.Background()
	e := newSyncEnv(t, "upstream.example.com", "Hull", "hulls", nil)
	e.createRemote(t, "default", "hull", map[string]any{"fieldV1": "before"})
	local := e.waitLocal(t, "default", "hull", fieldV1Is("before"))
	// A deletion whose local copy is held by a finalizer of the service
	// cluster: it is confirmed during the outage.
	e.createRemote(t, "default", "doomed", map[string]any{"fieldV1": "x"})
	doomed := e.waitLocal(t, "default", "doomed", fieldV1Is("x"))
	if _, err := e.local.Namespace(doomed.GetNamespace()).Patch(ctx, doomed.GetName(), types.MergePatchType,
		[]byte(`{"metadata":{"finalizers":["e2e.ferry.dev/hold"]}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.remote.Namespace("default").Delete(ctx, "doomed", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitLocal(t, "default", "doomed", func(u *unstructured.Unstructured) (bool, string) {
		return u.GetDeletionTimestamp() != nil, "not being deleted yet"
	})
	attachments := e.engineStatus(t).GetAttachments()

	restarted := make(chan error, 1)
	down := time.Now()
	go func() { restarted <- env.kcp.Crash(ctx, outage) }()
	time.Sleep(2 * time.Second)
	// The broker is not ready without kcp, and says why; it stays alive.
	waitProbe(t, e.broker.Process, "/readyz", http.StatusInternalServerError, "[-]kcp failed: kcp is not reachable")
	waitProbe(t, e.broker.Process, "/healthz", http.StatusOK, "")
	// A steady status stream while kcp is away (the broker cannot write
	// it), and the held copy goes (its deletion is confirmed).
	if _, err := e.local.Namespace(doomed.GetNamespace()).Patch(ctx, doomed.GetName(), types.MergePatchType,
		[]byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	last := ""
	for i := 0; time.Since(down) < outage-5*time.Second; i++ {
		last = fmt.Sprintf("set-during-outage-%d", i)
		if _, err := e.local.Namespace(local.GetNamespace()).Patch(ctx, local.GetName(), types.MergePatchType,
			[]byte(`{"status":{"phase":"`+last+`"}}`), metav1.PatchOptions{}, "status"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Second)
	}
	if err := <-restarted; err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	t.Logf("kcp ready again after an outage of %s", back.Sub(down).Round(time.Second))
	// The test's kcp clients again, with kcp-admin's new token.
	kcpClient, err := framework.KCPClient(env.kcp.Config)
	if err != nil {
		t.Fatal(err)
	}
	e.kcp = kcpClient
	e.useConsumer(t, e.consumer)
	assertRunning(t, e.broker.Process)
	assertRunning(t, e.edge)
	waitProbe(t, e.broker.Process, "/readyz", http.StatusOK, "[+]kcp ok")

	e.waitRemote(t, "default", "hull", func(u *unstructured.Unstructured, err error) (bool, string) {
		if err != nil {
			return false, err.Error()
		}
		p, _, _ := unstructured.NestedString(u.Object, "status", "phase")
		return p == last, "status.phase = " + p
	})
	statusBack := time.Since(back)
	e.waitRemote(t, "default", "doomed", func(u *unstructured.Unstructured, err error) (bool, string) {
		if err != nil {
			return apierrors.IsNotFound(err), err.Error()
		}
		return false, fmt.Sprintf("still there, finalizers %v", u.GetFinalizers())
	})
	releasedBack := time.Since(back)
	t.Logf("after kcp was ready again: the last status set during the outage was in kcp after %s, the deletion confirmed during it released after %s",
		statusBack.Round(time.Millisecond), releasedBack.Round(time.Millisecond))
	// Report retries back off to 5 s at most and restart when kcp answers
	// (issue 18 asks for 10 s); the bound leaves room for a loaded machine.
	if releasedBack > 20*time.Second || statusBack > 20*time.Second {
		t.Errorf("reports reached kcp %s (status) and %s (deletion) after it was back, want seconds", statusBack, releasedBack)
	}

	changed := time.Now()
	e.setRemoteField(t, "hull", "after")
	e.waitLocal(t, "default", "hull", fieldV1Is("after"))
	took := time.Since(changed)
	t.Logf("a change made in kcp after the outage was applied locally in %s", took.Round(time.Millisecond))
	if took > 15*time.Second {
		t.Errorf("the broker saw a kcp change %s late after the outage, want at most 15s (its watches' retry backoff)", took.Round(time.Millisecond))
	}
	if got := e.engineStatus(t).GetAttachments(); got != attachments {
		t.Errorf("the edge's stream was replaced during the kcp outage: %d attachments before, %d after", attachments, got)
	}
}

package e2e

import (
	"context"
	"net/http"
	"testing"
	"time"

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
	const outage = 30 * time.Second // kcp then takes ~10 s to be ready
	ctx := context.Background()
	e := newSyncEnv(t, "upstream.example.com", "Hull", "hulls", nil)
	e.createRemote(t, "default", "hull", map[string]any{"fieldV1": "before"})
	local := e.waitLocal(t, "default", "hull", fieldV1Is("before"))
	attachments := e.engineStatus(t).GetAttachments()

	restarted := make(chan error, 1)
	down := time.Now()
	go func() { restarted <- env.kcp.Crash(ctx, outage) }()
	time.Sleep(2 * time.Second)
	// The local status changes while kcp is away: the broker cannot write it.
	if _, err := e.local.Namespace(local.GetNamespace()).Patch(ctx, local.GetName(), types.MergePatchType,
		[]byte(`{"status":{"phase":"set-during-outage"}}`), metav1.PatchOptions{}, "status"); err != nil {
		t.Fatal(err)
	}
	// The broker is not ready without kcp, and says why; it stays alive.
	waitProbe(t, e.broker.Process, "/readyz", http.StatusInternalServerError, "[-]kcp failed: kcp is not reachable")
	waitProbe(t, e.broker.Process, "/healthz", http.StatusOK, "")
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
		return p == "set-during-outage", "status.phase = " + p
	})
	t.Logf("the status set during the outage was in kcp %s after kcp was ready", time.Since(back).Round(time.Millisecond))

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

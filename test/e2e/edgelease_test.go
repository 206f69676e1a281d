package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/edgelease"
	"github.com/ferry-dev/ferry/broker/server"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/test/framework"
)

// TestEdgeLeaseShowsConnectedThenDisconnected: the platform team sees in
// the APIExport's workspace, as a Lease, whether its edge is connected,
// since when, its version and last heartbeat; and that it is no longer
// connected once the edge stops, and once the broker stops.
func TestEdgeLeaseShowsConnectedThenDisconnected(t *testing.T) {
	ctx := context.Background()
	export := newExport(t)
	pki := newPKI(t, "pki", "edge", "admin")
	edgeID := devpki.IdentityFor("edge")
	// The edge's name makes the Lease's name unique among the tests, which
	// all share the identity "edge" and the provider workspace.
	const edgeName = "lease-e2e"
	broker := startBroker(t, pki, config.Config{
		Edges:  []config.Edge{{Identity: edgeID, Name: edgeName, APIExport: export}},
		Admins: []string{devpki.IdentityFor("admin")},
	}, "--heartbeat-interval", "1s", "--edge-lease-renew-interval", "1s")
	kube, err := kubernetes.NewForConfig(workspaceConfig(env.kcp.Config, env.provider))
	if err != nil {
		t.Fatal(err)
	}
	leases := kube.CoordinationV1().Leases("default")
	leaseName := edgelease.Name(edgeName, edgeID)
	waitLease := func(what string, ok func(*coordinationv1.Lease) (bool, string)) *coordinationv1.Lease {
		t.Helper()
		var got *coordinationv1.Lease
		err := framework.Eventually(ctx, 30*time.Second, 100*time.Millisecond, func(ctx context.Context) (bool, string) {
			l, err := leases.Get(ctx, leaseName, metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			got = l
			return ok(l)
		})
		if err != nil {
			t.Fatalf("Lease default/%s in %s never %s: %v", leaseName, env.provider, what, err)
		}
		return got
	}
	annotation := func(l *coordinationv1.Lease, k string) string { return l.Annotations[k] }
	inState := func(state string) func(*coordinationv1.Lease) (bool, string) {
		return func(l *coordinationv1.Lease) (bool, string) {
			got := annotation(l, edgelease.AnnotationState)
			return got == state, fmt.Sprintf("state %q, annotations %v", got, l.Annotations)
		}
	}

	// Before the edge ever connects, the Lease says so.
	l := waitLease("Disconnected", inState("Disconnected"))
	if r := annotation(l, edgelease.AnnotationDisconnectReason); r != edgelease.ReasonNotConnected {
		t.Errorf("reason before the first connect = %q, want %q", r, edgelease.ReasonNotConnected)
	}
	if l.Labels[edgelease.LabelManagedBy] != "ferry-broker" || l.Labels[edgelease.LabelEdge] != edgeName {
		t.Errorf("labels = %v", l.Labels)
	}

	edge := startEdge(t, "edge", pki, "edge", broker.Address)
	admin, err := framework.WaitEdgeState(ctx, adminConn(t, broker, pki), edgeID, ferryv1.EdgeState_EDGE_STATE_CONNECTED, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	l = waitLease("Connected", inState("Connected"))
	if h := l.Spec.HolderIdentity; h == nil || *h != "edge" {
		t.Errorf("holderIdentity = %v, want the agent name edge", h)
	}
	since, err := time.Parse(time.RFC3339, annotation(l, edgelease.AnnotationConnectedSince))
	if err != nil || since.Unix() != admin.GetConnectedAt().AsTime().Unix() {
		t.Errorf("connected-since %q (%v), want the admin API's %s", annotation(l, edgelease.AnnotationConnectedSince), err, admin.GetConnectedAt().AsTime())
	}
	for k, want := range map[string]string{
		edgelease.AnnotationIdentity: edgeID, edgelease.AnnotationAPIExport: export.String(), edgelease.AnnotationAgentName: "edge",
		edgelease.AnnotationSessionID: admin.GetSessionId(), edgelease.AnnotationEdgeVersion: admin.GetEdgeVersion(),
		edgelease.AnnotationProtocolVersion: "1", edgelease.AnnotationNacks: "0", edgelease.AnnotationRefusedMessages: "0",
	} {
		if got := annotation(l, k); got != want || got == "" {
			t.Errorf("annotation %s = %q, want %q", k, got, want)
		}
	}
	// Renewed every second (both flags), so three seconds without renewal
	// mean the broker is gone.
	if d := l.Spec.LeaseDurationSeconds; d == nil || *d != 3 {
		t.Errorf("leaseDurationSeconds = %v, want 3", d)
	}
	firstRenew := l.Spec.RenewTime.Time
	waitLease("renewed", func(l *coordinationv1.Lease) (bool, string) {
		return l.Spec.RenewTime.After(firstRenew), fmt.Sprintf("renewTime %s, first %s", l.Spec.RenewTime.Time, firstRenew)
	})

	// The edge stops: Disconnected, holder cleared, version kept.
	stopChecked(t, edge)
	l = waitLease("Disconnected after the edge stopped", inState("Disconnected"))
	if l.Spec.HolderIdentity != nil {
		t.Errorf("holderIdentity = %q after the edge stopped, want cleared", *l.Spec.HolderIdentity)
	}
	if r := annotation(l, edgelease.AnnotationDisconnectReason); r != server.ReasonStreamCanceled {
		t.Errorf("disconnect reason = %q, want %q", r, server.ReasonStreamCanceled)
	}
	if _, err := time.Parse(time.RFC3339, annotation(l, edgelease.AnnotationDisconnectedAt)); err != nil {
		t.Errorf("disconnected-at: %v", err)
	}
	if annotation(l, edgelease.AnnotationEdgeVersion) != admin.GetEdgeVersion() || annotation(l, edgelease.AnnotationConnectedSince) != "" {
		t.Errorf("after the disconnect: annotations %v", l.Annotations)
	}

	// Connected again, then the broker shuts down: it marks the edge
	// Disconnected on its way out.
	startEdge(t, "edge-again", pki, "edge", broker.Address)
	l = waitLease("Connected again", func(l *coordinationv1.Lease) (bool, string) {
		ok := annotation(l, edgelease.AnnotationState) == "Connected" && annotation(l, edgelease.AnnotationSessionID) != admin.GetSessionId()
		return ok, fmt.Sprintf("annotations %v", l.Annotations)
	})
	if h := l.Spec.HolderIdentity; h == nil || *h != "edge-again" {
		t.Errorf("holderIdentity = %v, want edge-again", h)
	}
	if tr := l.Spec.LeaseTransitions; tr == nil || *tr != 1 {
		t.Errorf("leaseTransitions = %v, want 1 (the second session)", tr)
	}
	stopChecked(t, broker.Process)
	l, err = leases.Get(ctx, leaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if annotation(l, edgelease.AnnotationState) != "Disconnected" || l.Spec.HolderIdentity != nil ||
		annotation(l, edgelease.AnnotationDisconnectReason) != "the broker is shutting down" {
		t.Errorf("after the broker stopped: holder %v, annotations %v", l.Spec.HolderIdentity, l.Annotations)
	}
}

package e2e

import (
	"context"
	"strconv"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/test/framework"
)

// replicaLeaseDuration keeps the failover short in the test (the default
// is 15 s).
const replicaLeaseDuration = 3 * time.Second

// startReplica starts a broker replica named name that announces its own
// address (--replica-address) and competes for the exports' ownership.
func startReplica(t *testing.T, name, pki string, cfg config.Config) *framework.Broker {
	t.Helper()
	port, err := framework.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	dir := testDir(t)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	b, err := framework.StartBroker(context.Background(), env.bins, framework.BrokerOptions{
		Name: name, Dir: dir + "/" + name, LogDir: dir, PKIDir: pki, KCPKubeconfig: env.kcp.StableKubeconfig, Config: cfg, Port: port,
		ExtraArgs: []string{"--replica-address", addr, "--ownership-lease-duration", replicaLeaseDuration.String()},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopChecked(t, b.Process) })
	return b
}

// TestReplicasSendTheEdgeToTheOwnerAndFailOver: two broker replicas share
// an APIExport's ownership through its Lease in kcp. An edge pointed at
// the replica that does not own the export is sent to the owner and served
// there without operator action; when the owner is killed, the other
// replica takes the export over once the Lease runs out and the edge,
// still pointed at it, is served there: a PublishedResource applied after
// the failover is published through the new owner.
func TestReplicasSendTheEdgeToTheOwnerAndFailOver(t *testing.T) {
	ctx := context.Background()
	export := newExport(t)
	pki := newPKI(t, "pki", "edge", "admin")
	cfg := config.Config{
		Edges:  []config.Edge{{Identity: devpki.IdentityFor("edge"), APIExport: export}},
		Admins: []string{devpki.IdentityFor("admin")},
	}
	owner := startReplica(t, "broker-a", pki, cfg)
	other := startReplica(t, "broker-b", pki, cfg)
	identity := devpki.IdentityFor("edge")

	// The first edge stream makes broker-a the owner.
	e := &pubEnv{label: sanitize(t.Name()), path: env.provider, pki: pki, export: export, broker: owner}
	first := e.startEdge(t)
	if _, err := framework.WaitEdgeState(ctx, adminConn(t, owner, pki), identity, ferryv1.EdgeState_EDGE_STATE_CONNECTED, time.Minute); err != nil {
		t.Fatal(err)
	}
	stopChecked(t, first)

	// An edge pointed at broker-b is sent to broker-a, which still owns
	// the export (its engine outlives the stream).
	e.edgeDial = other.Address
	e.edge = e.startEdge(t)
	if _, err := framework.WaitEdgeState(ctx, adminConn(t, owner, pki), identity, ferryv1.EdgeState_EDGE_STATE_CONNECTED, time.Minute); err != nil {
		t.Fatalf("the edge pointed at the non-owner did not reach the owner: %v", err)
	}
	waitFor(t, "broker-b sent the edge to broker-a", func(context.Context) (bool, string) {
		log, err := other.Log()
		return err == nil && containsAll(string(log), []string{"sent the edge to the broker replica that owns its APIExport", owner.Address}),
			"broker-b's log does not say it sent the edge to " + owner.Address
	})
	crd := testCRD("replicas.example.com", "Ferryboat", "ferryboats", apiextensionsv1.NamespaceScoped, "v1")
	apply(t, crd)
	e.publish(t, "ferryboats", ferryv1alpha1.PublishedResourceSpec{Resource: ferryv1alpha1.SourceResource{APIGroup: crd.Spec.Group, Kind: "Ferryboat", Version: "v1"}})
	e.waitCondition(t, "ferryboats", metav1.ConditionTrue, ferryv1alpha1.ReasonPublished)

	// The owner dies: broker-b takes the export over after the Lease
	// duration, and the edge, reconnecting to broker-b, is served there.
	killed := time.Now()
	owner.Kill()
	if _, err := framework.WaitEdgeState(ctx, adminConn(t, other, pki), identity, ferryv1.EdgeState_EDGE_STATE_CONNECTED, time.Minute); err != nil {
		t.Fatalf("no failover to broker-b: %v", err)
	}
	t.Logf("served by broker-b %s after the owner was killed (lease duration %s)", time.Since(killed).Round(100*time.Millisecond), replicaLeaseDuration)
	crd2 := testCRD("replicas.example.com", "Scow", "scows", apiextensionsv1.NamespaceScoped, "v1")
	apply(t, crd2)
	e.publish(t, "scows", ferryv1alpha1.PublishedResourceSpec{Resource: ferryv1alpha1.SourceResource{APIGroup: crd2.Spec.Group, Kind: "Scow", Version: "v1"}})
	e.waitCondition(t, "scows", metav1.ConditionTrue, ferryv1alpha1.ReasonPublished)
}

package e2e

import (
	"context"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kcp-dev/logicalcluster/v3"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/test/framework"
)

func TestEdgeConnectsOverMTLS(t *testing.T) {
	ctx := context.Background()
	pki, export, broker := brokerFor(t, "--heartbeat-interval", "1s")
	edgeID := devpki.IdentityFor("edge")
	edge := startEdge(t, "edge", pki, "edge", broker.Address)

	conn := adminConn(t, broker, pki)
	got, err := framework.WaitEdgeState(ctx, conn, edgeID, ferryv1.EdgeState_EDGE_STATE_CONNECTED, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if got.GetAgentName() != "edge" || got.GetProtocolVersion() != 1 {
		t.Errorf("admin API shows agent %q protocol %d, want edge / 1", got.GetAgentName(), got.GetProtocolVersion())
	}
	if got.GetExport().GetName() != export.Name || got.GetExport().GetWorkspacePath() != export.Workspace {
		t.Errorf("admin API shows export %v, want %s", got.GetExport(), export)
	}

	// The broker resolved the provider workspace's logical cluster in kcp.
	kcpClient, err := framework.KCPClient(env.kcp.Config)
	if err != nil {
		t.Fatal(err)
	}
	lc, err := kcpClient.Cluster(env.provider).CoreV1alpha1().LogicalClusters().Get(ctx, "cluster", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := logicalcluster.From(lc).String(); got.GetExportStatus().GetLogicalCluster() != want {
		t.Errorf("export status logical cluster = %q, want %q", got.GetExportStatus().GetLogicalCluster(), want)
	}
	if got.GetExportStatus().GetVirtualWorkspaceReady() || got.GetExportStatus().GetWaitingFor() == "" {
		t.Errorf("an unbound export has no virtual workspace yet; status should say what it waits for: %v", got.GetExportStatus())
	}

	// Both sides log the connection, with the same session.
	waitLog(t, broker.Process, 10*time.Second, "edge connected", edgeID, got.GetSessionId())
	waitLog(t, edge, 10*time.Second, "connected to broker", got.GetSessionId())

	// Heartbeats keep arriving: last_seen moves on.
	first := got.GetLastSeen().AsTime()
	err = framework.Eventually(ctx, 15*time.Second, 200*time.Millisecond, func(ctx context.Context) (bool, string) {
		resp, err := ferryv1.NewAdminServiceClient(conn).ListEdges(ctx, &ferryv1.ListEdgesRequest{})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range resp.GetEdges() {
			if e.GetIdentity() == edgeID && e.GetLastSeen().AsTime().After(first) {
				return true, ""
			}
		}
		return false, "last_seen has not advanced past " + first.String()
	})
	if err != nil {
		t.Fatal(err)
	}

	// grpcurl with the edge's client certificate: health and reflection.
	grpcurl := func(args ...string) string {
		t.Helper()
		full := append([]string{
			"-cacert", filepath.Join(pki, devpki.CACertFile),
			"-cert", devpki.CertFile(pki, "edge"), "-key", devpki.KeyFile(pki, "edge"),
			broker.Address,
		}, args...)
		out, err := exec.CommandContext(ctx, env.bins.Grpcurl, full...).CombinedOutput()
		if err != nil {
			t.Fatalf("grpcurl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if out := grpcurl("grpc.health.v1.Health/Check"); !strings.Contains(out, `"status": "SERVING"`) {
		t.Errorf("health check did not answer SERVING:\n%s", out)
	}
	services := grpcurl("list")
	for _, s := range []string{"ferry.v1alpha1.SyncService", "ferry.v1alpha1.AdminService", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"} {
		if !strings.Contains(services, s) {
			t.Errorf("reflection does not list %s:\n%s", s, services)
		}
	}
}

func TestCertificateFromAnotherCAGetsNoStream(t *testing.T) {
	ctx := context.Background()
	export := newExport(t)
	pki := newPKI(t, "pki", "edge", "admin")
	foreign := newPKI(t, "foreign", "edge") // same identity, other CA
	edgeID := devpki.IdentityFor("edge")
	broker := startBroker(t, pki, config.Config{
		Edges:  []config.Edge{{Identity: edgeID, APIExport: export}},
		Admins: []string{devpki.IdentityFor("admin")},
	})
	// The edge trusts the broker, but presents a certificate the broker's CA
	// did not sign.
	edge := startEdge(t, "edge", pki, "edge", broker.Address,
		"--tls-cert", devpki.CertFile(foreign, "edge"), "--tls-key", devpki.KeyFile(foreign, "edge"))

	// Several attempts fail (the TLS alert, or a write to the connection the
	// broker already closed, depending on timing)...
	waitLogCount(t, edge, 30*time.Second, 3, "stream to broker ended; reconnecting")
	waitLog(t, edge, 30*time.Second, "reconnecting", "unknown certificate authority")
	// ...and the broker never accepted a stream.
	resp, err := ferryv1.NewAdminServiceClient(adminConn(t, broker, pki)).ListEdges(ctx, &ferryv1.ListEdgesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.GetEdges()) != 1 || resp.GetEdges()[0].GetState() != ferryv1.EdgeState_EDGE_STATE_DISCONNECTED {
		t.Errorf("edge with a foreign certificate is listed as %v", resp.GetEdges())
	}
	assertLogLacks(t, broker.Process, "edge connected")
}

func TestUnknownIdentityIsPermissionDenied(t *testing.T) {
	export := newExport(t)
	pki := newPKI(t, "pki", "edge", "stranger", "admin")
	broker := startBroker(t, pki, config.Config{
		Edges: []config.Edge{{Identity: devpki.IdentityFor("edge"), APIExport: export}},
	})
	edge := startEdge(t, "stranger", pki, "stranger", broker.Address)

	waitLog(t, edge, 30*time.Second, "broker refused this edge", "PermissionDenied",
		devpki.IdentityFor("stranger"), "is not configured at this broker")
	waitLog(t, broker.Process, 10*time.Second, "refused edge: identity not configured", devpki.IdentityFor("stranger"))
	assertLogLacks(t, broker.Process, "edge connected")
}

func TestSecondEdgeForSameExportIsRefusedUntilFirstLeaves(t *testing.T) {
	ctx := context.Background()
	export := newExport(t)
	pki := newPKI(t, "pki", "edge-a", "edge-b", "admin")
	idA, idB := devpki.IdentityFor("edge-a"), devpki.IdentityFor("edge-b")
	broker := startBroker(t, pki, config.Config{
		Edges: []config.Edge{
			// Edges serving one export share a name (their finalizer).
			{Identity: idA, Name: "standby-pair", APIExport: export},
			{Identity: idB, Name: "standby-pair", APIExport: export},
		},
		Admins: []string{devpki.IdentityFor("admin")},
	})
	conn := adminConn(t, broker, pki)

	edgeA := startEdge(t, "edge-a", pki, "edge-a", broker.Address)
	if _, err := framework.WaitEdgeState(ctx, conn, idA, ferryv1.EdgeState_EDGE_STATE_CONNECTED, time.Minute); err != nil {
		t.Fatal(err)
	}
	edgeB := startEdge(t, "edge-b", pki, "edge-b", broker.Address)
	waitLog(t, edgeB, 30*time.Second, "FailedPrecondition", "is already served by edge", idA, export.String())
	if _, err := framework.WaitEdgeState(ctx, conn, idB, ferryv1.EdgeState_EDGE_STATE_DISCONNECTED, time.Second); err != nil {
		t.Fatal(err)
	}

	// The first edge leaves; the second takes over by itself.
	if err := edgeA.Stop(20 * time.Second); err != nil {
		t.Fatalf("edge-a did not stop cleanly: %v", err)
	}
	if _, err := framework.WaitEdgeState(ctx, conn, idB, ferryv1.EdgeState_EDGE_STATE_CONNECTED, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := framework.WaitEdgeState(ctx, conn, idA, ferryv1.EdgeState_EDGE_STATE_DISCONNECTED, time.Second); err != nil {
		t.Fatal(err)
	}
}

func TestEdgeReconnectsAfterBrokerIsKilled(t *testing.T) {
	ctx := context.Background()
	pki, _, broker := brokerFor(t)
	edgeID := devpki.IdentityFor("edge")
	startEdge(t, "edge", pki, "edge", broker.Address)
	conn := adminConn(t, broker, pki)
	before, err := framework.WaitEdgeState(ctx, conn, edgeID, ferryv1.EdgeState_EDGE_STATE_CONNECTED, time.Minute)
	if err != nil {
		t.Fatal(err)
	}

	killed := time.Now()
	if err := broker.Restart(ctx, true); err != nil {
		t.Fatal(err)
	}
	// The edge's default reconnect delays are capped at 5 s; 20 s leaves room
	// for a slow machine without hiding an edge that gave up.
	after, err := framework.WaitEdgeState(ctx, conn, edgeID, ferryv1.EdgeState_EDGE_STATE_CONNECTED, 20*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if after.GetSessionId() == before.GetSessionId() {
		t.Fatalf("session %s survived a broker restart", after.GetSessionId())
	}
	t.Logf("edge reconnected %s after the broker was killed", time.Since(killed).Round(100*time.Millisecond))
}

func TestAPIExportMissingInKCPIsRefused(t *testing.T) {
	pki := newPKI(t, "pki", "edge", "admin")
	missing := config.APIExportRef{Workspace: env.provider.String(), Name: "does-not-exist.e2e.ferry.dev"}
	broker := startBroker(t, pki, config.Config{
		Edges: []config.Edge{{Identity: devpki.IdentityFor("edge"), APIExport: missing}},
	})
	edge := startEdge(t, "edge", pki, "edge", broker.Address)
	waitLog(t, edge, 30*time.Second, "FailedPrecondition", "APIExport "+missing.String(), "not found in kcp")
}

func TestBadInputStopsWithClearMessage(t *testing.T) {
	ctx := context.Background()
	pki := newPKI(t, "pki", "edge")
	dir := testDir(t)
	badConfig := filepath.Join(dir, "bad-config.yaml")
	writeFile(t, badConfig, "edges:\n- identity: x\n  apiExport: {workspace: 'not a path', name: y}\n")

	tests := []struct {
		name string
		bin  string
		args []string
		want []string
	}{
		{
			name: "broker without flags names every missing one",
			bin:  env.bins.Broker,
			want: []string{"--config is required", "--kcp-kubeconfig is required", "--tls-cert is required", "--client-ca is required"},
		},
		{
			name: "broker with a missing certificate names the file",
			bin:  env.bins.Broker,
			args: []string{"--config", badConfig, "--kcp-kubeconfig", env.kcp.Kubeconfig,
				"--tls-cert", filepath.Join(dir, "nope.crt"), "--tls-key", devpki.KeyFile(pki, "broker"), "--client-ca", filepath.Join(pki, devpki.CACertFile)},
			want: []string{"nope.crt", "not a workspace path"},
		},
		{
			name: "edge with a certificate that does not match its key",
			bin:  env.bins.Edge,
			args: []string{"--broker-address", "127.0.0.1:1", "--agent-name", "edge", "--kubeconfig", env.service.Kubeconfig,
				"--broker-ca", filepath.Join(pki, devpki.CACertFile),
				"--tls-cert", devpki.CertFile(pki, "edge"), "--tls-key", devpki.KeyFile(pki, "broker")},
			want: []string{"edge.crt", "private key does not match"},
		},
		{
			name: "edge with an invalid agent name",
			bin:  env.bins.Edge,
			args: []string{"--broker-address", "127.0.0.1:1", "--agent-name", "Not_Valid"},
			want: []string{"--agent-name", "--tls-cert is required"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := exec.CommandContext(ctx, tt.bin, tt.args...).CombinedOutput()
			if err == nil {
				t.Fatalf("expected a non-zero exit; output:\n%s", out)
			}
			for _, w := range tt.want {
				if !strings.Contains(string(out), w) {
					t.Errorf("output does not mention %q:\n%s", w, out)
				}
			}
			if strings.Contains(string(out), "panic") {
				t.Errorf("program panicked:\n%s", out)
			}
		})
	}
}

func TestEdgeReplicasElectOneLeader(t *testing.T) {
	ctx := context.Background()
	pki, _, broker := brokerFor(t)
	edgeID := devpki.IdentityFor("edge")
	conn := adminConn(t, broker, pki)
	// Both replicas are agent "edge-le"; short leases keep the test quick.
	lease := []string{"--agent-name", "edge-le", "--leader-election-lease-duration", "4s",
		"--leader-election-renew-deadline", "3s", "--leader-election-retry-period", "500ms"}

	first := startEdge(t, "replica-1", pki, "edge", broker.Address, lease...)
	leader, err := framework.WaitEdgeState(ctx, conn, edgeID, ferryv1.EdgeState_EDGE_STATE_CONNECTED, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	second := startEdge(t, "replica-2", pki, "edge", broker.Address, lease...)
	waitLog(t, second, 30*time.Second, "Attempting to acquire leader lease")
	// The standby never dials while the leader lives: the broker would
	// refuse it, which would show in its log.
	time.Sleep(6 * time.Second) // longer than a lease: the standby must not take over a live leader
	assertLogLacks(t, second, "connected to broker")
	assertLogLacks(t, second, "broker refused this edge")
	// Both are ready: the leader is connected, and a standby is doing what
	// it should (README: a standby replica is ready).
	waitProbe(t, first, "/readyz", http.StatusOK, "[+]broker ok")
	waitProbe(t, second, "/readyz", http.StatusOK, "[+]broker ok")

	// The leader dies without releasing the lease; the standby takes over.
	first.Kill()
	err = framework.Eventually(ctx, time.Minute, 200*time.Millisecond, func(ctx context.Context) (bool, string) {
		e, err := framework.WaitEdgeState(ctx, conn, edgeID, ferryv1.EdgeState_EDGE_STATE_CONNECTED, time.Second)
		if err != nil {
			return false, err.Error()
		}
		return e.GetSessionId() != leader.GetSessionId(), "still the old session " + e.GetSessionId()
	})
	if err != nil {
		t.Fatal(err)
	}
	waitLog(t, second, 10*time.Second, "connected to broker")

	// A graceful shutdown releases the Lease: the next replica need not
	// wait out its duration.
	if err := second.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	kube, err := kubernetes.NewForConfig(env.service.Config)
	if err != nil {
		t.Fatal(err)
	}
	held, err := kube.CoordinationV1().Leases("ferry-system").Get(ctx, "ferry-edge-edge-le", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := held.Spec.HolderIdentity; h != nil && *h != "" {
		t.Errorf("the Lease is still held by %q after the leader's graceful shutdown", *h)
	}
}

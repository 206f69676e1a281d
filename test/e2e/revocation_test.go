package e2e

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
	"github.com/ferry-dev/ferry/test/framework"
)

// TestRevokedCertificateStreamEnds: an admin revokes a connected edge's
// certificate; its stream ends within a second with the reason, which the
// edge logs and shows in /readyz; reconnects are refused, also by the
// restarted broker (the block is kept in kcp).
func TestRevokedCertificateStreamEnds(t *testing.T) {
	ctx := context.Background()
	pki, _, broker := brokerFor(t, "--heartbeat-interval", "1s")
	edgeID := devpki.IdentityFor("edge")
	edge := startEdge(t, "edge", pki, "edge", broker.Address)
	conn := adminConn(t, broker, pki)
	admin := ferryv1.NewAdminServiceClient(conn)

	connected, err := framework.WaitEdgeState(ctx, conn, edgeID, ferryv1.EdgeState_EDGE_STATE_CONNECTED, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	fingerprint := certFingerprint(t, pki, "edge")
	if got := connected.GetCertificateSha256(); got != fingerprint {
		t.Fatalf("ListEdges shows certificate %q, want the edge's %q", got, fingerprint)
	}
	waitProbe(t, edge, "/readyz", http.StatusOK, "")

	const reason = "e2e: key leaked, ticket OPS-4711"
	resp, err := admin.Revoke(ctx, &ferryv1.RevokeRequest{Identity: edgeID, CertificateSha256: fingerprint, Reason: reason})
	if err != nil {
		t.Fatal(err)
	}
	returned := time.Now()
	if resp.GetClosedStreams() != 1 {
		t.Errorf("closed_streams = %d, want 1", resp.GetClosedStreams())
	}
	// The stream ends within a second of the call's return.
	err = framework.Eventually(ctx, time.Second, 20*time.Millisecond, func(ctx context.Context) (bool, string) {
		list, err := admin.ListEdges(ctx, &ferryv1.ListEdgesRequest{})
		if err != nil {
			return false, err.Error()
		}
		for _, e := range list.GetEdges() {
			if e.GetIdentity() == edgeID && e.GetSessionId() == connected.GetSessionId() {
				return false, "session " + e.GetSessionId() + " is still listed"
			}
		}
		return true, ""
	})
	if err != nil {
		t.Fatalf("the revoked stream did not end within 1s: %v", err)
	}
	t.Logf("stream ended %s after Revoke returned (observed through ListEdges)", time.Since(returned).Round(time.Millisecond))

	// The edge logs the broker's reason as an error and shows it in /readyz.
	waitLog(t, edge, 10*time.Second, "broker refused this edge", "Unauthenticated", fingerprint, "is revoked: "+reason)
	waitProbe(t, edge, "/readyz", http.StatusInternalServerError, "refused this edge (Unauthenticated): client certificate "+fingerprint)
	waitProbe(t, edge, "/readyz", http.StatusInternalServerError, "is revoked: "+reason)

	// Reconnects are refused before the handshake, and counted.
	waitLog(t, broker.Process, 30*time.Second, "refused edge: revoked", fingerprint)
	waitLogCount(t, edge, 30*time.Second, 2, "broker refused this edge", "is revoked: "+reason)
	m, err := framework.Scrape(ctx, broker.Process)
	if err != nil {
		t.Fatal(err)
	}
	if v, _ := m.Value("ferry_broker_handshake_refusals_total", map[string]string{"reason": "revoked"}); v < 1 {
		t.Errorf("ferry_broker_handshake_refusals_total{reason=revoked} = %v, want at least 1", v)
	}

	// The block is kept in kcp: the restarted broker refuses the edge too.
	if err := broker.Restart(ctx, false); err != nil {
		t.Fatal(err)
	}
	// (The restarted process's log only.)
	waitLog(t, broker.Process, 30*time.Second, "revocations loaded", `"count":1`)
	waitLog(t, broker.Process, time.Minute, "refused edge: revoked", fingerprint)
	if _, err := framework.WaitEdgeState(ctx, conn, edgeID, ferryv1.EdgeState_EDGE_STATE_DISCONNECTED, time.Second); err != nil {
		t.Fatal(err)
	}
	assertNoSecondConnect(t, broker, conn, edgeID)
}

// TestConfigRevokedIdentityIsRefused: a revoked[] entry of the broker
// configuration blocks a whole identity; after a restart with it the
// connected edge is refused with the reason, in its log and /readyz.
func TestConfigRevokedIdentityIsRefused(t *testing.T) {
	ctx := context.Background()
	pki, export, broker := brokerFor(t, "--heartbeat-interval", "1s")
	edgeID := devpki.IdentityFor("edge")
	edge := startEdge(t, "edge", pki, "edge", broker.Address)
	conn := adminConn(t, broker, pki)
	if _, err := framework.WaitEdgeState(ctx, conn, edgeID, ferryv1.EdgeState_EDGE_STATE_CONNECTED, time.Minute); err != nil {
		t.Fatal(err)
	}

	const reason = "e2e: cluster decommissioned"
	cfg := config.Config{
		Edges:   []config.Edge{{Identity: edgeID, APIExport: export}},
		Admins:  []string{devpki.IdentityFor("admin")},
		Revoked: []config.Revocation{{Identity: edgeID, Reason: reason}},
	}
	if err := broker.Reconfigure(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	waitLog(t, edge, 30*time.Second, "broker refused this edge", "Unauthenticated", "is blocked: "+reason)
	waitProbe(t, edge, "/readyz", http.StatusInternalServerError, "refused this edge (Unauthenticated): identity \""+edgeID+"\" is blocked: "+reason)
	waitLog(t, broker.Process, 10*time.Second, "refused edge: revoked", edgeID)
	assertNoSecondConnect(t, broker, conn, edgeID)
}

// assertNoSecondConnect fails when the broker shows the edge connected.
func assertNoSecondConnect(t *testing.T, broker *framework.Broker, conn *grpc.ClientConn, edgeID string) {
	t.Helper()
	list, err := ferryv1.NewAdminServiceClient(conn).ListEdges(context.Background(), &ferryv1.ListEdgesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list.GetEdges() {
		if e.GetIdentity() == edgeID && e.GetState() != ferryv1.EdgeState_EDGE_STATE_DISCONNECTED {
			t.Errorf("the revoked edge is %v at %s", e.GetState(), broker.Address)
		}
	}
}

// certFingerprint is the fingerprint of a client certificate of the PKI.
func certFingerprint(t *testing.T, pki, client string) string {
	t.Helper()
	data, err := os.ReadFile(devpki.CertFile(pki, client))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("no PEM block in %s", devpki.CertFile(pki, client))
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return tlsconfig.Fingerprint(cert)
}

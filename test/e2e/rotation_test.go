package e2e

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/test/framework"
)

// TestCABundleRotationWithoutRestart moves a running broker and edge from
// one CA to another by rewriting their files only: the bundle both trust
// gains the new CA, both certificates are reissued by it, then the old CA
// leaves the bundle. The connection is then cut (a forwarder between them),
// and the edge's next handshake can only succeed if both processes re-read
// every file: the broker its serving certificate and client CA bundle, the
// edge its client certificate and broker CA bundle. Neither is restarted.
func TestCABundleRotationWithoutRestart(t *testing.T) {
	ctx := context.Background()
	pki, _, broker := brokerFor(t, "--heartbeat-interval", "1s")
	edgeID := devpki.IdentityFor("edge")
	link, err := framework.ForwardTCP(broker.Address)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = link.Close() })
	edge := startEdge(t, "edge", pki, "edge", link.Addr())

	before, err := framework.WaitEdgeState(ctx, adminConn(t, broker, pki), edgeID, ferryv1.EdgeState_EDGE_STATE_CONNECTED, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	brokerPid, edgePid := broker.Pid(), edge.Pid()

	// The new CA and certificates of the same identities, in a directory
	// of their own.
	next := newPKI(t, "pki-next", "edge", "admin")
	read := func(path string) []byte {
		t.Helper()
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		return data
	}
	oldCA, newCA := read(filepath.Join(pki, devpki.CACertFile)), read(filepath.Join(next, devpki.CACertFile))
	// Every write gets a later modification time: the processes notice a
	// change by it (and the size), as they do a Secret update.
	stamp := time.Now()
	write := func(path string, data []byte) {
		t.Helper()
		stamp = stamp.Add(time.Second)
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, stamp, stamp); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(pki, devpki.CACertFile), append(append([]byte{}, oldCA...), newCA...))
	for _, name := range []string{"broker", "edge", "admin"} {
		write(devpki.KeyFile(pki, name), read(devpki.KeyFile(next, name)))
		write(devpki.CertFile(pki, name), read(devpki.CertFile(next, name)))
	}
	write(filepath.Join(pki, devpki.CACertFile), newCA)

	if n := link.Sever(); n != 1 {
		t.Fatalf("severed %d connections between edge and broker, want 1", n)
	}
	// A new admin connection: it too trusts only the new CA now.
	after, err := framework.WaitEdgeState(ctx, adminConn(t, broker, pki), edgeID, ferryv1.EdgeState_EDGE_STATE_CONNECTED, time.Minute)
	if err != nil {
		t.Fatalf("the edge did not connect again after the rotation: %v (edge log %s)", err, edge.LogFile)
	}
	if after.GetSessionId() == before.GetSessionId() {
		t.Fatalf("session %s survived; the connection was not cut", after.GetSessionId())
	}
	if broker.Pid() != brokerPid || edge.Pid() != edgePid {
		t.Errorf("a process was restarted: broker pid %d → %d, edge pid %d → %d", brokerPid, broker.Pid(), edgePid, edge.Pid())
	}
	if link.Accepted() < 2 {
		t.Errorf("the forwarder relayed %d connections; the edge's reconnect did not go through it", link.Accepted())
	}
}

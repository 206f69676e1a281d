package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ferry-dev/ferry/test/framework"
)

// proxiedBrokerHost is the name edges dial the broker by in the proxy
// tests. Only the test proxy resolves it (--resolve; .test is reserved and
// never resolves in DNS), so an edge that reaches the broker at all went
// through the proxy.
const proxiedBrokerHost = "broker.ferry.test"

// TestSyncThroughConnectProxy: an edge whose only route to the broker is
// an HTTP CONNECT proxy with authentication, named by HTTPS_PROXY, syncs an
// object and gets its status back; the proxy counted the tunnel. An edge
// with wrong proxy credentials logs the proxy's 407 and is not ready.
func TestSyncThroughConnectProxy(t *testing.T) {
	ctx := context.Background()
	var proxy *framework.ConnectProxy
	via := func(broker string) string {
		_, port, err := net.SplitHostPort(broker)
		if err != nil {
			t.Fatal(err)
		}
		target := net.JoinHostPort(proxiedBrokerHost, port)
		proxy, err = framework.StartConnectProxy(ctx, env.bins, "connect-proxy", testDir(t),
			"--auth", "ferry:proxy-secret", "--allow", target, "--resolve", proxiedBrokerHost+"=127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stopChecked(t, proxy.Process) })
		// The edges inherit the test's environment (framework.StartProcess);
		// t.Setenv undoes it after the test. Loopback addresses (kcp, the
		// service cluster) never go through HTTPS_PROXY.
		t.Setenv("HTTPS_PROXY", "http://ferry:proxy-secret@"+proxy.Address)
		t.Setenv("NO_PROXY", "")
		t.Setenv("no_proxy", "")
		return target
	}
	e := newSyncEnvsArgs(t, nil, []string{"--broker-server-name", "localhost"}, via, "px",
		publication{crd: testCRD("proxy.example.com", "Tunnel", "tunnels", apiextensionsv1.NamespaceScoped, "v1")})[0]

	waitLog(t, e.edge, 10*time.Second, "starting", "proxy http://"+proxy.Address+" (HTTPS_PROXY)")
	assertLogLacks(t, e.edge, "proxy-secret")

	e.createRemote(t, "default", "through", map[string]any{"fieldV1": "proxied"})
	local := e.waitLocal(t, "default", "through", func(u *unstructured.Unstructured) (bool, string) {
		v, _ := specField(u, "fieldV1")
		return v == "proxied", "spec.fieldV1 = " + v
	})
	_ = unstructured.SetNestedField(local.Object, "Ready", "status", "phase")
	if _, err := e.local.Namespace(local.GetNamespace()).UpdateStatus(ctx, local, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitRemote(t, "default", "through", func(u *unstructured.Unstructured, err error) (bool, string) {
		if err != nil {
			return false, err.Error()
		}
		phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
		return phase == "Ready", "status.phase = " + phase
	})
	counts, err := proxy.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if counts["accepted"] < 1 || counts["refused"] != 0 {
		t.Errorf("proxy counts %v, want the edge's tunnel and no refusal", counts)
	}
	waitLog(t, proxy.Process, 5*time.Second, "CONNECT accepted", proxiedBrokerHost)
	assertLogLacks(t, e.edge, "reconnecting")

	// Wrong proxy credentials: the edge says what the proxy answered, and is
	// not ready. It is not leader-elected (the first edge holds its Lease)
	// and handles no PublishedResource.
	t.Setenv("HTTPS_PROXY", "http://ferry:bad-proxy-pw@"+proxy.Address)
	bad := startEdge(t, "edge-bad-proxy", e.pki, "edge", e.edgeDial, "--broker-server-name", "localhost",
		"--leader-elect=false", "--published-resource-selector", testLabel+"=none")
	waitLog(t, bad, time.Minute, fmt.Sprintf("proxy http://%s refused CONNECT to %s: 407 Proxy Authentication Required", proxy.Address, e.edgeDial))
	waitProbe(t, bad, "/readyz", http.StatusInternalServerError, "no established stream to the broker")
	assertLogLacks(t, bad, "bad-proxy-pw")
	waitLog(t, proxy.Process, 5*time.Second, "CONNECT refused", "407")
}

package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/test/framework"
)

// TestFirewalledEdge runs the edge and its service cluster in a network
// namespace whose only way out is a gateway to the broker's port: no
// interface but loopback, no route. Publishing, sync, status and a related
// object all work through that one port, and kcp is unreachable from there.
func TestFirewalledEdge(t *testing.T) {
	e := newFirewalledEnv(t, nil, func(o *framework.EdgeOptions, gateway string) { o.BrokerAddress = gateway })
	e.assertSyncs(t, "firewall.example.com", "Gate", "gates")
}

// firewalledEnv is a pubEnv whose edge and service cluster run in a
// network namespace with one way out.
type firewalledEnv struct {
	*pubEnv
	ns *framework.NetNS
}

// newFirewalledEnv starts a broker on the host, and a service cluster and
// an edge inside a new network namespace whose only way out is a gateway
// (on the namespace's loopback) to target(the broker's address), or to the
// broker itself when target is nil. edge sets how the edge gets out, given
// the gateway's address inside the namespace (the broker address, or a
// proxy address when the gateway leads to a proxy). It checks the firewall
// before the edge starts: only loopback inside, kcp and the broker
// unreachable from there.
func newFirewalledEnv(t testing.TB, target func(brokerAddress string) string, edge func(o *framework.EdgeOptions, gateway string)) *firewalledEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("this test makes a network namespace and needs root (CI runs the e2e tests as root)")
	}
	ctx := context.Background()
	dir := testDir(t)
	ns, err := framework.NewNetNS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs last: after the processes inside stopped.
	t.Cleanup(func() {
		if err := ns.Close(); err != nil {
			t.Errorf("removing network namespace %s: %v", ns.Name, err)
		}
	})
	svcDir := filepath.Join(dir, "service")
	svc, err := framework.StartServiceClusterIn(ctx, ns, env.bins, "fw", svcDir, dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := svc.Stop(); err != nil {
			t.Errorf("stopping the namespace's service cluster: %v", err)
		}
		if !t.Failed() {
			_ = os.RemoveAll(svcDir) // etcd's data; the logs are elsewhere
		}
	})

	e := &firewalledEnv{pubEnv: &pubEnv{label: sanitize(t.Name()), path: env.provider, service: svc}, ns: ns}
	if len(e.label) > 63 {
		e.label = e.label[:63]
	}
	e.pki, e.export, e.broker = brokerFor(t)
	if e.kcp, err = framework.KCPClient(env.kcp.Config); err != nil {
		t.Fatal(err)
	}
	out := e.broker.Address
	if target != nil {
		out = target(e.broker.Address)
	}
	gateway, err := ns.Gateway(out)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("network namespace %s: its one way out is %s, leading to %s", ns.Name, gateway, out)
	e.assertFirewall(t)

	o := framework.EdgeOptionsFor(e.pki, "edge")
	o.Name, o.LogDir, o.NetNS, o.Kubeconfig = "fw-edge", dir, ns, svc.Kubeconfig
	o.ExtraArgs = []string{"--heartbeat-interval", "1s", "--published-resource-selector", testLabel + "=" + e.label}
	edge(&o, gateway)
	if e.edge, err = framework.StartEdge(env.bins, o); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopChecked(t, e.edge) })
	if _, err := framework.WaitEdgeState(ctx, adminConn(t, e.broker, e.pki), devpki.IdentityFor("edge"),
		ferryv1.EdgeState_EDGE_STATE_CONNECTED, time.Minute); err != nil {
		t.Fatalf("the edge in the namespace did not connect: %v", err)
	}
	waitProbe(t, e.edge, "/readyz", http.StatusOK, "")
	for _, p := range []*framework.Process{e.edge, svc.APIServer, svc.Etcd} {
		if in, err := ns.Holds(p.Pid()); err != nil || !in {
			t.Fatalf("%s (pid %d) is not in network namespace %s: %v", p.Name, p.Pid(), ns.Name, err)
		}
	}
	return e
}

// assertFirewall checks that the namespace has no interface but loopback
// and that neither kcp nor the broker's real address answers from inside.
// Each address answers from the host, so a failure inside is the
// namespace's doing.
func (e *firewalledEnv) assertFirewall(t testing.TB) {
	t.Helper()
	ifs, err := e.ns.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	if len(ifs) != 1 || ifs[0].Name != "lo" {
		t.Fatalf("interfaces in the namespace: %+v, want lo alone", ifs)
	}
	kcpURL, err := url.Parse(env.kcp.Config.Host)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range []struct{ what, addr string }{{"kcp", kcpURL.Host}, {"the broker", e.broker.Address}} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", a.addr)
		if err != nil {
			cancel()
			t.Fatalf("%s at %s does not answer from the host: %v", a.what, a.addr, err)
		}
		c.Close()
		c, err = e.ns.DialContext(ctx, a.addr)
		cancel()
		if err == nil {
			c.Close()
			t.Fatalf("%s at %s is reachable from inside the network namespace", a.what, a.addr)
		}
		t.Logf("%s at %s from inside the namespace: %v", a.what, a.addr, err)
	}
}

// assertSyncs publishes a CRD of group/kind/plural whose objects name a
// Secret the service cluster makes (as cert-manager would) and checks sync
// to the service cluster, status back to kcp, the Secret as a related
// object in kcp and deletion, all on one connection of the edge.
func (e *firewalledEnv) assertSyncs(t testing.TB, group, kind, plural string) {
	t.Helper()
	ctx := context.Background()
	crd := testCRD(group, kind, plural, apiextensionsv1.NamespaceScoped, "v1")
	applyTo(t, e.service, crd)
	e.publish(t, plural, ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: crd.Spec.Group, Kind: crd.Spec.Names.Kind, Version: "v1"},
		Related: []ferryv1alpha1.RelatedResourceSpec{{
			Identifier: "tls", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
			Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
		}},
	})
	s := publishedSyncEnv(t, e.pubEnv, crd)
	s.useConsumer(t, bindConsumer(t, e.pubEnv, "fw"))
	svcKube, err := kubernetes.NewForConfig(e.service.Config)
	if err != nil {
		t.Fatal(err)
	}
	runSecretController(t, s.local, svcKube)

	// kcp → service cluster.
	s.createRemote(t, "default", "north", map[string]any{"fieldV1": "open", "secretName": "north-tls"})
	local := s.waitLocal(t, "default", "north", func(u *unstructured.Unstructured) (bool, string) {
		v, _ := specField(u, "fieldV1")
		return v == "open", "spec.fieldV1 = " + v
	})

	// Status: service cluster → kcp.
	_ = unstructured.SetNestedField(local.Object, "Ready", "status", "phase")
	if _, err := s.local.Namespace(local.GetNamespace()).UpdateStatus(ctx, local, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitRemote(t, "default", "north", func(u *unstructured.Unstructured, err error) (bool, string) {
		if err != nil {
			return false, err.Error()
		}
		phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
		return phase == "Ready", "status.phase = " + phase
	})

	// The related Secret: service cluster → kcp.
	waitSecretData(t, s.consumerKube(t), "default", "north-tls", "tls.crt", "cert for "+local.GetName())

	// Deletion in kcp: the local copy goes, then the finalizer.
	if err := s.remote.Namespace("default").Delete(ctx, "north", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitRemote(t, "default", "north", func(u *unstructured.Unstructured, err error) (bool, string) {
		if apierrors.IsNotFound(err) {
			return true, ""
		}
		return false, fmt.Sprintf("still there: %v finalizers %v", err, u.GetFinalizers())
	})
	if _, err := s.local.Namespace(local.GetNamespace()).Get(ctx, local.GetName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("local copy still exists after the kcp object is gone: %v", err)
	}

	// All of it on the one connection the edge made at the start.
	assertLogLacks(t, e.edge, "reconnecting")
}

// TestFirewalledEdgeThroughProxy: the namespace's only way out leads to an
// HTTP CONNECT proxy on the host (with authentication), not to the broker.
// The edge names the broker by a host name only the proxy resolves, so its
// stream can only have gone through the proxy; publishing, sync, status and
// related objects work as with a direct port.
func TestFirewalledEdgeThroughProxy(t *testing.T) {
	ctx := context.Background()
	var proxy *framework.ConnectProxy
	var brokerTarget string
	target := func(broker string) string {
		_, port, err := net.SplitHostPort(broker)
		if err != nil {
			t.Fatal(err)
		}
		brokerTarget = net.JoinHostPort(proxiedBrokerHost, port)
		proxy, err = framework.StartConnectProxy(ctx, env.bins, "fw-connect-proxy", testDir(t),
			"--auth", "ferry:fw-proxy-secret", "--allow", brokerTarget, "--resolve", proxiedBrokerHost+"=127.0.0.1")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stopChecked(t, proxy.Process) })
		return proxy.Address
	}
	e := newFirewalledEnv(t, target, func(o *framework.EdgeOptions, gateway string) {
		// From the environment, as in a pod: a flag would show the
		// password in the process list. The edge inherits the test's
		// environment; its API server, on loopback, is not proxied.
		t.Setenv("HTTPS_PROXY", "http://ferry:fw-proxy-secret@"+gateway)
		t.Setenv("NO_PROXY", "")
		t.Setenv("no_proxy", "")
		o.BrokerAddress = brokerTarget
		o.ExtraArgs = append(o.ExtraArgs, "--broker-server-name", "localhost")
	})
	e.assertSyncs(t, "fwproxy.example.com", "Tollgate", "tollgates")
	counts, err := proxy.Counts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if counts["accepted"] != 1 || counts["refused"] != 0 {
		t.Errorf("proxy counts %v, want exactly the edge's one tunnel and no refusal", counts)
	}
	waitLog(t, proxy.Process, 5*time.Second, "CONNECT accepted", brokerTarget)
	assertLogLacks(t, e.edge, "fw-proxy-secret")
}

package e2e

import (
	"context"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
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
	svc, err := framework.StartServiceClusterIn(ctx, ns, env.bins, "fw", filepath.Join(dir, "service"), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := svc.Stop(); err != nil {
			t.Errorf("stopping the namespace's service cluster: %v", err)
		}
	})

	e := &pubEnv{label: sanitize(t.Name()), path: env.provider, service: svc}
	e.pki, e.export, e.broker = brokerFor(t)
	if e.kcp, err = framework.KCPClient(env.kcp.Config); err != nil {
		t.Fatal(err)
	}
	gateway, err := ns.Gateway(e.broker.Address)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("network namespace %s: broker %s reachable inside only as %s", ns.Name, e.broker.Address, gateway)

	// The firewall: nothing but loopback inside, and neither kcp nor the
	// broker's real address answers from there. Each address answers from
	// the host, so a failure inside is the namespace's doing.
	ifs, err := ns.Interfaces()
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
	for what, addr := range map[string]string{"kcp": kcpURL.Host, "the broker": e.broker.Address} {
		dialCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		var d net.Dialer
		if c, err := d.DialContext(dialCtx, "tcp", addr); err != nil {
			t.Fatalf("%s at %s does not answer from the host: %v", what, addr, err)
		} else {
			c.Close()
		}
		c, err := ns.DialContext(dialCtx, addr)
		cancel()
		if err == nil {
			c.Close()
			t.Fatalf("%s at %s is reachable from inside the network namespace", what, addr)
		}
		t.Logf("%s at %s from inside the namespace: %v", what, addr, err)
	}

	o := framework.EdgeOptionsFor(e.pki, "edge")
	o.Name, o.LogDir, o.NetNS = "fw-edge", dir, ns
	o.BrokerAddress, o.Kubeconfig = gateway, svc.Kubeconfig
	o.ExtraArgs = []string{"--heartbeat-interval", "1s", "--published-resource-selector", testLabel + "=" + e.label}
	if e.edge, err = framework.StartEdge(env.bins, o); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopChecked(t, e.edge) })
	if _, err := framework.WaitEdgeState(ctx, adminConn(t, e.broker, e.pki), devpki.IdentityFor("edge"),
		ferryv1.EdgeState_EDGE_STATE_CONNECTED, time.Minute); err != nil {
		t.Fatalf("the edge in the namespace did not connect through the gateway: %v", err)
	}
	waitProbe(t, e.edge, "/readyz", http.StatusOK, "")

	// Publish a CRD whose objects name a Secret the service cluster makes
	// (as cert-manager would): the Secret is the related object.
	crd := testCRD("firewall.example.com", "Gate", "gates", apiextensionsv1.NamespaceScoped, "v1")
	applyTo(t, svc, crd)
	e.publish(t, "gates", ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: crd.Spec.Group, Kind: crd.Spec.Names.Kind, Version: "v1"},
		Related: []ferryv1alpha1.RelatedResourceSpec{{
			Identifier: "tls", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
			Reference: ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
		}},
	})
	s := publishedSyncEnv(t, e, crd)
	s.useConsumer(t, bindConsumer(t, e, "fw"))
	svcKube, err := kubernetes.NewForConfig(svc.Config)
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

	// All of it over the one connection the gateway carries.
	assertLogLacks(t, e.edge, "reconnecting")
}

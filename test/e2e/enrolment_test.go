package e2e

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
	"github.com/ferry-dev/ferry/test/framework"
)

// enrolEnv is a broker that signs edge certificates with its development
// CA, for two configured identities that hold no certificate yet.
type enrolEnv struct {
	pki          string
	export       config.APIExportRef
	broker       *framework.Broker
	idA, idB     string
	label        string
	credsNS      string
	brokerConfig string
}

func newEnrolEnv(t *testing.T, brokerArgs ...string) *enrolEnv {
	t.Helper()
	pki := newPKI(t, "pki", "admin")
	for i, a := range brokerArgs {
		// A --broker-ca of the test's starts as a copy of the PKI's CA.
		if a == "--broker-ca" && i+1 < len(brokerArgs) {
			ca, err := os.ReadFile(filepath.Join(pki, devpki.CACertFile))
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, brokerArgs[i+1], string(ca))
		}
	}
	e := &enrolEnv{
		pki: pki, export: newExport(t), label: sanitize(t.Name()), credsNS: "ferry-system",
		idA: "spiffe://ferry.local/enrolled-a-" + sanitize(t.Name()), idB: "spiffe://ferry.local/enrolled-b-" + sanitize(t.Name()),
	}
	if len(e.label) > 63 {
		e.label = e.label[:63]
	}
	exportB := newExportNamed(t, e.export.Name+"-b")
	ca := filepath.Join(e.pki, devpki.CACertFile)
	e.broker = startBroker(t, e.pki, config.Config{
		Edges: []config.Edge{
			{Identity: e.idA, Name: "enrolled-a", APIExport: e.export},
			{Identity: e.idB, Name: "enrolled-b", APIExport: exportB},
		},
		Admins: []string{devpki.IdentityFor("admin")},
	}, append([]string{"--edge-signing-cert", ca, "--edge-signing-key", filepath.Join(e.pki, devpki.CAKeyFile)}, brokerArgs...)...)
	e.brokerConfig = filepath.Join(e.broker.Opts.Dir, e.broker.Opts.Name+"-config.yaml")
	return e
}

// newExportNamed creates one more APIExport for the test.
func newExportNamed(t *testing.T, name string) config.APIExportRef {
	t.Helper()
	if err := framework.CreateAPIExport(context.Background(), env.kcp.Config, env.provider, name); err != nil {
		t.Fatal(err)
	}
	return config.APIExportRef{Workspace: env.provider.String(), Name: name}
}

// createToken runs `ferry-broker enrolment-token create` and returns the
// token and the fingerprint it prints.
func (e *enrolEnv) createToken(t *testing.T, identity string, extra ...string) (token, fingerprint string) {
	t.Helper()
	args := append([]string{"enrolment-token", "create", "--config", e.brokerConfig, "--kcp-kubeconfig", env.kcp.StableKubeconfig,
		"--identity", identity, "--broker-ca", filepath.Join(e.pki, devpki.CACertFile)}, extra...)
	out, err := exec.Command(env.bins.Broker, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ferry-broker enrolment-token create: %v\n%s", err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		fields := strings.Fields(line)
		switch {
		case strings.HasPrefix(line, "token:") && len(fields) == 2:
			token = fields[1]
		case strings.HasPrefix(line, "broker CA fingerprint:") && len(fields) >= 4:
			fingerprint = fields[3]
		}
	}
	if token == "" || !strings.HasPrefix(fingerprint, "sha256:") || !strings.Contains(string(out), "--broker-ca-fingerprint "+fingerprint) {
		t.Fatalf("unexpected output of enrolment-token create:\n%s", out)
	}
	return token, fingerprint
}

// startEnrollingEdge starts an edge holding no certificate: only the
// token (in a file) and the fingerprint, its credentials kept in secret.
func (e *enrolEnv) startEnrollingEdge(t *testing.T, name, token, fingerprint, secret string) *framework.Process {
	t.Helper()
	args := []string{"--heartbeat-interval", "1s", "--published-resource-selector", testLabel + "=" + e.label,
		"--credentials-secret", e.credsNS + "/" + secret, "--leader-election-namespace", e.credsNS}
	if token != "" {
		tokenFile := filepath.Join(testDir(t), name+".token")
		writeFile(t, tokenFile, token+"\n")
		args = append(args, "--enrolment-token-file", tokenFile, "--broker-ca-fingerprint", fingerprint)
	}
	p, err := framework.StartEdge(env.bins, framework.EdgeOptions{
		Name: name, LogDir: testDir(t), BrokerAddress: e.broker.Address, Kubeconfig: env.service.Kubeconfig, ExtraArgs: args,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// enrolDirect calls the broker's Enrol as an edge would, with a CSR that
// claims claimed, and returns the issued certificate or the error.
func (e *enrolEnv) enrolDirect(t *testing.T, token, claimed string) (*x509.Certificate, error) {
	t.Helper()
	bundle, err := os.ReadFile(filepath.Join(e.pki, devpki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	roots, err := tlsconfig.ParseBundle(bundle)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(e.broker.Address, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots})))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	u, _ := url.Parse(claimed)
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: claimed}, URIs: []*url.URL{u}}, key)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := ferryv1.NewEnrolmentServiceClient(conn).Enrol(ctx, &ferryv1.EnrolRequest{Token: token, CertificateSigningRequestDer: csr})
	if err != nil {
		return nil, err
	}
	certs, err := tlsconfig.ParseCertificates(resp.GetCertificateChainPem())
	if err != nil {
		t.Fatal(err)
	}
	return certs[0], nil
}

// syncThrough publishes a CRD through the connected edge and checks that an
// object created in a consumer workspace reaches the service cluster.
func (e *enrolEnv) syncThrough(t *testing.T, edge *framework.Process, group, kind, plural string) *syncEnv {
	t.Helper()
	p := &pubEnv{label: e.label, path: env.provider, export: e.export, broker: e.broker, edge: edge, pki: e.pki}
	var err error
	if p.kcp, err = framework.KCPClient(env.kcp.Config); err != nil {
		t.Fatal(err)
	}
	crd := testCRD(group, kind, plural, apiextensionsv1.NamespaceScoped, "v1")
	apply(t, crd)
	p.publish(t, plural, ferryv1alpha1.PublishedResourceSpec{Resource: ferryv1alpha1.SourceResource{APIGroup: group, Kind: kind, Version: "v1"}})
	s := publishedSyncEnv(t, p, crd)
	s.useConsumer(t, bindConsumer(t, p, "c"))
	return s
}

func (e *enrolEnv) deleteSecretOnCleanup(t *testing.T, name string) {
	kube, err := kubernetes.NewForConfig(env.service.Config)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.CoreV1().Secrets(e.credsNS).Delete(context.Background(), name, metav1.DeleteOptions{})
	})
}

// TestEnrolmentFromToken: an edge started with nothing but a one-time token
// and the broker CA's fingerprint enrols, stores its credentials in a
// Secret and syncs; restarted, it reuses them. The token cannot be used
// again; a token for identity A yields a certificate for A whatever the
// CSR claims; an expired token is refused with a reason the edge shows.
func TestEnrolmentFromToken(t *testing.T) {
	ctx := context.Background()
	e := newEnrolEnv(t)
	secret := "creds-" + e.label
	if len(secret) > 63 {
		secret = secret[:63]
	}
	e.deleteSecretOnCleanup(t, secret)
	kube, err := kubernetes.NewForConfig(env.service.Config)
	if err != nil {
		t.Fatal(err)
	}

	token, fingerprint := e.createToken(t, e.idA)
	edge := e.startEnrollingEdge(t, "enrolled-edge", token, fingerprint, secret)
	t.Cleanup(func() { stopChecked(t, edge) })
	if _, err := framework.WaitEdgeState(ctx, adminConn(t, e.broker, e.pki), e.idA, ferryv1.EdgeState_EDGE_STATE_CONNECTED, time.Minute); err != nil {
		t.Fatalf("the enrolled edge never connected: %v (log %s)", err, edge.LogFile)
	}
	waitLog(t, edge, 10*time.Second, "enrolled; credentials stored")
	sec, err := kube.CoreV1().Secrets(e.credsNS).Get(ctx, secret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stored, err := tlsconfig.ParseCertificates(sec.Data["tls.crt"])
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := tlsconfig.Identity(stored[0]); id != e.idA || len(sec.Data["tls.key"]) == 0 || len(sec.Data["ca.crt"]) == 0 {
		t.Fatalf("credentials Secret: identity %q, key %d bytes, CA %d bytes", id, len(sec.Data["tls.key"]), len(sec.Data["ca.crt"]))
	}

	s := e.syncThrough(t, edge, "enrolled.example.com", "Permit", "permits")
	s.createRemote(t, "default", "first", map[string]any{"fieldV1": "enrolled"})
	s.waitLocal(t, "default", "first", func(u *unstructured.Unstructured) (bool, string) {
		v, _ := specField(u, "fieldV1")
		return v == "enrolled", "spec.fieldV1 = " + v
	})

	// The same token again: refused, whatever the caller.
	if _, err := e.enrolDirect(t, token, e.idA); status.Code(err) != codes.Unauthenticated || !strings.Contains(err.Error(), "already used") {
		t.Fatalf("second use of the token = %v, want Unauthenticated: already used", err)
	}

	// Restarted with the same (used) token, the edge keeps its stored
	// credentials: it never enrols again.
	stopChecked(t, edge)
	again := e.startEnrollingEdge(t, "enrolled-edge-again", token, fingerprint, secret)
	t.Cleanup(func() { stopChecked(t, again) })
	waitLog(t, again, time.Minute, "using the credentials stored in the Secret")
	s.createRemote(t, "default", "second", map[string]any{"fieldV1": "restarted"})
	s.waitLocal(t, "default", "second", func(u *unstructured.Unstructured) (bool, string) {
		v, _ := specField(u, "fieldV1")
		return v == "restarted", "spec.fieldV1 = " + v
	})
	assertLogLacks(t, again, "enrolling with the broker")

	// A token for B with a CSR claiming A yields B; one for A claiming B
	// yields A.
	tokenB, _ := e.createToken(t, e.idB)
	cert, err := e.enrolDirect(t, tokenB, e.idA)
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := tlsconfig.Identity(cert); id != e.idB || len(cert.URIs) != 1 || cert.Subject.CommonName != "" {
		t.Fatalf("a token for %s issued %q (URIs %v, CN %q)", e.idB, id, cert.URIs, cert.Subject.CommonName)
	}
	tokenA, _ := e.createToken(t, e.idA)
	if cert, err = e.enrolDirect(t, tokenA, e.idB); err != nil {
		t.Fatal(err)
	}
	if id, _ := tlsconfig.Identity(cert); id != e.idA {
		t.Fatalf("a token for %s issued %q", e.idA, id)
	}

	// An expired token is refused, and the edge says why.
	expired, fp := e.createToken(t, e.idA, "--ttl", "1s")
	time.Sleep(2 * time.Second)
	late := e.startEnrollingEdge(t, "late-edge", expired, fp, secret+"-late")
	e.deleteSecretOnCleanup(t, secret+"-late")
	select {
	case <-late.Exited():
	case <-time.After(time.Minute):
		late.Kill()
		t.Fatalf("an edge with an expired token kept running (log %s)", late.LogFile)
	}
	log, _ := late.Log()
	if !strings.Contains(string(log), "enrolment token expired at") || late.ExitErr() == nil {
		t.Fatalf("edge with an expired token: exit %v, log %s:\n%s", late.ExitErr(), late.LogFile, logTail(late, 10, 400))
	}
}

// TestCertificateRenewal is the soak: with two-minute certificates
// the enrolled edge runs ten minutes. It renews over its stream every eighty
// seconds (two thirds of the lifetime), reconnects once per renewal with the
// new certificate, never reaches a certificate's expiry, and loses nothing:
// an object created in kcp every twenty seconds, through the renewals'
// reconnects, is synced and its status comes back. A broker CA bundle
// rotated on disk reaches the edge with the next renewal.
func TestCertificateRenewal(t *testing.T) {
	const (
		lifetime = 2 * time.Minute
		soak     = 10 * time.Minute
		every    = 20 * time.Second
	)
	ctx := context.Background()
	// The bundle handed to edges is a file of its own, rotated below.
	brokerCA := filepath.Join(testDir(t), "broker-ca.crt")
	e := newEnrolEnv(t, "--edge-certificate-lifetime", lifetime.String(), "--broker-ca", brokerCA)
	secret := "creds-" + e.label
	if len(secret) > 63 {
		secret = secret[:63]
	}
	e.deleteSecretOnCleanup(t, secret)
	token, fingerprint := e.createToken(t, e.idA)
	edge := e.startEnrollingEdge(t, "renewing-edge", token, fingerprint, secret)
	t.Cleanup(func() { stopChecked(t, edge) })
	if _, err := framework.WaitEdgeState(ctx, adminConn(t, e.broker, e.pki), e.idA, ferryv1.EdgeState_EDGE_STATE_CONNECTED, time.Minute); err != nil {
		t.Fatalf("the enrolled edge never connected: %v (log %s)", err, edge.LogFile)
	}
	s := e.syncThrough(t, edge, "renewed.example.com", "Pass", "passes")
	kube, err := kubernetes.NewForConfig(env.service.Config)
	if err != nil {
		t.Fatal(err)
	}

	// A CA added to the broker's bundle on disk reaches the edge with the
	// next renewal, without a restart.
	extra := filepath.Join(testDir(t), "extra-ca")
	if _, err := devpki.LoadOrCreateCA(extra, "extra CA"); err != nil {
		t.Fatal(err)
	}
	extraPEM, err := os.ReadFile(filepath.Join(extra, devpki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}

	// Traffic through the whole soak, also while the edge reconnects.
	start := time.Now()
	var names []string
	rotated := false
	for time.Since(start) < soak {
		name := fmt.Sprintf("soak-%02d", len(names)+1)
		s.createRemote(t, "default", name, map[string]any{"fieldV1": name})
		names = append(names, name)
		if !rotated && time.Since(start) > soak/3 {
			current, err := os.ReadFile(brokerCA)
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, brokerCA, string(current)+string(extraPEM))
			rotated = true
		}
		time.Sleep(every)
	}
	// Nothing lost: every object has its copy, and every copy's status
	// reaches kcp.
	for _, name := range names {
		local := s.waitLocal(t, "default", name, func(u *unstructured.Unstructured) (bool, string) {
			v, _ := specField(u, "fieldV1")
			return v == name, "spec.fieldV1 = " + v
		})
		_ = unstructured.SetNestedField(local.Object, "Ready", "status", "phase")
		if _, err := s.local.Namespace(local.GetNamespace()).UpdateStatus(ctx, local, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range names {
		s.waitRemote(t, "default", name, func(u *unstructured.Unstructured, err error) (bool, string) {
			if err != nil {
				return false, err.Error()
			}
			phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
			return phase == "Ready", "status.phase = " + phase
		})
	}

	// The Secret holds the latest certificate and the rotated bundle.
	sec, err := kube.CoreV1().Secrets(e.credsNS).Get(ctx, secret, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	stored, err := tlsconfig.ParseCertificates(sec.Data["tls.crt"])
	if err != nil {
		t.Fatal(err)
	}
	if left := time.Until(stored[0].NotAfter); left <= 0 || left > lifetime {
		t.Errorf("the stored certificate expires in %s, want a renewed %s certificate", left, lifetime)
	}
	if bundle, err := tlsconfig.ParseCertificates(sec.Data["ca.crt"]); err != nil || len(bundle) != 2 {
		t.Errorf("the stored broker CA bundle has %d certificates (%v), want the rotated bundle's 2", len(bundle), err)
	}
	// One connect at start plus at most one per renewal; never an expiry.
	log, _ := edge.Log()
	connects, renewed := 0, 0
	for _, line := range strings.Split(string(log), "\n") {
		if strings.Contains(line, `"msg":"connected to broker"`) {
			connects++
		}
		if containsAll(line, []string{`"ferry-edge.renewal"`, `"msg":"client certificate renewed; reconnecting with it"`}) {
			renewed++
		}
	}
	// Renewals every two thirds of the lifetime; the first certificate
	// came at enrolment, before the soak.
	if want := int(soak / (lifetime * 2 / 3)); renewed < want-1 || connects > renewed+1 {
		t.Errorf("%d connects for %d renewals in %s (want at least %d renewals, at most one reconnect each; log %s)",
			connects, renewed, time.Since(start).Round(time.Second), want-1, edge.LogFile)
	}
	t.Logf("soak: %s, %d objects, %d renewals, %d connects", time.Since(start).Round(time.Second), len(names), renewed, connects)
	assertLogLacks(t, e.broker.Process, "client certificate expired at")
	assertLogLacks(t, edge, "certificate renewal failed")
}

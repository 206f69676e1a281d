package server

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"k8s.io/client-go/kubernetes/fake"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/utils/clock"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/enrolment"
	"github.com/ferry-dev/ferry/broker/kcp"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/pkg/protocol"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// withEnrolment turns enrolment on: the test PKI's CA signs, tokens live in
// one fake clientset per workspace.
func withEnrolment(t *testing.T, blocklist enrolment.Blocklist) func(*Options, string) {
	return func(o *Options, pki string) {
		ca := filepath.Join(pki, devpki.CACertFile)
		signer, err := enrolment.LoadSigner(ca, filepath.Join(pki, devpki.CAKeyFile), ca, time.Hour, clock.RealClock{})
		if err != nil {
			t.Fatal(err)
		}
		workspaces := map[string]*fake.Clientset{}
		clients := enrolment.ClientsFunc(func(ws string) (corev1client.SecretsGetter, error) {
			if workspaces[ws] == nil {
				workspaces[ws] = fake.NewClientset()
			}
			return workspaces[ws].CoreV1(), nil
		})
		o.Enrolment = EnrolmentOptions{
			Signer:    signer,
			Tokens:    enrolment.NewTokenStore(clients, "default", o.Config, clock.RealClock{}),
			BrokerCA:  enrolment.BrokerCAFiles{BundleFile: ca, ServingCertFile: devpki.CertFile(pki, "broker")},
			Blocklist: blocklist,
		}
	}
}

// dialAnonymous connects with TLS that verifies the broker but presents no
// client certificate.
func (tb *testBroker) dialAnonymous(t *testing.T) *grpc.ClientConn {
	t.Helper()
	bundle, err := os.ReadFile(filepath.Join(tb.pki, devpki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	roots, err := tlsconfig.ParseBundle(bundle)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(tb.addr, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// dialWith connects presenting in-memory credentials.
func (tb *testBroker) dialWith(t *testing.T, creds *tlsconfig.Credentials) *grpc.ClientConn {
	t.Helper()
	cfg, err := tlsconfig.NewMemoryClient(creds, "", tlsconfig.Profile{}).Config()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(tb.addr, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestCallsWithoutClientCertificate(t *testing.T) {
	for _, enrolOn := range []bool{false, true} {
		var mutate []func(*Options, string)
		if enrolOn {
			mutate = append(mutate, withEnrolment(t, nil))
		}
		tb := startTestBrokerWith(t, fakeResolver{}, &echoApplier{}, mutate...)
		conn := tb.dialAnonymous(t)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()

		_, _, err := connect(t, conn, helloRequest(validHello()))
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("enrolment %v: Connect without a certificate = %v, want Unauthenticated", enrolOn, err)
		}
		_, err = ferryv1.NewAdminServiceClient(conn).ListEdges(ctx, &ferryv1.ListEdgesRequest{})
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("enrolment %v: ListEdges without a certificate = %v, want Unauthenticated", enrolOn, err)
		}
		_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
		if status.Code(err) != codes.Unauthenticated {
			t.Errorf("enrolment %v: health without a certificate = %v, want Unauthenticated", enrolOn, err)
		}
		resp, err := ferryv1.NewEnrolmentServiceClient(conn).GetBrokerCA(ctx, &ferryv1.GetBrokerCARequest{})
		switch {
		case enrolOn && (err != nil || len(resp.GetBrokerCaBundlePem()) == 0):
			t.Errorf("GetBrokerCA without a certificate = %v, %v; want the bundle", resp, err)
		case !enrolOn && (status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "--edge-signing-cert")):
			t.Errorf("GetBrokerCA of a broker without a signing CA = %v, want FailedPrecondition naming the flags", err)
		}
		// A client certificate still works as before.
		if _, err := healthpb.NewHealthClient(tb.dial(t, "edge-a")).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
			t.Errorf("health with a certificate: %v", err)
		}
		tb.stop()
	}
}

// newCSR returns a key and a CSR claiming to be someone else.
func newCSR(t *testing.T) (*ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{DNSNames: []string{"mallory"}}, key)
	if err != nil {
		t.Fatal(err)
	}
	return key, der
}

func credentialsOf(t *testing.T, key *ecdsa.PrivateKey, chainPEM, bundlePEM []byte) *tlsconfig.Credentials {
	t.Helper()
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	creds, err := tlsconfig.ParseCredentials(chainPEM, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), bundlePEM, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return creds
}

var resolverA = fakeResolver{states: map[config.APIExportRef]kcp.ExportState{exportA: {LogicalCluster: "abc"}}}

type blockIdentity string

func (b blockIdentity) Blocked(identity, _ string) (string, bool) {
	return "leaked in a test", identity == string(b)
}

func TestEnrolConnectAndRenew(t *testing.T) {
	tb := startTestBrokerWith(t, resolverA, &echoApplier{}, withEnrolment(t, blockIdentity(devpki.IdentityFor("edge-b"))))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin := ferryv1.NewAdminServiceClient(tb.dial(t, "admin"))

	// Only admins create tokens; unknown identities and long lifetimes are
	// refused.
	if _, err := ferryv1.NewAdminServiceClient(tb.dial(t, "edge-a")).CreateEnrolmentToken(ctx, &ferryv1.CreateEnrolmentTokenRequest{Identity: devpki.IdentityFor("edge-a")}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("CreateEnrolmentToken by an edge = %v, want PermissionDenied", err)
	}
	if _, err := admin.CreateEnrolmentToken(ctx, &ferryv1.CreateEnrolmentTokenRequest{Identity: "spiffe://nobody"}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("CreateEnrolmentToken for an unknown identity = %v, want InvalidArgument", err)
	}
	if _, err := admin.CreateEnrolmentToken(ctx, &ferryv1.CreateEnrolmentTokenRequest{Identity: devpki.IdentityFor("edge-a"), Ttl: durationpb.New(200 * time.Hour)}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("CreateEnrolmentToken for 200h = %v, want InvalidArgument", err)
	}
	tok, err := admin.CreateEnrolmentToken(ctx, &ferryv1.CreateEnrolmentTokenRequest{Identity: devpki.IdentityFor("edge-a")})
	if err != nil {
		t.Fatal(err)
	}
	caPEM, _ := os.ReadFile(filepath.Join(tb.pki, devpki.CACertFile))
	caCerts, _ := tlsconfig.ParseCertificates(caPEM)
	if tok.GetBrokerCaFingerprint() != tlsconfig.Fingerprint(caCerts[0]) {
		t.Errorf("fingerprint = %s, want the CA's %s", tok.GetBrokerCaFingerprint(), tlsconfig.Fingerprint(caCerts[0]))
	}

	enrol := ferryv1.NewEnrolmentServiceClient(tb.dialAnonymous(t))
	key, csr := newCSR(t)
	// A broken CSR is refused without burning the token.
	if _, err := enrol.Enrol(ctx, &ferryv1.EnrolRequest{Token: tok.GetToken(), CertificateSigningRequestDer: []byte("junk")}); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("Enrol with a junk CSR = %v, want InvalidArgument", err)
	}
	resp, err := enrol.Enrol(ctx, &ferryv1.EnrolRequest{Token: tok.GetToken(), CertificateSigningRequestDer: csr})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetIdentity() != devpki.IdentityFor("edge-a") {
		t.Fatalf("enrolled identity = %q", resp.GetIdentity())
	}
	if _, err := enrol.Enrol(ctx, &ferryv1.EnrolRequest{Token: tok.GetToken(), CertificateSigningRequestDer: csr}); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("second Enrol with the same token = %v, want Unauthenticated", err)
	}
	creds := credentialsOf(t, key, resp.GetCertificateChainPem(), resp.GetBrokerCaBundlePem())
	if id, _ := tlsconfig.Identity(creds.Certificate.Leaf); id != devpki.IdentityFor("edge-a") {
		t.Fatalf("certificate identity = %q", id)
	}

	// A blocked identity's token is consumed and refused.
	tokB, err := admin.CreateEnrolmentToken(ctx, &ferryv1.CreateEnrolmentTokenRequest{Identity: devpki.IdentityFor("edge-b")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := enrol.Enrol(ctx, &ferryv1.EnrolRequest{Token: tokB.GetToken(), CertificateSigningRequestDer: csr}); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "leaked in a test") {
		t.Fatalf("Enrol of a blocked identity = %v, want PermissionDenied with the reason", err)
	}

	// The enrolled certificate connects; the broker offers renewal.
	hello := validHello()
	hello.Capabilities = protocol.Capabilities()
	stream, first, err := connect(t, tb.dialWith(t, creds), helloRequest(hello))
	if err != nil {
		t.Fatal(err)
	}
	if got := first.GetHello().GetCapabilities(); !containsCapability(got, ferryv1.Capability_CAPABILITY_CERTIFICATE_RENEWAL) {
		t.Fatalf("hello capabilities = %v, want certificate renewal", got)
	}
	newKey, renewCSR := newCSR(t)
	if err := stream.Send(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_CertificateRenewal{CertificateRenewal: &ferryv1.CertificateRenewal{CertificateSigningRequestDer: renewCSR}}}); err != nil {
		t.Fatal(err)
	}
	var issued *ferryv1.IssuedCertificate
	for issued == nil {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		issued = msg.GetIssuedCertificate()
	}
	if issued.GetErrorMessage() != "" {
		t.Fatalf("renewal refused: %s", issued.GetErrorMessage())
	}
	renewed := credentialsOf(t, newKey, issued.GetCertificateChainPem(), issued.GetBrokerCaBundlePem())
	if id, _ := tlsconfig.Identity(renewed.Certificate.Leaf); id != devpki.IdentityFor("edge-a") {
		t.Fatalf("renewed identity = %q", id)
	}
	// A junk renewal is answered with a reason; the stream goes on.
	if err := stream.Send(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_CertificateRenewal{CertificateRenewal: &ferryv1.CertificateRenewal{CertificateSigningRequestDer: []byte("junk")}}}); err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if ic := msg.GetIssuedCertificate(); ic != nil {
			if !strings.Contains(ic.GetErrorMessage(), "invalid certificate signing request") || len(ic.GetCertificateChainPem()) != 0 {
				t.Fatalf("junk renewal answer = %v", ic)
			}
			break
		}
	}
}

func containsCapability(caps []ferryv1.Capability, c ferryv1.Capability) bool {
	for _, x := range caps {
		if x == c {
			return true
		}
	}
	return false
}

func TestStreamEndsWhenItsCertificateExpires(t *testing.T) {
	tb := startTestBrokerWith(t, resolverA, &echoApplier{}, withEnrolment(t, nil))
	// The signer's minimum lifetime is a minute: issue a 3-second
	// certificate straight from the test CA instead.
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	chain := issueShort(t, tb.pki, devpki.IdentityFor("edge-a"), key, time.Now().Add(3*time.Second))
	caPEM, _ := os.ReadFile(filepath.Join(tb.pki, devpki.CACertFile))
	creds := credentialsOf(t, key, chain, caPEM)
	stream, _, err := connect(t, tb.dialWith(t, creds), helloRequest(validHello()))
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err = stream.Recv(); err != nil {
			break
		}
	}
	if st := status.Convert(err); st.Code() != codes.Unauthenticated || !strings.Contains(st.Message(), "client certificate expired at") {
		t.Fatalf("stream ended with %v, want Unauthenticated: client certificate expired", err)
	}
}

func issueShort(t *testing.T, pki, identity string, key *ecdsa.PrivateKey, notAfter time.Time) []byte {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(filepath.Join(pki, devpki.CACertFile), filepath.Join(pki, devpki.CAKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(identity)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), NotBefore: time.Now().Add(-time.Minute), NotAfter: notAfter,
		URIs: []*url.URL{u}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, key.Public(), pair.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

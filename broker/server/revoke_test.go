package server

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	clienttesting "k8s.io/client-go/testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/kcp"
	"github.com/ferry-dev/ferry/broker/revocation"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/pkg/metrics"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// certFingerprint is the fingerprint of a client certificate of the test
// PKI.
func certFingerprint(t *testing.T, pki, client string) string {
	t.Helper()
	data, err := os.ReadFile(devpki.CertFile(pki, client))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatal("no PEM block in the certificate file")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return tlsconfig.Fingerprint(cert)
}

// revokeBroker is a test broker whose revocations are kept in a fake kcp
// (one clientset for every workspace) and whose metrics are gathered.
type revokeBroker struct {
	*testBroker
	kcp     *fake.Clientset
	metrics *prometheus.Registry
}

func startRevokeBroker(t *testing.T, revoked func(pki string) []config.Revocation) *revokeBroker {
	t.Helper()
	rb := &revokeBroker{kcp: fake.NewSimpleClientset(), metrics: prometheus.NewRegistry()}
	m, err := metrics.NewBroker(rb.metrics)
	if err != nil {
		t.Fatal(err)
	}
	rb.testBroker = startTestBrokerWith(t, fakeResolver{states: map[config.APIExportRef]kcp.ExportState{exportA: {LogicalCluster: "abc"}}}, &echoApplier{},
		func(o *Options, pki string) {
			if revoked != nil {
				o.Config.Revoked = revoked(pki)
			}
			o.Metrics = m
			o.Revocations = revocation.New(revocation.Options{
				Config: o.Config, Namespace: "ferry-state", Log: logr.Discard(),
				Clients: revocation.ClientsFunc(func(string) (corev1client.SecretsGetter, error) { return rb.kcp.CoreV1(), nil }),
			})
		})
	return rb
}

func (rb *revokeBroker) refusals(t *testing.T, reason string) float64 {
	t.Helper()
	families, err := rb.metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "ferry_broker_handshake_refusals_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

func TestConnectRefusesRevoked(t *testing.T) {
	idA, idB := devpki.IdentityFor("edge-a"), devpki.IdentityFor("edge-b")
	var fpA string
	rb := startRevokeBroker(t, func(pki string) []config.Revocation {
		fpA = certFingerprint(t, pki, "edge-a")
		return []config.Revocation{
			{Identity: idA, CertificateSHA256: fpA, Reason: "laptop stolen"},
			{Identity: idB, Reason: "decommissioned"},
		}
	})
	tests := []struct {
		name, client string
		wantCode     codes.Code
		wantMsg      string
	}{
		{name: "revoked certificate", client: "edge-a", wantCode: codes.Unauthenticated,
			wantMsg: "client certificate " + fpA + ` of identity "` + idA + `" is revoked: laptop stolen`},
		{name: "blocked identity", client: "edge-b", wantCode: codes.Unauthenticated,
			wantMsg: `identity "` + idB + `" is blocked: decommissioned`},
		{name: "another identity of the same export", client: "edge-a2", wantCode: codes.OK},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, resp, err := connect(t, rb.dial(t, tc.client), helloRequest(validHello()))
			st := status.Convert(err)
			if st.Code() != tc.wantCode || st.Message() != tc.wantMsg && tc.wantCode != codes.OK {
				t.Fatalf("got %v %q; want %v %q", st.Code(), st.Message(), tc.wantCode, tc.wantMsg)
			}
			if tc.wantCode == codes.OK && resp.GetHello() == nil {
				t.Fatalf("accepted stream answered %v", resp)
			}
		})
	}
	if n := rb.refusals(t, refusedRevoked); n != 2 {
		t.Errorf("%s refusals = %v, want 2", refusedRevoked, n)
	}
}

func TestRevokeEndsTheStreamAtOnceWithTheReason(t *testing.T) {
	ctx := context.Background()
	rb := startRevokeBroker(t, nil)
	idA := devpki.IdentityFor("edge-a")
	fpA := certFingerprint(t, rb.pki, "edge-a")
	stream, resp, err := connect(t, rb.dial(t, "edge-a"), helloRequest(validHello()))
	if err != nil || resp.GetHello() == nil {
		t.Fatalf("connect: %v %v", resp, err)
	}
	admin := ferryv1.NewAdminServiceClient(rb.dial(t, "admin"))
	list, err := admin.ListEdges(ctx, &ferryv1.ListEdgesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list.GetEdges() {
		if e.GetIdentity() == idA && e.GetCertificateSha256() != fpA {
			t.Errorf("ListEdges shows certificate %q, want %q", e.GetCertificateSha256(), fpA)
		}
	}

	ended := make(chan error, 1)
	go func() {
		for {
			if _, err := stream.Recv(); err != nil {
				ended <- err
				return
			}
		}
	}()
	// openssl's form: the admin pastes what openssl x509 -fingerprint says.
	got, err := admin.Revoke(ctx, &ferryv1.RevokeRequest{Identity: idA, CertificateSha256: opensslForm(fpA), Reason: "key leaked"})
	if err != nil {
		t.Fatal(err)
	}
	returned := time.Now()
	if got.GetClosedStreams() != 1 {
		t.Errorf("closed_streams = %d, want 1", got.GetClosedStreams())
	}
	want := "client certificate " + fpA + ` of identity "` + idA + `" is revoked: key leaked`
	select {
	case err := <-ended:
		if st := status.Convert(err); st.Code() != codes.Unauthenticated || st.Message() != want {
			t.Errorf("stream ended with %v %q; want Unauthenticated %q", st.Code(), st.Message(), want)
		}
		if d := time.Since(returned); d > time.Second {
			t.Errorf("stream ended %s after Revoke returned, want within 1s", d)
		}
	case <-time.After(time.Second):
		t.Fatal("the stream did not end within 1s of Revoke")
	}

	// Reconnecting is refused, and the block is kept in kcp.
	_, _, err = connect(t, rb.dial(t, "edge-a"), helloRequest(validHello()))
	if st := status.Convert(err); st.Code() != codes.Unauthenticated || st.Message() != want {
		t.Errorf("reconnect: got %v %q", st.Code(), st.Message())
	}
	secrets, err := rb.kcp.CoreV1().Secrets("ferry-state").List(ctx, metav1.ListOptions{})
	if err != nil || len(secrets.Items) != 1 || secrets.Items[0].Type != revocation.SecretType {
		t.Errorf("kept revocations: %v %v", secrets, err)
	}
	// A second revocation of the identity finds no stream left to close.
	got, err = admin.Revoke(ctx, &ferryv1.RevokeRequest{Identity: idA, Reason: "decommissioned"})
	if err != nil || got.GetClosedStreams() != 0 {
		t.Errorf("identity revocation: %v %v", got, err)
	}
}

func opensslForm(fp string) string {
	hexDigits := strings.ToUpper(strings.TrimPrefix(fp, "sha256:"))
	var pairs []string
	for i := 0; i < len(hexDigits); i += 2 {
		pairs = append(pairs, hexDigits[i:i+2])
	}
	return strings.Join(pairs, ":")
}

func TestRevokeRefusals(t *testing.T) {
	rb := startRevokeBroker(t, nil)
	idA := devpki.IdentityFor("edge-a")
	tests := []struct {
		name, client string
		req          *ferryv1.RevokeRequest
		wantCode     codes.Code
		wantMsg      string
	}{
		{name: "not an admin", client: "edge-a", req: &ferryv1.RevokeRequest{Identity: idA, Reason: "x"},
			wantCode: codes.PermissionDenied, wantMsg: "is not an admin"},
		{name: "unknown identity", client: "admin", req: &ferryv1.RevokeRequest{Identity: "spiffe://x/nobody", Reason: "x"},
			wantCode: codes.InvalidArgument, wantMsg: `identity "spiffe://x/nobody" is not configured`},
		{name: "unparsable fingerprint", client: "admin", req: &ferryv1.RevokeRequest{Identity: idA, CertificateSha256: "sha256:zz", Reason: "x"},
			wantCode: codes.InvalidArgument, wantMsg: "certificate_sha256: certificate fingerprint"},
		{name: "empty reason", client: "admin", req: &ferryv1.RevokeRequest{Identity: idA},
			wantCode: codes.InvalidArgument, wantMsg: "reason is required"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ferryv1.NewAdminServiceClient(rb.dial(t, tc.client)).Revoke(context.Background(), tc.req)
			if st := status.Convert(err); st.Code() != tc.wantCode || !strings.Contains(st.Message(), tc.wantMsg) {
				t.Fatalf("got %v %q; want %v containing %q", st.Code(), st.Message(), tc.wantCode, tc.wantMsg)
			}
		})
	}
	if n := len(rb.kcp.Actions()); n != 0 {
		t.Errorf("refused requests reached kcp: %v", rb.kcp.Actions())
	}
}

func TestConnectRefusedWhileRevocationsCannotBeRead(t *testing.T) {
	rb := startRevokeBroker(t, nil)
	var down atomic.Bool
	down.Store(true)
	rb.kcp.PrependReactor("list", "secrets", func(clienttesting.Action) (bool, runtime.Object, error) {
		if down.Load() {
			return true, nil, errors.New("kcp is down")
		}
		return false, nil, nil
	})
	_, _, err := connect(t, rb.dial(t, "edge-a"), helloRequest(validHello()))
	if st := status.Convert(err); st.Code() != codes.Unavailable || !strings.Contains(st.Message(), "kcp is down") {
		t.Fatalf("got %v %q; want Unavailable naming the failure", st.Code(), st.Message())
	}
	if n := rb.refusals(t, refusedRevocationsUnknown); n != 1 {
		t.Errorf("%s refusals = %v, want 1", refusedRevocationsUnknown, n)
	}
	down.Store(false)
	if _, resp, err := connect(t, rb.dial(t, "edge-a"), helloRequest(validHello())); err != nil || resp.GetHello() == nil {
		t.Fatalf("once kcp answers the edge gets in: %v %v", resp, err)
	}
}

package enrol

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"
	"k8s.io/utils/clock"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/enrolment"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// testPKI is a CA with a broker serving certificate for 127.0.0.1.
type testPKI struct {
	dir    string
	bundle []byte
	signer *enrolment.Signer
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	dir := t.TempDir()
	ca, err := devpki.LoadOrCreateCA(dir, "test CA "+t.Name())
	if err != nil {
		t.Fatal(err)
	}
	if err := ca.IssueServer(dir, "broker", []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(dir, devpki.CACertFile)
	bundle, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := enrolment.LoadSigner(caFile, filepath.Join(dir, devpki.CAKeyFile), caFile, time.Hour, clock.RealClock{})
	if err != nil {
		t.Fatal(err)
	}
	return &testPKI{dir: dir, bundle: bundle, signer: signer}
}

func (p *testPKI) fingerprint(t *testing.T) string {
	certs, err := tlsconfig.ParseCertificates(p.bundle)
	if err != nil {
		t.Fatal(err)
	}
	return tlsconfig.Fingerprint(certs[0])
}

// fakeBroker serves the EnrolmentService: its TLS certificate comes from
// serving, the bundle it hands out from bundle; tokens maps a token to the
// identity it names (single use).
type fakeBroker struct {
	ferryv1.UnimplementedEnrolmentServiceServer
	bundle    []byte
	signer    *enrolment.Signer
	tokens    map[string]string
	enrolCall atomic.Int32
}

func (b *fakeBroker) GetBrokerCA(context.Context, *ferryv1.GetBrokerCARequest) (*ferryv1.GetBrokerCAResponse, error) {
	return &ferryv1.GetBrokerCAResponse{BrokerCaBundlePem: b.bundle}, nil
}

func (b *fakeBroker) Enrol(_ context.Context, req *ferryv1.EnrolRequest) (*ferryv1.EnrolResponse, error) {
	b.enrolCall.Add(1)
	id, ok := b.tokens[req.GetToken()]
	if !ok {
		return nil, status.Error(codes.Unauthenticated, "enrolment token expired at 2026-01-01T00:00:00Z")
	}
	delete(b.tokens, req.GetToken())
	issued, err := b.signer.Sign(req.GetCertificateSigningRequestDer(), id)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return &ferryv1.EnrolResponse{CertificateChainPem: issued.ChainPEM, BrokerCaBundlePem: b.bundle, Identity: id}, nil
}

func startFakeBroker(t *testing.T, serving *testPKI, b *fakeBroker) string {
	t.Helper()
	pair, err := tls.LoadX509KeyPair(devpki.CertFile(serving.dir, "broker"), devpki.KeyFile(serving.dir, "broker"))
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{pair}})))
	ferryv1.RegisterEnrolmentServiceServer(g, b)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

func TestEnrol(t *testing.T) {
	pki, other := newTestPKI(t), newTestPKI(t)
	const identity = "spiffe://ferry.local/nora"
	for _, tc := range []struct {
		name        string
		serving     *testPKI // the broker's TLS certificate
		bundle      *testPKI // the bundle GetBrokerCA hands out
		fingerprint func() string
		token       string
		serverName  string
		wantErr     []string
		wantEnrol   bool
	}{
		{name: "enrolled", serving: pki, bundle: pki, token: "good", wantEnrol: true},
		{name: "openssl fingerprint form", serving: pki, bundle: pki, token: "good", wantEnrol: true,
			fingerprint: func() string {
				h := strings.TrimPrefix(pki.fingerprint(t), "sha256:")
				var parts []string
				for i := 0; i < len(h); i += 2 {
					parts = append(parts, strings.ToUpper(h[i:i+2]))
				}
				return strings.Join(parts, ":")
			}},
		{name: "fingerprint mismatch: both named, token not sent", serving: pki, bundle: pki, token: "good",
			fingerprint: func() string { return other.fingerprint(t) },
			wantErr:     []string{"pinned fingerprint " + other.fingerprint(t), "it holds " + pki.fingerprint(t)}},
		{name: "bundle does not verify the connection: token not sent", serving: other, bundle: pki, token: "good",
			wantErr: []string{"does not verify against its CA bundle"}},
		{name: "wrong server name: token not sent", serving: pki, bundle: pki, token: "good", serverName: "broker.example.com",
			wantErr: []string{`for "broker.example.com"`}},
		{name: "token refused: the broker's reason", serving: pki, bundle: pki, token: "stale",
			wantErr: []string{"refused the enrolment (Unauthenticated): enrolment token expired at"}, wantEnrol: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := &fakeBroker{bundle: tc.bundle.bundle, signer: pki.signer, tokens: map[string]string{"good": identity}}
			addr := startFakeBroker(t, tc.serving, b)
			fp := pki.fingerprint(t)
			if tc.fingerprint != nil {
				fp = tc.fingerprint()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			var dialled atomic.Int32
			creds, err := Enrol(ctx, Options{BrokerAddress: addr, ServerName: tc.serverName, Token: tc.token, Fingerprint: fp,
				Dial: func(ctx context.Context, addr string) (net.Conn, error) {
					dialled.Add(1)
					return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
				}})
			if got := b.enrolCall.Load() > 0; got != tc.wantEnrol {
				t.Errorf("Enrol called: %v, want %v", got, tc.wantEnrol)
			}
			if dialled.Load() == 0 {
				t.Error("the dial function was not used")
			}
			if len(tc.wantErr) > 0 {
				var perm *PermanentError
				if !errors.As(err, &perm) {
					t.Errorf("error %v is not permanent: the edge would retry it", err)
				}
				for _, want := range tc.wantErr {
					if err == nil || !strings.Contains(err.Error(), want) {
						t.Fatalf("error = %v, want it to say %q", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got, _ := tlsconfig.Identity(creds.Certificate.Leaf); got != identity {
				t.Fatalf("identity = %q, want %q", got, identity)
			}
			if string(creds.CABundlePEM) != string(pki.bundle) {
				t.Fatal("the CA bundle is not the broker's")
			}
		})
	}
}

// TestEnrolUnreachableIsTransient: an unreachable broker is a transient
// failure (the edge retries); it is not a PermanentError.
func TestEnrolUnreachableIsTransient(t *testing.T) {
	pki := newTestPKI(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err = Enrol(ctx, Options{BrokerAddress: addr, Token: "t", Fingerprint: pki.fingerprint(t), Timeout: 2 * time.Second})
	var perm *PermanentError
	if err == nil || errors.As(err, &perm) {
		t.Fatalf("Enrol against nothing = %v, want a transient error", err)
	}
}

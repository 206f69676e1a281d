package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/pkg/devpki"
)

// TestTLSProfileMismatchNamed runs the real binaries against peers whose
// TLS profile does not meet theirs (ferry-edge cannot be made to offer
// less than TLS 1.3, so the peers are the test's own TLS clients and
// servers, as an old client or an intercepting middlebox would be): the
// broker's log names what the client offered against its flags, and the
// edge's log names its own profile and the broker's flags to compare.
func TestTLSProfileMismatchNamed(t *testing.T) {
	const brokerSuite, otherSuite = "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256", "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"
	pki, _, broker := brokerFor(t, "--tls-min-version", "1.2", "--tls-cipher-suites", brokerSuite)
	cert, err := tls.LoadX509KeyPair(devpki.CertFile(pki, "edge"), devpki.KeyFile(pki, "edge"))
	if err != nil {
		t.Fatal(err)
	}
	caPEM, err := os.ReadFile(filepath.Join(pki, devpki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	dial := func(cfg *tls.Config) error {
		cfg.Certificates, cfg.RootCAs = []tls.Certificate{cert}, roots
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, err := (&tls.Dialer{Config: cfg}).DialContext(ctx, "tcp", broker.Address)
		if err == nil {
			conn.Close()
		}
		return err
	}

	// A TLS 1.2 client with a suite the broker does not allow.
	if err := dial(&tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256}}); err == nil {
		t.Fatal("a TLS 1.2 handshake without a common suite succeeded")
	}
	waitLog(t, broker.Process, 10*time.Second, "refusing TLS handshake",
		"no common cipher suite for TLS 1.2: edge at 127.0.0.1:", "offers ["+otherSuite+"], broker allows ["+brokerSuite+"] (--tls-cipher-suites)")
	// The broker's suite over TLS 1.2, and TLS 1.3, are accepted.
	if err := dial(&tls.Config{MaxVersion: tls.VersionTLS12, CipherSuites: []uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256}}); err != nil {
		t.Errorf("TLS 1.2 with the broker's suite: %v", err)
	}
	if err := dial(&tls.Config{MinVersion: tls.VersionTLS13}); err != nil {
		t.Errorf("TLS 1.3: %v", err)
	}
	data, err := broker.Log()
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(data), "refusing TLS handshake"); n != 1 {
		t.Errorf("the broker logged %d refusals, want 1 (accepted handshakes log none)", n)
	}

	// The edge (default: TLS 1.3 only) against a server that speaks TLS
	// 1.2 at most, with the broker's certificate.
	serverCert, err := tls.LoadX509KeyPair(devpki.CertFile(pki, "broker"), devpki.KeyFile(pki, "broker"))
	if err != nil {
		t.Fatal(err)
	}
	lis, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{serverCert}, MaxVersion: tls.VersionTLS12})
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func(c net.Conn) {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
			}(c)
		}
	}()
	edge := startEdge(t, "edge-old-tls", pki, "edge", lis.Addr().String(), "--leader-elect=false", "--published-resource-selector", testLabel+"=none")
	waitLog(t, edge, time.Minute, "TLS handshake with the broker at "+lis.Addr().String()+" failed",
		"this edge allows TLS 1.3 or later: compare with the broker's --tls-min-version and --tls-cipher-suites")
}

package tlsconfig

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/spf13/pflag"

	"github.com/ferry-dev/ferry/pkg/devpki"
)

const (
	aes128 = tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
	chacha = tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256
)

func TestProfileFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		want    Profile
		wantErr string // in the parse or Validate error
	}{
		{name: "default is TLS 1.3", want: Profile{}},
		{name: "1.3", args: []string{"--tls-min-version", "1.3"}, want: Profile{MinVersion: tls.VersionTLS13}},
		{name: "1.2 with Go's suites", args: []string{"--tls-min-version=1.2"}, want: Profile{MinVersion: tls.VersionTLS12}},
		{name: "TLS-prefixed version", args: []string{"--tls-min-version=TLS1.2"}, want: Profile{MinVersion: tls.VersionTLS12}},
		{name: "1.2 with suites", args: []string{"--tls-min-version=1.2", "--tls-cipher-suites", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256"},
			want: Profile{MinVersion: tls.VersionTLS12, CipherSuites: []uint16{aes128, chacha}}},
		{name: "old version", args: []string{"--tls-min-version=1.1"}, wantErr: `"1.1" is not a supported TLS version; use 1.2 or 1.3`},
		{name: "suites with TLS 1.3 only", args: []string{"--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"},
			wantErr: "--tls-cipher-suites applies to TLS 1.2 only (Go fixes the TLS 1.3 suites); set --tls-min-version 1.2 or drop --tls-cipher-suites"},
		{name: "insecure suite", args: []string{"--tls-min-version=1.2", "--tls-cipher-suites=TLS_RSA_WITH_AES_128_GCM_SHA256"},
			wantErr: "TLS_RSA_WITH_AES_128_GCM_SHA256 is insecure (valid: TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA, "},
		{name: "TLS 1.3 suite", args: []string{"--tls-min-version=1.2", "--tls-cipher-suites=TLS_AES_128_GCM_SHA256"},
			wantErr: "TLS_AES_128_GCM_SHA256 is a TLS 1.3 suite (not configurable) (valid: "},
		{name: "unknown names, all named", args: []string{"--tls-min-version=1.2", "--tls-cipher-suites=FOO,TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,BAR"},
			wantErr: "FOO is not a known cipher suite; BAR is not a known cipher suite (valid: "},
		{name: "empty list", args: []string{"--tls-min-version=1.2", "--tls-cipher-suites=,"}, wantErr: "no cipher suite named"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p Profile
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			p.AddFlags(fs, "peer")
			err := fs.Parse(tt.args)
			if err == nil {
				err = p.Validate()
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want it to contain %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.MinVersion != tt.want.MinVersion || !slices.Equal(p.CipherSuites, tt.want.CipherSuites) {
				t.Fatalf("profile = %+v, want %+v", p, tt.want)
			}
		})
	}
}

func TestProfileApply(t *testing.T) {
	tests := []struct {
		name       string
		p          Profile
		wantMin    uint16
		wantSuites []uint16
	}{
		{name: "default: TLS 1.3, no 1.2 suites", p: Profile{}, wantMin: tls.VersionTLS13},
		{name: "1.2 lists Go's secure suites explicitly", p: Profile{MinVersion: tls.VersionTLS12}, wantMin: tls.VersionTLS12, wantSuites: SecureTLS12Suites()},
		{name: "1.2 with chosen suites", p: Profile{MinVersion: tls.VersionTLS12, CipherSuites: []uint16{chacha}}, wantMin: tls.VersionTLS12, wantSuites: []uint16{chacha}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &tls.Config{CipherSuites: []uint16{1}}
			tt.p.Apply(c)
			if c.MinVersion != tt.wantMin || c.MaxVersion != 0 || !slices.Equal(c.CipherSuites, tt.wantSuites) {
				t.Fatalf("config: min %x max %x suites %v, want min %x suites %v", c.MinVersion, c.MaxVersion, c.CipherSuites, tt.wantMin, tt.wantSuites)
			}
		})
	}
	for _, id := range SecureTLS12Suites() {
		for _, bad := range tls.InsecureCipherSuites() {
			if bad.ID == id {
				t.Errorf("SecureTLS12Suites holds the insecure %s", bad.Name)
			}
		}
	}
}

// TestHandshakeMismatchNamedOnBothSides runs the edge's credentials against
// the broker's server configuration with profiles that do not meet, and
// checks that the broker's log and the edge's error each say what differs.
func TestHandshakeMismatchNamedOnBothSides(t *testing.T) {
	tests := []struct {
		name string
		// broker nil: a foreign TLS server (e.g. an intercepting middlebox)
		// that speaks brokerMax at most.
		broker    *Profile
		brokerMax uint16
		edge      Profile
		// wantBroker is in the broker's log line ("" expects none).
		wantBroker string
		// wantEdge is in the edge's error ("" expects success).
		wantEdge []string
	}{
		{
			name: "matching default", broker: &Profile{}, edge: Profile{},
		},
		{
			name: "matching TLS 1.2 with a common suite", broker: &Profile{MinVersion: tls.VersionTLS12, CipherSuites: []uint16{aes128, chacha}},
			edge: Profile{MinVersion: tls.VersionTLS12, CipherSuites: []uint16{chacha}, maxVersion: tls.VersionTLS12},
		},
		{
			name: "edge speaks TLS 1.2 only, broker requires 1.3", broker: &Profile{},
			edge:       Profile{MinVersion: tls.VersionTLS12, maxVersion: tls.VersionTLS12},
			wantBroker: "offers TLS 1.2 only; this broker requires TLS 1.3 or later (--tls-min-version)",
			wantEdge:   []string{"protocol version not supported", "this edge allows TLS 1.2 only, TLS 1.2 cipher suites [", "compare with the broker's --tls-min-version and --tls-cipher-suites"},
		},
		{
			name:       "no common TLS 1.2 suite",
			broker:     &Profile{MinVersion: tls.VersionTLS12, CipherSuites: []uint16{aes128}},
			edge:       Profile{MinVersion: tls.VersionTLS12, CipherSuites: []uint16{chacha}, maxVersion: tls.VersionTLS12},
			wantBroker: "no common cipher suite for TLS 1.2: edge at 127.0.0.1:PORT offers [TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256], broker allows [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256] (--tls-cipher-suites)",
			wantEdge:   []string{"handshake failure", "this edge allows TLS 1.2 only, TLS 1.2 cipher suites [TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256]"},
		},
		{
			name: "edge requires 1.3, server speaks 1.2 only", brokerMax: tls.VersionTLS12,
			edge:     Profile{},
			wantEdge: []string{"this edge allows TLS 1.3 or later: compare with the broker's --tls-min-version"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir, _ := newPKI(t, "edge")
			files := Files{CertFile: devpki.CertFile(dir, "broker"), KeyFile: devpki.KeyFile(dir, "broker"), CAFile: filepath.Join(dir, devpki.CACertFile)}
			logs := &logSink{}
			var serverCfg *tls.Config
			if tt.broker != nil {
				var err error
				if serverCfg, err = Server(files, *tt.broker, logs.logger()); err != nil {
					t.Fatal(err)
				}
			} else {
				cert, err := tls.LoadX509KeyPair(files.CertFile, files.KeyFile)
				if err != nil {
					t.Fatal(err)
				}
				serverCfg = &tls.Config{Certificates: []tls.Certificate{cert}, MaxVersion: tt.brokerMax}
			}
			client, err := Client(Files{CertFile: devpki.CertFile(dir, "edge"), KeyFile: devpki.KeyFile(dir, "edge"), CAFile: files.CAFile}, "", tt.edge)
			if err != nil {
				t.Fatal(err)
			}
			edgeErr, edgeAddr := handshakeOnce(t, serverCfg, client)

			wantBroker := strings.ReplaceAll(tt.wantBroker, "127.0.0.1:PORT", edgeAddr)
			got := logs.lines()
			switch {
			case wantBroker == "" && len(got) > 0:
				t.Errorf("broker logged %q, want nothing", got)
			case wantBroker != "" && (len(got) != 1 || !strings.Contains(got[0], wantBroker)):
				t.Errorf("broker logged %q, want one line with %q", got, wantBroker)
			}
			if len(tt.wantEdge) == 0 {
				if edgeErr != nil {
					t.Fatalf("edge handshake: %v", edgeErr)
				}
				return
			}
			var he *HandshakeError
			if !errors.As(edgeErr, &he) {
				t.Fatalf("edge error %v (%T), want a *HandshakeError", edgeErr, edgeErr)
			}
			for _, w := range tt.wantEdge {
				if !strings.Contains(edgeErr.Error(), w) {
					t.Errorf("edge error %q, want it to contain %q", edgeErr, w)
				}
			}
			if !strings.Contains(edgeErr.Error(), "TLS handshake with the broker at 127.0.0.1 failed: ") {
				t.Errorf("edge error %q does not name the broker", edgeErr)
			}
		})
	}
}

// TestHandshakeErrorHintsOnlyAtProfiles: a broker certificate the edge
// does not trust is not blamed on the TLS profile.
func TestHandshakeErrorHintsOnlyAtProfiles(t *testing.T) {
	dir, _ := newPKI(t, "edge")
	other, _ := newPKI(t)
	serverCfg, err := Server(Files{CertFile: devpki.CertFile(dir, "broker"), KeyFile: devpki.KeyFile(dir, "broker"), CAFile: filepath.Join(dir, devpki.CACertFile)}, Profile{}, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	client, err := Client(Files{CertFile: devpki.CertFile(dir, "edge"), KeyFile: devpki.KeyFile(dir, "edge"), CAFile: filepath.Join(other, devpki.CACertFile)}, "", Profile{})
	if err != nil {
		t.Fatal(err)
	}
	edgeErr, _ := handshakeOnce(t, serverCfg, client)
	if edgeErr == nil || !strings.Contains(edgeErr.Error(), "certificate") || strings.Contains(edgeErr.Error(), "--tls-min-version") {
		t.Fatalf("edge error %v, want a certificate error without the profile hint", edgeErr)
	}
}

// handshakeOnce accepts one connection with serverCfg and runs the edge's
// gRPC credentials against it over loopback; it returns the edge's error
// and the edge's address as the broker saw it.
func handshakeOnce(t *testing.T, serverCfg *tls.Config, client *ClientConfig) (error, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer lis.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	served := make(chan struct{})
	go func() {
		defer close(served)
		conn, err := lis.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		_ = tls.Server(conn, serverCfg).HandshakeContext(ctx)
	}()
	creds, err := client.TransportCredentials()
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	conn, _, edgeErr := creds.ClientHandshake(ctx, "127.0.0.1", raw)
	if edgeErr == nil {
		conn.Close()
	}
	<-served
	return edgeErr, raw.LocalAddr().String()
}

// logSink collects a logger's lines.
type logSink struct {
	mu  sync.Mutex
	got []string
}

func (s *logSink) logger() logr.Logger {
	return funcr.New(func(prefix, args string) {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.got = append(s.got, fmt.Sprint(prefix, " ", args))
	}, funcr.Options{})
}

func (s *logSink) lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.got)
}

// TestMismatchIgnoresGREASE: reserved version and suite values some
// clients send (RFC 8701) neither hide a mismatch nor show up in it.
func TestMismatchIgnoresGREASE(t *testing.T) {
	tests := []struct {
		name  string
		p     Profile
		hello tls.ClientHelloInfo
		want  string
	}{
		{name: "TLS 1.2 and GREASE against 1.3", p: Profile{},
			hello: tls.ClientHelloInfo{SupportedVersions: []uint16{0xfafa, tls.VersionTLS12}},
			want:  "edge offers TLS 1.2 only; this broker requires TLS 1.3 or later (--tls-min-version)"},
		{name: "TLS 1.3 and GREASE against 1.3", p: Profile{},
			hello: tls.ClientHelloInfo{SupportedVersions: []uint16{0x7a7a, tls.VersionTLS13, tls.VersionTLS12}}},
		{name: "GREASE suite is not named", p: Profile{MinVersion: tls.VersionTLS12, CipherSuites: []uint16{aes128}},
			hello: tls.ClientHelloInfo{SupportedVersions: []uint16{tls.VersionTLS12}, CipherSuites: []uint16{0x2a2a, tls.TLS_AES_128_GCM_SHA256, chacha}},
			want:  "no common cipher suite for TLS 1.2: edge offers [TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256], broker allows [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256] (--tls-cipher-suites)"},
		{name: "common suite", p: Profile{MinVersion: tls.VersionTLS12, CipherSuites: []uint16{aes128}},
			hello: tls.ClientHelloInfo{SupportedVersions: []uint16{tls.VersionTLS12}, CipherSuites: []uint16{chacha, aes128}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.p.Mismatch(&tt.hello); got != tt.want {
				t.Fatalf("Mismatch = %q, want %q", got, tt.want)
			}
		})
	}
}

package main

import (
	"strings"
	"testing"

	"github.com/ferry-dev/ferry/pkg/cli"
)

// TestNetworkFlags: the TLS profile and proxy flags are registered and
// checked with the rest of the options; a bad one stops the edge naming
// the flag.
func TestNetworkFlags(t *testing.T) {
	base := []string{"--broker-address", "broker.example:9443", "--tls-cert", "c", "--tls-key", "k", "--broker-ca", "ca", "--agent-name", "nora"}
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "defaults"},
		{name: "TLS 1.2 with suites", args: []string{"--tls-min-version", "1.2", "--tls-cipher-suites", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"}},
		{name: "suites need TLS 1.2", args: []string{"--tls-cipher-suites", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"}, wantErr: "--tls-cipher-suites applies to TLS 1.2 only"},
		{name: "unknown suite", args: []string{"--tls-min-version", "1.2", "--tls-cipher-suites", "NOPE"}, wantErr: `invalid argument "NOPE" for "--tls-cipher-suites" flag: NOPE is not a known cipher suite (valid: `},
		{name: "old TLS", args: []string{"--tls-min-version", "1.0"}, wantErr: `"1.0" is not a supported TLS version`},
		{name: "proxy URL", args: []string{"--proxy-url", "http://u:p@proxy:3128"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := NewOptions()
			_, err := cli.Parse("ferry-edge", append(append([]string{}, base...), tt.args...), o)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error = %v, want %q", err, tt.wantErr)
			}
		})
	}
}

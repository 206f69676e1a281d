package main

import (
	"strings"
	"testing"

	"github.com/ferry-dev/ferry/pkg/cli"
)

// TestVirtualWorkspaceURLRewriteOption: a rewrite entry that is not
// FROM=TO with bare scheme://host[:port] sides stops the broker at startup
// with a message naming the flag; good ones pass.
func TestVirtualWorkspaceURLRewriteOption(t *testing.T) {
	valid := func() *Options {
		o := NewOptions()
		o.ConfigFile, o.KCPKubeconfig = "broker.yaml", "kcp.kubeconfig"
		o.TLS.CertFile, o.TLS.KeyFile, o.TLS.CAFile = "tls.crt", "tls.key", "ca.crt"
		return o
	}
	tests := []struct {
		value   []string
		wantErr string
	}{
		{value: nil},
		{value: []string{"https://shard-1.kcp.svc:6443=https://kcp.example.com:6443", "https://shard-2.kcp.svc:6443=https://kcp.example.com:6444"}},
		{value: []string{"https://kcp.example.com:6443"}, wantErr: "--virtual-workspace-url-rewrite: invalid virtual workspace URL rewrite"},
		{value: []string{"https://a=https://kcp.example.com/services"}, wantErr: "only a scheme and host[:port] are allowed"},
	}
	for _, tt := range tests {
		o := valid()
		o.VirtualWorkspaceURLRewrite = tt.value
		err := o.Validate()
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%q: %v", tt.value, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%q: error %v, want one saying %q", tt.value, err, tt.wantErr)
		}
	}
}

// TestTLSProfileFlags: the broker takes the same TLS profile flags as the
// edge, checked with the rest of its options.
func TestTLSProfileFlags(t *testing.T) {
	base := []string{"--config", "broker.yaml", "--kcp-kubeconfig", "kcp.kubeconfig", "--tls-cert", "tls.crt", "--tls-key", "tls.key", "--client-ca", "ca.crt"}
	tests := []struct {
		args    []string
		wantErr string
	}{
		{},
		{args: []string{"--tls-min-version", "1.3"}},
		{args: []string{"--tls-min-version", "1.2", "--tls-cipher-suites", "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"}},
		{args: []string{"--tls-cipher-suites", "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384"}, wantErr: "--tls-cipher-suites applies to TLS 1.2 only"},
		{args: []string{"--tls-min-version", "1.2", "--tls-cipher-suites", "TLS_RSA_WITH_AES_128_CBC_SHA"}, wantErr: "TLS_RSA_WITH_AES_128_CBC_SHA is insecure (valid: "},
	}
	for _, tt := range tests {
		_, err := cli.Parse("ferry-broker", append(append([]string{}, base...), tt.args...), NewOptions())
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%q: %v", tt.args, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%q: error %v, want one saying %q", tt.args, err, tt.wantErr)
		}
	}
}

// TestReplicaFlags: --replica-address must be the host:port edges dial; the
// ownership flags are checked only with it.
func TestReplicaFlags(t *testing.T) {
	base := []string{"--config", "broker.yaml", "--kcp-kubeconfig", "kcp.kubeconfig", "--tls-cert", "tls.crt", "--tls-key", "tls.key", "--client-ca", "ca.crt"}
	tests := []struct {
		args    []string
		wantErr string
	}{
		{},
		{args: []string{"--replica-address", "ferry-broker-0.ferry-broker-pods.ferry-system.svc:9443"}},
		{args: []string{"--replica-address", "ferry-broker-0"}, wantErr: `--replica-address "ferry-broker-0" must be host:port`},
		{args: []string{"--replica-address", "b:9443", "--ownership-lease-namespace", "Ferry"}, wantErr: `--ownership-lease-namespace "Ferry" is not a namespace name`},
		{args: []string{"--replica-address", "b:9443", "--ownership-lease-duration", "1s"}, wantErr: "--ownership-lease-duration must be at least 3s"},
		{args: []string{"--ownership-lease-duration", "1s"}},
	}
	for _, tt := range tests {
		_, err := cli.Parse("ferry-broker", append(append([]string{}, base...), tt.args...), NewOptions())
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%q: %v", tt.args, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%q: error %v, want one saying %q", tt.args, err, tt.wantErr)
		}
	}
}

// TestEdgeLeaseRenewalsFlag: the renewal bound is 50 a second unless set; 0
// bounds nothing; a negative or non-finite one stops the broker at start.
func TestEdgeLeaseRenewalsFlag(t *testing.T) {
	base := []string{"--config", "broker.yaml", "--kcp-kubeconfig", "kcp.kubeconfig", "--tls-cert", "tls.crt", "--tls-key", "tls.key", "--client-ca", "ca.crt"}
	tests := []struct {
		args    []string
		want    float64
		wantErr string
	}{
		{want: 50},
		{args: []string{"--edge-lease-renewals-per-second", "0"}, want: 0},
		{args: []string{"--edge-lease-renewals-per-second", "2.5"}, want: 2.5},
		{args: []string{"--edge-lease-renewals-per-second", "-1"}, wantErr: "--edge-lease-renewals-per-second must be a finite number, 0 or more"},
		{args: []string{"--edge-lease-renewals-per-second", "NaN"}, wantErr: "--edge-lease-renewals-per-second must be a finite number, 0 or more"},
		{args: []string{"--edge-lease-renewals-per-second", "+Inf"}, wantErr: "--edge-lease-renewals-per-second must be a finite number, 0 or more"},
	}
	for _, tt := range tests {
		o := NewOptions()
		_, err := cli.Parse("ferry-broker", append(append([]string{}, base...), tt.args...), o)
		switch {
		case tt.wantErr == "" && err != nil:
			t.Errorf("%q: %v", tt.args, err)
		case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
			t.Errorf("%q: error %v, want one saying %q", tt.args, err, tt.wantErr)
		case tt.wantErr == "" && o.EdgeLeaseRenewalsPerSecond != tt.want:
			t.Errorf("%q: %v renewals a second, want %v", tt.args, o.EdgeLeaseRenewalsPerSecond, tt.want)
		}
	}
}

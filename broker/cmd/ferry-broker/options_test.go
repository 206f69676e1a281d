package main

import (
	"strings"
	"testing"
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

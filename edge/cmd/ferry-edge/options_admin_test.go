package main

import (
	"strings"
	"testing"
)

// TestAdminBindAddress: the edge's admin API is plaintext and listens on
// loopback only; any other address stops the edge at start, naming the flag.
func TestAdminBindAddress(t *testing.T) {
	for _, tc := range []struct {
		addr    string
		wantErr bool
	}{
		{"127.0.0.1:8082", false},
		{"[::1]:9000", false},
		{"0", false},
		{":8082", true},
		{"0.0.0.0:8082", true},
		{"192.168.1.10:8082", true},
	} {
		o := NewOptions()
		o.BrokerAddress, o.TLS.CertFile, o.TLS.KeyFile, o.TLS.CAFile, o.AgentName = "broker:443", "c", "k", "ca", "nora"
		o.AdminAddress = tc.addr
		err := o.Validate()
		if (err != nil) != tc.wantErr || (err != nil && !strings.Contains(err.Error(), "--admin-bind-address")) {
			t.Errorf("--admin-bind-address %q: %v", tc.addr, err)
		}
	}
	if NewOptions().AdminAddress != "127.0.0.1:8082" {
		t.Errorf("default %q", NewOptions().AdminAddress)
	}
}

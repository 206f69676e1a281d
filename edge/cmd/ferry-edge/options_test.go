package main

import (
	"testing"
)

// TestListenerDefaults: the edge's listeners default to loopback ports of
// their own, none shared with the broker's defaults (metrics 127.0.0.1:8080,
// probes 127.0.0.1:8081, gRPC :9443), so that README's "Running the
// programs" works on one host as written.
func TestListenerDefaults(t *testing.T) {
	o := NewOptions()
	if o.MetricsAddress != "127.0.0.1:8090" || o.HealthAddress != "127.0.0.1:8091" {
		t.Errorf("metrics %q, probes %q; want 127.0.0.1:8090 and 127.0.0.1:8091", o.MetricsAddress, o.HealthAddress)
	}
	broker := map[string]bool{"127.0.0.1:8080": true, "127.0.0.1:8081": true, ":9443": true}
	seen := map[string]string{}
	for flag, addr := range map[string]string{
		"--metrics-bind-address":      o.MetricsAddress,
		"--health-probe-bind-address": o.HealthAddress,
		"--admin-bind-address":        o.AdminAddress,
	} {
		if broker[addr] {
			t.Errorf("%s defaults to %s, which the broker uses by default", flag, addr)
		}
		if other, dup := seen[addr]; dup {
			t.Errorf("%s and %s both default to %s", flag, other, addr)
		}
		seen[addr] = flag
	}
}

package cli

import (
	"testing"

	"k8s.io/client-go/rest"
)

// TestShareRateLimit: copies of the config, from which every per-workspace
// client is built, share one limiter.
func TestShareRateLimit(t *testing.T) {
	cfg := &rest.Config{Host: "https://example.invalid"}
	ShareRateLimit(cfg, 10, 20)
	a, b := rest.CopyConfig(cfg), rest.CopyConfig(cfg)
	if a.RateLimiter == nil || a.RateLimiter != b.RateLimiter {
		t.Fatal("copies of the config do not share the limiter")
	}
	if got := a.RateLimiter.QPS(); got != 10 {
		t.Errorf("QPS %v, want 10", got)
	}
	// A burst of 20 is available at once, then the bucket is empty.
	for i := range 20 {
		if !a.RateLimiter.TryAccept() {
			t.Fatalf("request %d of the burst refused", i+1)
		}
	}
	if b.RateLimiter.TryAccept() {
		t.Error("the other copy still had tokens: the budget is not shared")
	}
}

package kcp

import "testing"

func TestBaseHost(t *testing.T) {
	tests := []struct{ in, want string }{
		{"https://127.0.0.1:6443/clusters/root", "https://127.0.0.1:6443"},
		{"https://kcp.example.com/clusters/root:org:team", "https://kcp.example.com"},
		{"https://kcp.example.com/prefix/clusters/root", "https://kcp.example.com/prefix"},
		{"https://kcp.example.com", "https://kcp.example.com"},
	}
	for _, tt := range tests {
		got, err := BaseHost(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("BaseHost(%q) = %q, %v; want %q", tt.in, got, err, tt.want)
		}
	}
	if _, err := BaseHost("://bad"); err == nil {
		t.Error("BaseHost accepted an invalid URL")
	}
}

package main

import (
	"strings"
	"testing"
)

// TestCredentialModes: certificates come from files or from enrolment,
// never both; each mode names what it misses.
func TestCredentialModes(t *testing.T) {
	const fp = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	for _, tc := range []struct {
		name    string
		set     func(o *Options)
		wantErr string
	}{
		{name: "files", set: func(o *Options) { o.TLS.CertFile, o.TLS.KeyFile, o.TLS.CAFile = "c", "k", "ca" }},
		{name: "files, one missing", set: func(o *Options) { o.TLS.CertFile, o.TLS.KeyFile = "c", "k" }, wantErr: "--broker-ca is required"},
		{name: "token file", set: func(o *Options) { o.EnrolmentTokenFile, o.BrokerCAFingerprint = "token", fp }},
		{name: "token flag", set: func(o *Options) { o.EnrolmentToken, o.BrokerCAFingerprint = "nora.abc", fp }},
		{name: "nothing", set: func(o *Options) {}, wantErr: "--tls-cert is required"},
		{name: "fingerprint without token", set: func(o *Options) { o.BrokerCAFingerprint = fp }, wantErr: "--enrolment-token-file is required"},
		{name: "both modes", set: func(o *Options) {
			o.TLS.CertFile, o.TLS.KeyFile, o.TLS.CAFile = "c", "k", "ca"
			o.EnrolmentTokenFile, o.BrokerCAFingerprint = "token", fp
		}, wantErr: "exclude each other"},
		{name: "token without fingerprint", set: func(o *Options) { o.EnrolmentTokenFile = "token" }, wantErr: "--broker-ca-fingerprint is required"},
		{name: "bad fingerprint", set: func(o *Options) { o.EnrolmentTokenFile, o.BrokerCAFingerprint = "token", "sha256:abc" }, wantErr: `--broker-ca-fingerprint: certificate fingerprint "sha256:abc" is not hex`},
		{name: "token twice", set: func(o *Options) { o.EnrolmentTokenFile, o.EnrolmentToken, o.BrokerCAFingerprint = "t", "n.x", fp }, wantErr: "--enrolment-token-file and --enrolment-token"},
		{name: "bad secret", set: func(o *Options) { o.CredentialsSecret = "nonamespace" }, wantErr: "--credentials-secret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			o.BrokerAddress, o.AgentName = "broker:443", "nora"
			tc.set(o)
			err := o.Validate()
			if tc.wantErr == "" && err != nil {
				t.Fatal(err)
			}
			if tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("Validate = %v, want %q", err, tc.wantErr)
			}
		})
	}
	if d := NewOptions().CredentialsSecret; !strings.HasSuffix(d, "/ferry-edge-credentials") {
		t.Errorf("default --credentials-secret = %q", d)
	}
}

package main

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-dev/ferry/pkg/devpki"
)

// TestEnrolmentOptions: the broker refuses to start with a signing CA that
// is not a CA, whose key does not match, that is not under --client-ca, or
// with a --broker-ca that does not verify its serving certificate.
func TestEnrolmentOptions(t *testing.T) {
	pki, other := t.TempDir(), t.TempDir()
	ca, err := devpki.LoadOrCreateCA(pki, "ferry")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := devpki.LoadOrCreateCA(other, "other"); err != nil {
		t.Fatal(err)
	}
	if err := ca.IssueServer(pki, "broker", []string{"127.0.0.1"}); err != nil {
		t.Fatal(err)
	}
	if err := ca.IssueClient(pki, "edge", devpki.IdentityFor("edge")); err != nil {
		t.Fatal(err)
	}
	caCert, caKey := filepath.Join(pki, devpki.CACertFile), filepath.Join(pki, devpki.CAKeyFile)
	otherCert, otherKey := filepath.Join(other, devpki.CACertFile), filepath.Join(other, devpki.CAKeyFile)
	for _, tc := range []struct {
		name                string
		cert, key, brokerCA string
		wantErr             string
		wantOn              bool
	}{
		{name: "off"},
		{name: "signing CA under the client CA", cert: caCert, key: caKey, wantOn: true},
		{name: "explicit broker CA", cert: caCert, key: caKey, brokerCA: caCert, wantOn: true},
		{name: "not a CA", cert: devpki.CertFile(pki, "edge"), key: devpki.KeyFile(pki, "edge"), wantErr: "not a CA certificate"},
		{name: "key of another certificate", cert: caCert, key: otherKey, wantErr: "--edge-signing-cert/--edge-signing-key"},
		{name: "not under the client CA", cert: otherCert, key: otherKey, wantErr: "does not verify against the client CA bundle"},
		{name: "broker CA does not verify the serving certificate", cert: caCert, key: caKey, brokerCA: otherCert, wantErr: "--broker-ca"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := NewOptions()
			o.TLS.CertFile, o.TLS.KeyFile, o.TLS.CAFile = devpki.CertFile(pki, "broker"), devpki.KeyFile(pki, "broker"), caCert
			o.EdgeSigningCertFile, o.EdgeSigningKeyFile, o.BrokerCAFile = tc.cert, tc.key, tc.brokerCA
			signer, brokerCA, err := o.completeEnrolment()
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (signer != nil) != tc.wantOn {
				t.Fatalf("signer = %v, want on %v", signer, tc.wantOn)
			}
			if brokerCA.BundleFile == "" {
				t.Fatal("no broker CA bundle (default: --client-ca)")
			}
		})
	}
	o := NewOptions()
	o.ConfigFile, o.KCPKubeconfig = "broker.yaml", "kcp.kubeconfig"
	o.TLS.CertFile, o.TLS.KeyFile, o.TLS.CAFile = "tls.crt", "tls.key", "ca.crt"
	o.EdgeSigningCertFile = "only-the-cert.crt"
	o.EdgeCertificateLifetime = 0
	o.EnrolmentTokenTTL = 200 * 3600e9
	o.StateNamespace = "Not_A_Namespace"
	err = o.Validate()
	for _, want := range []string{"--edge-signing-cert and --edge-signing-key", "--edge-certificate-lifetime", "--enrolment-token-ttl", "--state-namespace"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v, want it to name %s", err, want)
		}
	}
}

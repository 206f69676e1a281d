package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/broker/enrolment"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// TestPrintToken: the subcommand shows the token, its expiry, the CA
// fingerprint and the exact ferry-edge flags to use.
func TestPrintToken(t *testing.T) {
	dir := t.TempDir()
	if _, err := devpki.LoadOrCreateCA(dir, "ferry"); err != nil {
		t.Fatal(err)
	}
	bundle, err := os.ReadFile(filepath.Join(dir, devpki.CACertFile))
	if err != nil {
		t.Fatal(err)
	}
	cas, err := tlsconfig.ParseCertificates(bundle)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	printToken(&out, &enrolment.Token{Value: "nora.c2VjcmV0", Expires: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
		Secret: "default/ferry-enrolment-x", Workspace: "root:org"}, cas)
	fp := tlsconfig.Fingerprint(cas[0])
	for _, want := range []string{"token:                 nora.c2VjcmV0\n", "2026-01-02T03:04:05Z", "broker CA fingerprint: " + fp,
		"--enrolment-token-file <file> --broker-ca-fingerprint " + fp, "root:org"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestCreateTokenFlags(t *testing.T) {
	err := runCreateToken([]string{"--ttl", "200h", "--state-namespace", "Bad_NS", "--output", "yaml"})
	for _, want := range []string{"--config is required", "--kcp-kubeconfig is required", "--identity is required", "--broker-ca is required", "--ttl", "--state-namespace", "--output"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v, want it to name %s", err, want)
		}
	}
}

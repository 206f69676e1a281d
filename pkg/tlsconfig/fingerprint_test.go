package tlsconfig

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"strings"
	"testing"
)

func TestFingerprint(t *testing.T) {
	cert := &x509.Certificate{Raw: []byte("certificate DER")}
	sum := sha256.Sum256(cert.Raw)
	want := "sha256:" + hex.EncodeToString(sum[:])
	if got := Fingerprint(cert); got != want {
		t.Fatalf("Fingerprint = %s, want %s", got, want)
	}
	bare := hex.EncodeToString(sum[:])
	var colons []string
	for i := 0; i < len(bare); i += 2 {
		colons = append(colons, strings.ToUpper(bare[i:i+2]))
	}
	for _, tc := range []struct {
		name, in string
		ok       bool
	}{
		{"ferry form", want, true},
		{"bare hex", bare, true},
		{"upper-case prefix and hex", "SHA256:" + strings.ToUpper(bare), true},
		{"openssl form", strings.Join(colons, ":"), true},
		{"surrounding space", " " + want + "\n", true},
		{"too short", bare[:62], false},
		{"not hex", strings.Repeat("z", 64), false},
		{"empty", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseFingerprint(tc.in)
			if tc.ok && (err != nil || got != want) {
				t.Fatalf("ParseFingerprint(%q) = %q, %v; want %q", tc.in, got, err, want)
			}
			if !tc.ok && err == nil {
				t.Fatalf("ParseFingerprint(%q) = %q, want an error", tc.in, got)
			}
		})
	}
}

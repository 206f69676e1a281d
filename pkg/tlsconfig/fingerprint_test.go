package tlsconfig

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"strings"
	"testing"
)

func TestFingerprint(t *testing.T) {
	cert := &x509.Certificate{Raw: []byte("not really DER")}
	sum := sha256.Sum256(cert.Raw)
	if got, want := Fingerprint(cert), "sha256:"+hex.EncodeToString(sum[:]); got != want {
		t.Errorf("Fingerprint = %q, want %q", got, want)
	}
}

func TestParseFingerprint(t *testing.T) {
	hexDigits := strings.Repeat("ab", 32)
	want := "sha256:" + hexDigits
	var pairs []string
	for i := 0; i < 32; i++ {
		pairs = append(pairs, "AB")
	}
	openssl := strings.Join(pairs, ":")
	tests := []struct {
		name, in, want, err string
	}{
		{name: "ferry form", in: want, want: want},
		{name: "bare hex", in: hexDigits, want: want},
		{name: "uppercase prefix and hex", in: "SHA256:" + strings.ToUpper(hexDigits), want: want},
		{name: "openssl pairs", in: openssl, want: want},
		{name: "openssl output line", in: "SHA256 Fingerprint=" + openssl, want: want},
		{name: "surrounding space", in: "  " + want + "\n", want: want},
		{name: "empty", in: "", err: "empty certificate fingerprint"},
		{name: "only prefix", in: "sha256:", err: "empty certificate fingerprint"},
		{name: "not hex", in: "sha256:" + strings.Repeat("zz", 32), err: "is not hex"},
		{name: "too short", in: "abcd", err: "has 2 bytes"},
		{name: "sha1 length", in: strings.Repeat("ab", 20), err: "has 20 bytes"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseFingerprint(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ParseFingerprint(%q) = %q, %v; want error containing %q", tc.in, got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ParseFingerprint(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}
}

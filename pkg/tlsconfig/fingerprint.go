package tlsconfig

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"strings"
)

// fingerprintPrefix starts every fingerprint ferry writes.
const fingerprintPrefix = "sha256:"

// Fingerprint is the SHA-256 of the certificate's DER encoding, written
// "sha256:" and 64 lowercase hex digits: the one form ferry logs, stores
// and compares.
func Fingerprint(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.Raw)
	return fingerprintPrefix + hex.EncodeToString(sum[:])
}

// ParseFingerprint accepts a SHA-256 certificate fingerprint as ferry writes
// it ("sha256:<hex>"), as bare hex, or as openssl prints it (colon-separated
// uppercase pairs, optionally after "SHA256 Fingerprint="), and returns it in
// Fingerprint's form.
func ParseFingerprint(s string) (string, error) {
	in := strings.TrimSpace(s)
	if i := strings.LastIndex(in, "="); i >= 0 && strings.HasPrefix(strings.ToLower(in), "sha256 fingerprint=") {
		in = in[i+1:]
	}
	if len(in) >= len(fingerprintPrefix) && strings.EqualFold(in[:len(fingerprintPrefix)], fingerprintPrefix) {
		in = in[len(fingerprintPrefix):]
	}
	hexDigits := strings.ToLower(strings.ReplaceAll(in, ":", ""))
	b, err := hex.DecodeString(hexDigits)
	switch {
	case in == "":
		return "", fmt.Errorf("empty certificate fingerprint (want sha256:<64 hex digits>)")
	case err != nil:
		return "", fmt.Errorf("certificate fingerprint %q is not hex (want sha256:<64 hex digits>, bare hex or AB:CD:... pairs)", s)
	case len(b) != sha256.Size:
		return "", fmt.Errorf("certificate fingerprint %q has %d bytes, a SHA-256 fingerprint has %d", s, len(b), sha256.Size)
	}
	return fingerprintPrefix + hexDigits, nil
}

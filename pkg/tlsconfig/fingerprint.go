package tlsconfig

import (
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"strings"
)

// fingerprintPrefix marks the hash function of a written fingerprint.
const fingerprintPrefix = "sha256:"

// Fingerprint is the SHA-256 of the certificate's DER, written
// "sha256:<64 lowercase hex digits>": the one form ferry prints and stores.
func Fingerprint(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.Raw)
	return fingerprintPrefix + hex.EncodeToString(sum[:])
}

// ParseFingerprint accepts a SHA-256 fingerprint as ferry writes it, as bare
// hex, or in openssl's colon-separated uppercase form ("AB:CD:…"), and
// returns it as Fingerprint writes it.
func ParseFingerprint(s string) (string, error) {
	h := strings.TrimSpace(s)
	if len(h) >= len(fingerprintPrefix) && strings.EqualFold(h[:len(fingerprintPrefix)], fingerprintPrefix) {
		h = h[len(fingerprintPrefix):]
	}
	h = strings.ToLower(strings.ReplaceAll(h, ":", ""))
	b, err := hex.DecodeString(h)
	if err != nil || len(b) != sha256.Size {
		return "", fmt.Errorf("fingerprint %q is not a SHA-256 fingerprint (want sha256: and 64 hex digits, or openssl's AB:CD:… form)", s)
	}
	return fingerprintPrefix + h, nil
}

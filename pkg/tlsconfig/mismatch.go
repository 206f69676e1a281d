package tlsconfig

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"slices"

	"google.golang.org/grpc/credentials"
)

// Mismatch tells why a client's hello cannot meet the profile, or "" when
// it can. It names both sides' settings and the flag to compare, so the
// broker's log answers "why does this edge not connect" without a packet
// capture. Crypto/tls refuses such a hello anyway (with the alert the
// edge then reports); this only explains it.
func (p Profile) Mismatch(hello *tls.ClientHelloInfo) string {
	peer := "edge"
	if hello.Conn != nil {
		peer = "edge at " + hello.Conn.RemoteAddr().String()
	}
	var common []uint16
	for _, v := range hello.SupportedVersions {
		// Only versions Go speaks: not GREASE values (RFC 8701), which
		// some clients list and would otherwise look above the minimum.
		if v <= tls.VersionTLS13 && p.allows(v) {
			common = append(common, v)
		}
	}
	if len(common) == 0 {
		return fmt.Sprintf("%s offers %s; this broker requires %s (--%s)",
			peer, offeredVersions(hello.SupportedVersions), p.versionRange(), FlagMinVersion)
	}
	// TLS 1.3 is chosen whenever both sides speak it, and its suites are
	// fixed; the suites matter only when TLS 1.2 is the best in common.
	if slices.Max(common) != tls.VersionTLS12 {
		return ""
	}
	for _, id := range hello.CipherSuites {
		if slices.Contains(p.suites(), id) {
			return ""
		}
	}
	var offered []uint16
	for _, id := range hello.CipherSuites {
		if !isTLS13Suite(id) && !isGREASE(id) {
			offered = append(offered, id)
		}
	}
	return fmt.Sprintf("no common cipher suite for TLS 1.2: %s offers %v, broker allows %v (--%s)",
		peer, suiteNames(offered), suiteNames(p.suites()), FlagCipherSuites)
}

func (p Profile) versionRange() string {
	switch {
	case p.maxVersion == p.minVersion():
		return "TLS " + versionNumber(p.minVersion()) + " only"
	case p.maxVersion != 0:
		return "TLS " + versionNumber(p.minVersion()) + " to " + versionNumber(p.maxVersion)
	}
	return "TLS " + versionNumber(p.minVersion()) + " or later"
}

func offeredVersions(vs []uint16) string {
	var known []uint16
	for _, v := range vs {
		if v >= tls.VersionTLS10 && v <= tls.VersionTLS13 {
			known = append(known, v)
		}
	}
	switch len(known) {
	case 0:
		return "no TLS version this broker knows"
	case 1:
		return "TLS " + versionNumber(known[0]) + " only"
	}
	return "TLS " + versionNumber(slices.Min(known)) + " to " + versionNumber(slices.Max(known))
}

func isTLS13Suite(id uint16) bool { return id >= 0x1301 && id <= 0x1305 }

// isGREASE: RFC 8701 reserved values clients send to keep servers tolerant.
func isGREASE(id uint16) bool { return id&0x0f0f == 0x0a0a && id>>8 == id&0xff }

// HandshakeError is the edge's failed TLS handshake with the broker,
// carrying the edge's own profile so that its log can be compared with
// the broker's flags.
type HandshakeError struct {
	// Address is the broker dialled.
	Address string
	// Profile is the edge's.
	Profile Profile
	// Err is crypto/tls's error.
	Err error
}

func (e *HandshakeError) Error() string {
	msg := fmt.Sprintf("TLS handshake with the broker at %s failed: %v", e.Address, e.Err)
	if profileMayDiffer(e.Err) {
		msg += fmt.Sprintf("; this edge allows %s: compare with the broker's --%s and --%s (its log names the mismatch)",
			e.Profile, FlagMinVersion, FlagCipherSuites)
	}
	return msg
}

func (e *HandshakeError) Unwrap() error { return e.Err }

// profileMayDiffer tells whether a handshake error can come from differing
// profiles: not when the dial ran out of time, nor when the broker's
// certificate was the problem.
func profileMayDiffer(err error) bool {
	var netErr net.Error
	var verifyErr *tls.CertificateVerificationError
	var unknownAuthority x509.UnknownAuthorityError
	var hostname x509.HostnameError
	switch {
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &netErr) && netErr.Timeout(),
		errors.As(err, &verifyErr), errors.As(err, &unknownAuthority), errors.As(err, &hostname):
		return false
	}
	return true
}

// profiledCredentials wraps gRPC's TLS credentials so that a failed
// handshake is a HandshakeError: the edge's log then says what the edge
// allowed, whatever text gRPC puts around it.
type profiledCredentials struct {
	credentials.TransportCredentials
	profile Profile
}

func (c profiledCredentials) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	tlsConn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, conn)
	if err != nil {
		return nil, nil, &HandshakeError{Address: authority, Profile: c.profile, Err: err}
	}
	return tlsConn, info, nil
}

func (c profiledCredentials) Clone() credentials.TransportCredentials {
	return profiledCredentials{TransportCredentials: c.TransportCredentials.Clone(), profile: c.profile}
}

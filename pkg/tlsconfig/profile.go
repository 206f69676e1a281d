package tlsconfig

import (
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/pflag"
)

// Profile is the TLS protocol profile both sides apply: the lowest TLS
// version they accept and, for TLS 1.2, the cipher suites. The zero value
// is the default: TLS 1.3 only. TLS 1.3's cipher suites are fixed by Go
// (all three are strong), so CipherSuites only matters when MinVersion is
// TLS 1.2; Validate rejects suites together with TLS 1.3.
type Profile struct {
	// MinVersion is tls.VersionTLS12 or tls.VersionTLS13; 0 means 1.3.
	MinVersion uint16
	// CipherSuites are the TLS 1.2 suites allowed, by ID; empty allows
	// every suite Go considers secure for TLS 1.2 (SecureTLS12Suites).
	CipherSuites []uint16

	// maxVersion caps the version offered; 0 is Go's highest. No flag sets
	// it: it lets the tests play an old peer that speaks TLS 1.2 only.
	maxVersion uint16
}

// Flag names; refusals point at them.
const (
	FlagMinVersion   = "tls-min-version"
	FlagCipherSuites = "tls-cipher-suites"
)

// AddFlags registers --tls-min-version and --tls-cipher-suites on fs; both
// binaries use it, so their flags mean the same. Values are checked as
// they are parsed; Validate checks how they combine.
func (p *Profile) AddFlags(fs *pflag.FlagSet, peer string) {
	fs.Var((*versionFlag)(&p.MinVersion), FlagMinVersion,
		fmt.Sprintf("Lowest TLS version accepted on the connection with the %s: 1.2 or 1.3 (default 1.3).", peer))
	fs.Var((*suitesFlag)(&p.CipherSuites), FlagCipherSuites,
		fmt.Sprintf("Comma-separated TLS 1.2 cipher suites (Go/IANA names) allowed with the %s; only with --%s 1.2 (TLS 1.3's suites are fixed). Default: every secure TLS 1.2 suite: %s.",
			peer, FlagMinVersion, strings.Join(suiteNames(SecureTLS12Suites()), ", ")))
}

// Validate reports a profile whose parts do not fit together.
func (p Profile) Validate() error {
	var errs []error
	if v := p.MinVersion; v != 0 && v != tls.VersionTLS12 && v != tls.VersionTLS13 {
		errs = append(errs, fmt.Errorf("--%s: %s is not supported; use 1.2 or 1.3", FlagMinVersion, tls.VersionName(v)))
	}
	if len(p.CipherSuites) > 0 && p.minVersion() == tls.VersionTLS13 {
		// Refused rather than ignored: an operator who lists suites expects
		// them to take effect, and with TLS 1.3 only they cannot.
		errs = append(errs, fmt.Errorf("--%s applies to TLS 1.2 only (Go fixes the TLS 1.3 suites); set --%s 1.2 or drop --%s",
			FlagCipherSuites, FlagMinVersion, FlagCipherSuites))
	}
	for _, id := range p.CipherSuites {
		if !slices.Contains(SecureTLS12Suites(), id) {
			errs = append(errs, fmt.Errorf("--%s: %s is not a secure TLS 1.2 suite", FlagCipherSuites, tls.CipherSuiteName(id)))
		}
	}
	return errors.Join(errs...)
}

// String describes the profile for logs and errors, e.g. "TLS 1.3 or
// later" or "TLS 1.2 or later, TLS 1.2 cipher suites [A B]".
func (p Profile) String() string {
	s := p.versionRange()
	if p.allows(tls.VersionTLS12) {
		s += fmt.Sprintf(", TLS 1.2 cipher suites %v", suiteNames(p.suites()))
	}
	return s
}

// Apply sets the profile's versions and suites on c.
func (p Profile) Apply(c *tls.Config) {
	c.MinVersion = p.minVersion()
	c.MaxVersion = p.maxVersion
	c.CipherSuites = nil
	if p.allows(tls.VersionTLS12) {
		c.CipherSuites = p.suites()
	}
}

func (p Profile) minVersion() uint16 {
	if p.MinVersion == 0 {
		return tls.VersionTLS13
	}
	return p.MinVersion
}

// allows tells whether the profile accepts version v.
func (p Profile) allows(v uint16) bool {
	return v >= p.minVersion() && (p.maxVersion == 0 || v <= p.maxVersion)
}

// suites are the TLS 1.2 suites the profile allows, listed explicitly even
// by default so that a refusal can name them.
func (p Profile) suites() []uint16 {
	if len(p.CipherSuites) > 0 {
		return p.CipherSuites
	}
	return SecureTLS12Suites()
}

// SecureTLS12Suites are the suites Go considers secure that TLS 1.2 can
// negotiate (all with forward secrecy), in Go's order.
func SecureTLS12Suites() []uint16 {
	var ids []uint16
	for _, s := range tls.CipherSuites() {
		if slices.Contains(s.SupportedVersions, tls.VersionTLS12) {
			ids = append(ids, s.ID)
		}
	}
	return ids
}

func suiteNames(ids []uint16) []string {
	names := make([]string, len(ids))
	for i, id := range ids {
		names[i] = tls.CipherSuiteName(id)
	}
	return names
}

// versionNumber is "1.2" for tls.VersionTLS12: the form the flag takes.
func versionNumber(v uint16) string {
	return strings.TrimPrefix(tls.VersionName(v), "TLS ")
}

// versionFlag is --tls-min-version.
type versionFlag uint16

func (f *versionFlag) String() string {
	if *f == 0 {
		return ""
	}
	return versionNumber(uint16(*f))
}

func (f *versionFlag) Set(s string) error {
	switch strings.TrimPrefix(strings.ToUpper(strings.TrimSpace(s)), "TLS") {
	case "1.2":
		*f = tls.VersionTLS12
	case "1.3":
		*f = tls.VersionTLS13
	default:
		return fmt.Errorf("%q is not a supported TLS version; use 1.2 or 1.3", s)
	}
	return nil
}

func (f *versionFlag) Type() string { return "version" }

// suitesFlag is --tls-cipher-suites: names are resolved as they are parsed,
// so an unknown or insecure name fails with the list of valid ones.
type suitesFlag []uint16

func (f *suitesFlag) String() string { return strings.Join(suiteNames(*f), ",") }

func (f *suitesFlag) Set(s string) error {
	ids, err := ParseCipherSuites(s)
	if err != nil {
		return err
	}
	*f = ids
	return nil
}

func (f *suitesFlag) Type() string { return "names" }

// ParseCipherSuites reads comma-separated TLS 1.2 cipher suite names. An
// insecure suite, a TLS 1.3 suite or an unknown name is refused with the
// list of names that are valid.
func ParseCipherSuites(s string) ([]uint16, error) {
	valid := SecureTLS12Suites()
	byName := map[string]uint16{}
	for _, id := range valid {
		byName[tls.CipherSuiteName(id)] = id
	}
	var ids []uint16
	var bad []string
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		if name == "" {
			continue
		}
		if id, ok := byName[name]; ok {
			if !slices.Contains(ids, id) {
				ids = append(ids, id)
			}
			continue
		}
		bad = append(bad, name+" "+whyNotValid(name))
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("%s (valid: %s)", strings.Join(bad, "; "), strings.Join(suiteNames(valid), ", "))
	}
	if len(ids) == 0 {
		return nil, errors.New("no cipher suite named")
	}
	return ids, nil
}

func whyNotValid(name string) string {
	for _, s := range tls.InsecureCipherSuites() {
		if s.Name == name {
			return "is insecure"
		}
	}
	for _, s := range tls.CipherSuites() {
		if s.Name == name {
			return "is a TLS 1.3 suite (not configurable)"
		}
	}
	return "is not a known cipher suite"
}

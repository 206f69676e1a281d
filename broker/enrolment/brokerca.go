package enrolment

import (
	"crypto/x509"
	"fmt"
	"os"

	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// BrokerCAFiles name the bundle enrolled edges verify the broker with
// (--broker-ca) and the broker's serving certificate (--tls-cert). Both are
// read again on every Load, so a rotated bundle reaches edges at their next
// renewal without a restart.
type BrokerCAFiles struct {
	BundleFile      string
	ServingCertFile string
}

// BrokerCA is the broker CA bundle as handed to edges.
type BrokerCA struct {
	// BundlePEM is the bundle file's content.
	BundlePEM []byte
	// Fingerprint is the tlsconfig.Fingerprint of the bundle's certificate
	// at the end of the serving certificate's chain: the one an operator
	// pins with ferry-edge --broker-ca-fingerprint.
	Fingerprint string
}

// Load reads the bundle and checks that it verifies the serving
// certificate, so an edge that trusts it can reach this broker.
func (f BrokerCAFiles) Load() (*BrokerCA, error) {
	bundle, err := os.ReadFile(f.BundleFile)
	if err != nil {
		return nil, fmt.Errorf("broker CA bundle: %w", err)
	}
	certs, err := tlsconfig.ParseCertificates(bundle)
	if err != nil {
		return nil, fmt.Errorf("broker CA bundle %s: %w", f.BundleFile, err)
	}
	servingPEM, err := os.ReadFile(f.ServingCertFile)
	if err != nil {
		return nil, fmt.Errorf("serving certificate: %w", err)
	}
	serving, err := tlsconfig.ParseCertificates(servingPEM)
	if err != nil {
		return nil, fmt.Errorf("serving certificate %s: %w", f.ServingCertFile, err)
	}
	roots, inters := x509.NewCertPool(), x509.NewCertPool()
	for _, c := range certs {
		roots.AddCert(c)
	}
	for _, c := range serving[1:] {
		inters.AddCert(c)
	}
	chains, err := serving[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inters, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
	if err != nil {
		return nil, fmt.Errorf("the broker's serving certificate %s does not verify against the broker CA bundle %s, so enrolled edges could not connect: %w", f.ServingCertFile, f.BundleFile, err)
	}
	chain := chains[0]
	return &BrokerCA{BundlePEM: bundle, Fingerprint: tlsconfig.Fingerprint(chain[len(chain)-1])}, nil
}

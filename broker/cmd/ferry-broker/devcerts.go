package main

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/spf13/pflag"

	"github.com/ferry-dev/ferry/pkg/devpki"
)

// runDevCerts makes (or extends) a development PKI: the CA is created once
// and reused, so clients added later are trusted by a running broker.
func runDevCerts(args []string) error {
	fs := pflag.NewFlagSet("ferry-broker dev-certs", pflag.ContinueOnError)
	dir := fs.String("dir", "", "Directory for the PKI files (created if missing). Required.")
	hosts := fs.StringSlice("host", []string{"localhost", "127.0.0.1", "::1"}, "DNS names and IPs of the broker's server certificate.")
	clients := fs.StringSlice("client", []string{"edge", "admin"}, "Client certificates to issue; NAME gets identity "+devpki.IdentityFor("NAME")+".")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	if *dir == "" {
		return errors.New("--dir is required")
	}
	ca, err := devpki.LoadOrCreateCA(*dir, "ferry development CA")
	if err != nil {
		return err
	}
	if err := ca.IssueServer(*dir, "broker", *hosts); err != nil {
		return err
	}
	fmt.Printf("CA:     %s\nbroker: %s (hosts %v)\n", filepath.Join(*dir, devpki.CACertFile), devpki.CertFile(*dir, "broker"), *hosts)
	for _, c := range *clients {
		if err := ca.IssueClient(*dir, c, devpki.IdentityFor(c)); err != nil {
			return err
		}
		fmt.Printf("client: %s identity %s\n", devpki.CertFile(*dir, c), devpki.IdentityFor(c))
	}
	return nil
}

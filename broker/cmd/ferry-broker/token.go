package main

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"

	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/enrolment"
	"github.com/ferry-dev/ferry/broker/kcp"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// tokenUsage documents `ferry-broker enrolment-token create`.
const tokenUsage = `Usage: ferry-broker enrolment-token create --config FILE --kcp-kubeconfig FILE --identity ID --broker-ca FILE [--ttl DURATION] [--state-namespace NS]

Issues a one-time enrolment token for a configured edge identity, the way
AdminService.CreateEnrolmentToken does: the token's SHA-256 is stored as a
Secret (type ferry.dev/enrolment-token) in the --state-namespace of the
workspace of the identity's APIExport, written with the broker's kcp
credentials; the token itself is printed once and kept nowhere. An edge
started with it and the printed fingerprint enrols itself (its key never
leaves its cluster). The broker must run with --edge-signing-cert.
`

// runCreateToken implements `ferry-broker enrolment-token create`.
func runCreateToken(args []string) error {
	fs := pflag.NewFlagSet("ferry-broker enrolment-token create", pflag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, tokenUsage); fs.PrintDefaults() }
	configFile := fs.String("config", "", "The broker's configuration (YAML); the identity must be one of its edges.")
	kubeconfig := fs.String("kcp-kubeconfig", "", "Kubeconfig with the broker's kcp credentials.")
	identity := fs.String("identity", "", "The edge identity the certificate will name.")
	ttl := fs.Duration("ttl", enrolment.DefaultTokenTTL, "How long the token may be used (at most 168h).")
	namespace := fs.String("state-namespace", metav1.NamespaceDefault, "The broker's --state-namespace.")
	brokerCA := fs.String("broker-ca", "", "The broker's --broker-ca bundle (or its --client-ca when it has none): its fingerprint is printed for the edge.")
	output := fs.String("output", "text", `"text": token, expiry, fingerprint and the ferry-edge flags; "token": the token alone.`)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	var errs []error
	for flag, v := range map[string]string{"config": *configFile, "kcp-kubeconfig": *kubeconfig, "identity": *identity, "broker-ca": *brokerCA} {
		if v == "" {
			errs = append(errs, fmt.Errorf("--%s is required", flag))
		}
	}
	if _, err := enrolment.ValidateTTL(*ttl); err != nil || *ttl == 0 {
		errs = append(errs, fmt.Errorf("--ttl must be positive and at most %s", enrolment.MaxTokenTTL))
	}
	if msgs := validation.IsDNS1123Label(*namespace); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--state-namespace %q is not a namespace name", *namespace))
	}
	if *output != "text" && *output != "token" {
		errs = append(errs, fmt.Errorf("--output %q: want text or token", *output))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	cfg, err := config.Load(*configFile)
	if err != nil {
		return err
	}
	bundle, err := os.ReadFile(*brokerCA)
	if err != nil {
		return fmt.Errorf("--broker-ca: %w", err)
	}
	cas, err := tlsconfig.ParseCertificates(bundle)
	if err != nil {
		return fmt.Errorf("--broker-ca %s: %w", *brokerCA, err)
	}
	kcpCfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("--kcp-kubeconfig %s: %w", *kubeconfig, err)
	}
	clients, err := kcp.NewSecretsClients(kcpCfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	tok, err := enrolment.NewTokenStore(clients, *namespace, cfg, clock.RealClock{}).Create(ctx, *identity, *ttl)
	if err != nil {
		return err
	}
	if *output == "token" {
		fmt.Println(tok.Value)
		return nil
	}
	printToken(os.Stdout, tok, cas)
	return nil
}

// printToken shows the token and how to use it.
func printToken(w io.Writer, tok *enrolment.Token, cas []*x509.Certificate) {
	fingerprint := tlsconfig.Fingerprint(cas[0])
	fmt.Fprintf(w, "token:                 %s\n", tok.Value)
	fmt.Fprintf(w, "expires:               %s (single use)\n", tok.Expires.UTC().Format(time.RFC3339))
	fmt.Fprintf(w, "broker CA fingerprint: %s (%s)\n", fingerprint, cas[0].Subject)
	for _, c := range cas[1:] {
		fmt.Fprintf(w, "                       %s (%s, also in the bundle; either may be pinned)\n", tlsconfig.Fingerprint(c), c.Subject)
	}
	fmt.Fprintf(w, "stored as:             Secret %s in workspace %s\n\n", tok.Secret, tok.Workspace)
	fmt.Fprintf(w, "Put the token in a file (a Secret in the service cluster) and start the edge with:\n")
	fmt.Fprintf(w, "  ferry-edge --broker-address <host:port> --enrolment-token-file <file> --broker-ca-fingerprint %s\n", fingerprint)
}

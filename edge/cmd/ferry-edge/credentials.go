package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"k8s.io/client-go/kubernetes"

	"github.com/ferry-dev/ferry/edge/enrol"
	"github.com/ferry-dev/ferry/pkg/backoff"
	"github.com/ferry-dev/ferry/pkg/logging"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// setupCredentials provides the edge's client credentials when they do not
// come from files: those stored in the credentials Secret when usable
// (never enrolling again: the token is single use), else obtained with the
// enrolment token and stored there. It also starts renewals.
func (p *edgeProcess) setupCredentials(ctx context.Context) error {
	opts := p.cfg.Options
	if opts.fileMode() {
		return nil
	}
	namespace, name, err := enrol.ParseSecretRef(opts.CredentialsSecret)
	if err != nil {
		return fmt.Errorf("--credentials-secret: %w", err)
	}
	kube, err := kubernetes.NewForConfig(p.cfg.Service)
	if err != nil {
		return fmt.Errorf("cannot create a client for the service cluster: %w", err)
	}
	store := &enrol.SecretStore{Client: kube.CoreV1(), Namespace: namespace, Name: name}
	p.credentials = store
	creds, err := store.Load(ctx, time.Now())
	var installed time.Time
	switch {
	case err == nil:
		p.log.Info("using the credentials stored in the Secret", "secret", store.String(), logging.KeyIdentity, identityOf(creds),
			"notAfter", creds.Certificate.Leaf.NotAfter)
	default:
		token, terr := enrolmentToken(opts)
		if terr != nil {
			return terr
		}
		if token == "" {
			return fmt.Errorf("no usable credentials (%w) and an empty enrolment token: create one with ferry-broker enrolment-token create", err)
		}
		if !errors.Is(err, enrol.ErrNoCredentials) {
			p.log.Info("the stored credentials are unusable; enrolling with the token", logging.KeyReason, err.Error())
		}
		p.log.Info("enrolling with the broker", "broker", opts.BrokerAddress, "secret", store.String())
		if creds, err = p.enrolRetrying(ctx, token); err != nil {
			return fmt.Errorf("enrolment failed: %w", err)
		}
		if err := store.Save(ctx, creds); err != nil {
			return fmt.Errorf("enrolled, but %w (the token is used up: create a new one after fixing this)", err)
		}
		installed = time.Now()
		p.log.Info("enrolled; credentials stored", "secret", store.String(), logging.KeyIdentity, identityOf(creds),
			"fingerprint", tlsconfig.Fingerprint(creds.Certificate.Leaf), "notAfter", creds.Certificate.Leaf.NotAfter)
	}
	p.cfg.TLS = tlsconfig.NewMemoryClient(creds, opts.BrokerServerName, opts.TLSProfile)
	p.tls.Store(p.cfg.TLS)
	p.renewer = enrol.NewRenewer(enrol.RenewerOptions{
		TLS: p.cfg.TLS, Store: store, Installed: installed, Metrics: p.metrics, Log: p.log.WithName("renewal"),
	})
	return nil
}

// enrolRetrying enrols; a broker that cannot be reached (or answers
// "unavailable") is tried again with the reconnect backoff, a refusal ends
// the attempts.
func (p *edgeProcess) enrolRetrying(ctx context.Context, token string) (*tlsconfig.Credentials, error) {
	opts := p.cfg.Options
	b := &backoff.Exponential{Initial: opts.BackoffInitial, Max: max(opts.BackoffMax, opts.BackoffInitial)}
	for attempt := 1; ; attempt++ {
		creds, err := enrol.Enrol(ctx, enrol.Options{
			BrokerAddress: opts.BrokerAddress, ServerName: opts.BrokerServerName,
			Token: token, Fingerprint: opts.BrokerCAFingerprint, Dial: p.cfg.Dialer.Dial, Profile: opts.TLSProfile,
		})
		var perm *enrol.PermanentError
		if err == nil || errors.As(err, &perm) || ctx.Err() != nil {
			return creds, err
		}
		delay := b.Next()
		p.log.Info("cannot enrol yet; retrying", logging.KeyReason, err.Error(), logging.KeyAttempt, attempt, logging.KeyDelay, delay.String())
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(delay):
		}
	}
}

// refreshCredentials picks up credentials another replica renewed while
// this one stood by: the Secret's certificate replaces the one in memory
// when it expires later.
func (p *edgeProcess) refreshCredentials(ctx context.Context) {
	if p.credentials == nil {
		return
	}
	stored, err := p.credentials.Load(ctx, time.Now())
	if err != nil {
		p.log.Info("cannot re-read the credentials Secret; keeping the certificate in memory", logging.KeyReason, err.Error())
		return
	}
	cur := p.cfg.TLS.Credentials()
	if stored.Certificate.Leaf.NotAfter.After(cur.Certificate.Leaf.NotAfter) {
		_ = p.cfg.TLS.SetCredentials(stored)
		p.log.Info("took the newer certificate from the credentials Secret", "notAfter", stored.Certificate.Leaf.NotAfter)
	}
}

// enrolmentToken reads the token from its flag or file.
func enrolmentToken(o *Options) (string, error) {
	if o.EnrolmentToken != "" {
		return o.EnrolmentToken, nil
	}
	if o.EnrolmentTokenFile == "" {
		return "", nil
	}
	b, err := os.ReadFile(o.EnrolmentTokenFile)
	if err != nil {
		return "", fmt.Errorf("no usable credentials stored, and --enrolment-token-file: %w", err)
	}
	return strings.TrimSpace(string(b)), nil
}

func identityOf(c *tlsconfig.Credentials) string {
	id, _ := tlsconfig.Identity(c.Certificate.Leaf)
	return id
}

// clientCertificateExpiry is the in-memory certificate's expiry (metrics).
func (p *edgeProcess) clientCertificateExpiry() (time.Time, error) {
	tls := p.tls.Load()
	if tls == nil {
		return time.Time{}, errors.New("no client certificate yet (enrolling)")
	}
	leaf, err := tls.Leaf()
	if err != nil {
		return time.Time{}, err
	}
	return leaf.NotAfter, nil
}

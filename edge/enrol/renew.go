package enrol

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// Renewal results (metric label values).
const (
	ResultRenewed = "renewed"
	ResultRefused = "refused"
	ResultFailed  = "failed"
)

// CredentialStore persists renewed credentials (SecretStore).
type CredentialStore interface {
	Save(ctx context.Context, creds *tlsconfig.Credentials) error
}

// RenewalMetrics counts renewals by result; *metrics.Edge implements it.
type RenewalMetrics interface {
	CertificateRenewal(result string)
}

// RenewerOptions configure a Renewer. TLS and Store are required.
type RenewerOptions struct {
	// TLS holds the in-memory credentials the renewals replace.
	TLS *tlsconfig.ClientConfig
	// Store keeps the credentials across restarts.
	Store CredentialStore
	// Installed is when the current certificate was obtained, when known
	// (just enrolled); zero schedules from the certificate's NotBefore.
	Installed time.Time
	// Clock drives the timers; nil is the real clock.
	Clock clock.Clock
	// RetryInitial and RetryMax bound the backoff after a failed renewal;
	// zero: 5 s and 5 min.
	RetryInitial, RetryMax time.Duration
	// AnswerTimeout bounds the wait for the broker's answer; zero: 1 min.
	AnswerTimeout time.Duration
	// Metrics counts renewals; nil counts none.
	Metrics RenewalMetrics
	// Log receives the renewer's logs.
	Log logr.Logger
}

// Renewer renews the edge's client certificate over the stream: once two
// thirds of its lifetime have passed it sends a CertificateRenewal with a
// CSR of a new key; on the broker's IssuedCertificate it stores and
// installs the new credentials, and the stream ends so the edge reconnects
// with them at once. Failures are retried with a capped backoff while the
// current certificate still works. Safe for concurrent use; Run runs on one
// stream at a time.
type Renewer struct {
	o       RenewerOptions
	answers chan *ferryv1.IssuedCertificate

	mu        sync.Mutex
	installed time.Time
	failures  int
	retryAt   time.Time
	lastErr   error
}

// NewRenewer returns a renewer for the credentials in o.TLS.
func NewRenewer(o RenewerOptions) *Renewer {
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
	if o.RetryInitial <= 0 {
		o.RetryInitial = 5 * time.Second
	}
	if o.RetryMax < o.RetryInitial {
		o.RetryMax = max(5*time.Minute, o.RetryInitial)
	}
	if o.AnswerTimeout <= 0 {
		o.AnswerTimeout = time.Minute
	}
	return &Renewer{o: o, answers: make(chan *ferryv1.IssuedCertificate, 1), installed: o.Installed}
}

// Err is why the last renewal failed, nil after a success (readiness).
func (r *Renewer) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastErr
}

// Due is when the next renewal is sent: two thirds into the current
// certificate's lifetime, counted from when it was obtained (the broker
// backdates NotBefore by a few minutes, which would make short
// certificates due at once); later while a failure's backoff runs.
func (r *Renewer) Due() time.Time {
	leaf := r.o.TLS.Credentials().Certificate.Leaf
	r.mu.Lock()
	defer r.mu.Unlock()
	start := leaf.NotBefore
	if r.installed.After(start) {
		start = r.installed
	}
	due := start.Add(leaf.NotAfter.Sub(start) * 2 / 3)
	if r.failures > 0 && r.retryAt.After(due) {
		due = r.retryAt
	}
	return due
}

// Deliver hands the broker's answer to the running renewal; it never
// blocks (an answer nobody waits for is dropped).
func (r *Renewer) Deliver(ic *ferryv1.IssuedCertificate) {
	select {
	case r.answers <- ic:
	default:
		r.o.Log.Info("dropped an IssuedCertificate no renewal waits for")
	}
}

// Run renews on one stream until ctx ends (false) or a new certificate is
// installed (true: end the stream and reconnect now). send queues a message
// on the stream's control lane.
func (r *Renewer) Run(ctx context.Context, send func(*ferryv1.ConnectRequest) error) bool {
	for {
		wait := r.Due().Sub(r.o.Clock.Now())
		if wait > 0 {
			t := r.o.Clock.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return false
			case <-t.C():
			}
		}
		if r.attempt(ctx, send) {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
	}
}

// attempt sends one renewal and handles its answer.
func (r *Renewer) attempt(ctx context.Context, send func(*ferryv1.ConnectRequest) error) bool {
	for len(r.answers) > 0 { // a late answer of an abandoned attempt
		<-r.answers
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		r.fail(ResultFailed, fmt.Errorf("cannot generate a key: %w", err))
		return false
	}
	csr, err := NewCSR(key)
	if err != nil {
		r.fail(ResultFailed, err)
		return false
	}
	old := r.o.TLS.Credentials().Certificate.Leaf
	r.o.Log.Info("renewing the client certificate", "notAfter", old.NotAfter)
	msg := &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_CertificateRenewal{CertificateRenewal: &ferryv1.CertificateRenewal{CertificateSigningRequestDer: csr}}}
	if err := send(msg); err != nil {
		r.fail(ResultFailed, fmt.Errorf("cannot send the renewal: %w", err))
		return false
	}
	timeout := r.o.Clock.NewTimer(r.o.AnswerTimeout)
	defer timeout.Stop()
	var ic *ferryv1.IssuedCertificate
	select {
	case <-ctx.Done():
		return false // the stream ended; the next one asks again
	case <-timeout.C():
		r.fail(ResultFailed, fmt.Errorf("no answer to the certificate renewal within %s", r.o.AnswerTimeout))
		return false
	case ic = <-r.answers:
	}
	if ic.GetErrorMessage() != "" {
		r.fail(ResultRefused, fmt.Errorf("the broker refused the certificate renewal: %s", ic.GetErrorMessage()))
		return false
	}
	creds, err := Credentials(key, ic.GetCertificateChainPem(), ic.GetBrokerCaBundlePem(), r.o.Clock.Now())
	if err != nil {
		r.fail(ResultFailed, fmt.Errorf("the renewed certificate is unusable: %w", err))
		return false
	}
	oldID, _ := tlsconfig.Identity(old)
	if newID, _ := tlsconfig.Identity(creds.Certificate.Leaf); newID != oldID {
		r.fail(ResultFailed, fmt.Errorf("the renewed certificate names %q, not this edge's %q", newID, oldID))
		return false
	}
	// Stored first: an edge restarted after the switch must find the
	// certificate it uses.
	if err := r.o.Store.Save(ctx, creds); err != nil {
		r.fail(ResultFailed, err)
		return false
	}
	if err := r.o.TLS.SetCredentials(creds); err != nil {
		r.fail(ResultFailed, err)
		return false
	}
	r.mu.Lock()
	r.installed, r.failures, r.retryAt, r.lastErr = r.o.Clock.Now(), 0, time.Time{}, nil
	r.mu.Unlock()
	if r.o.Metrics != nil {
		r.o.Metrics.CertificateRenewal(ResultRenewed)
	}
	r.o.Log.Info("client certificate renewed; reconnecting with it", "fingerprint", tlsconfig.Fingerprint(creds.Certificate.Leaf), "notAfter", creds.Certificate.Leaf.NotAfter)
	return true
}

// fail records a failed attempt and schedules the retry.
func (r *Renewer) fail(result string, err error) {
	r.mu.Lock()
	r.failures++
	delay := r.o.RetryInitial << min(r.failures-1, 20)
	if delay > r.o.RetryMax || delay <= 0 {
		delay = r.o.RetryMax
	}
	r.retryAt = r.o.Clock.Now().Add(delay)
	r.lastErr = err
	failures := r.failures
	r.mu.Unlock()
	if r.o.Metrics != nil {
		r.o.Metrics.CertificateRenewal(result)
	}
	r.o.Log.Error(err, "certificate renewal failed; retrying", "retryIn", delay.String(), "failures", failures)
}

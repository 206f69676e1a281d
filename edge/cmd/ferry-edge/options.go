package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	edgeadmin "github.com/ferry-dev/ferry/edge/admin"
	"github.com/ferry-dev/ferry/edge/enrol"
	"github.com/ferry-dev/ferry/pkg/cli"
	"github.com/ferry-dev/ferry/pkg/protocol"
	"github.com/ferry-dev/ferry/pkg/proxydial"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// Options are the edge's command-line options.
type Options struct {
	BrokerAddress           string
	BrokerServerName        string
	ProxyURL                string
	TLS                     tlsconfig.Files
	TLSProfile              tlsconfig.Profile
	AgentName               string
	Kubeconfig              string
	HeartbeatInterval       time.Duration
	MaxMessageBytes         uint32
	BackoffInitial          time.Duration
	BackoffMax              time.Duration
	Selector                string
	InstallCRDs             bool
	RelatedCacheClusterWide bool
	LeaderElect             bool
	LeaderNamespace         string
	LeaseDuration           time.Duration
	LeaderIdentity          string
	RenewDeadline           time.Duration
	RetryPeriod             time.Duration
	ClientQPS               float32
	ClientBurst             int
	Zap                     zap.Options
	PprofAddress            string
	MetricsAddress          string
	HealthAddress           string
	AdminAddress            string
	// Enrolment (docs/enrolment.md): without --tls-cert, the edge's
	// credentials live in CredentialsSecret, obtained with a one-time token.
	EnrolmentTokenFile  string
	EnrolmentToken      string
	BrokerCAFingerprint string
	CredentialsSecret   string
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		HeartbeatInterval: protocol.DefaultHeartbeatInterval,
		MaxMessageBytes:   protocol.DefaultMaxMessageBytes,
		BackoffInitial:    250 * time.Millisecond,
		BackoffMax:        5 * time.Second,
		InstallCRDs:       true,
		LeaderElect:       true,
		LeaderNamespace:   "ferry-system",
		LeaseDuration:     15 * time.Second,
		RenewDeadline:     10 * time.Second,
		RetryPeriod:       2 * time.Second,
		ClientQPS:         cli.DefaultClientQPS,
		ClientBurst:       cli.DefaultClientBurst,
		// The pod name (from the downward API, see deploy/): stable across
		// container restarts, unique among the replicas of a Deployment.
		LeaderIdentity: os.Getenv("POD_NAME"),
		MetricsAddress: cli.EdgeMetricsAddress,
		HealthAddress:  cli.EdgeHealthAddress,
		AdminAddress:   edgeadmin.DefaultAddress,
		// The namespace of the pod's service account: where the chart
		// installs the edge and grants it this one Secret.
		CredentialsSecret: enrol.DefaultSecret(),
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.BrokerAddress, "broker-address", o.BrokerAddress, "host:port of the ferry broker.")
	fs.StringVar(&o.BrokerServerName, "broker-server-name", o.BrokerServerName, "Name expected in the broker's certificate; defaults to the host of --broker-address.")
	fs.StringVar(&o.ProxyURL, "proxy-url", o.ProxyURL, "HTTP CONNECT proxy to reach the broker through, http://[user:password@]host:port or https://...; credentials are sent as Basic Proxy-Authorization. Empty: HTTPS_PROXY (or https_proxy) unless NO_PROXY matches the broker's host; neither: direct.")
	o.TLSProfile.AddFlags(fs, "broker")
	fs.StringVar(&o.TLS.CertFile, "tls-cert", o.TLS.CertFile, "Client certificate (PEM); its URI SAN (or CN) is the edge's identity. Reloaded on reconnect when the file changes. With --tls-key and --broker-ca: certificates from files, managed outside ferry (no enrolment, no renewal over the stream).")
	fs.StringVar(&o.TLS.KeyFile, "tls-key", o.TLS.KeyFile, "Client private key (PEM).")
	fs.StringVar(&o.TLS.CAFile, "broker-ca", o.TLS.CAFile, "CA bundle (PEM) that signs the broker's certificate; reloaded on reconnect when the file changes.")
	fs.StringVar(&o.EnrolmentTokenFile, "enrolment-token-file", o.EnrolmentTokenFile, "File holding a one-time enrolment token (ferry-broker enrolment-token create): used only when the credentials Secret holds no usable certificate; the edge then generates its key, obtains its certificate and stores both in the Secret.")
	fs.StringVar(&o.EnrolmentToken, "enrolment-token", o.EnrolmentToken, "The enrolment token itself, for tests: it is visible in process lists; use --enrolment-token-file.")
	fs.StringVar(&o.BrokerCAFingerprint, "broker-ca-fingerprint", o.BrokerCAFingerprint, "SHA-256 fingerprint of the broker's CA certificate (sha256:<hex>, bare hex or openssl's AB:CD:… form), as ferry-broker enrolment-token create prints it; required with a token.")
	fs.StringVar(&o.CredentialsSecret, "credentials-secret", o.CredentialsSecret, "namespace/name of the Secret (type kubernetes.io/tls, plus ca.crt) in the service cluster that holds the enrolled edge's key, certificate and broker CA bundle; renewals update it. Default: ferry-edge-credentials in the namespace of the edge's service account (ferry-system outside a pod).")
	fs.StringVar(&o.AgentName, "agent-name", o.AgentName, "Name of this edge (a DNS label), shown at the broker.")
	fs.StringVar(&o.Kubeconfig, "kubeconfig", o.Kubeconfig, "Kubeconfig of the service cluster; in-cluster configuration when empty.")
	fs.DurationVar(&o.HeartbeatInterval, "heartbeat-interval", o.HeartbeatInterval, "Heartbeat interval proposed to the broker; a stream silent for three intervals is closed.")
	fs.Uint32Var(&o.MaxMessageBytes, "max-message-bytes", o.MaxMessageBytes, "Largest message accepted from the broker, in bytes.")
	fs.DurationVar(&o.BackoffInitial, "reconnect-initial-delay", o.BackoffInitial, "Upper bound of the first reconnect delay (full jitter).")
	fs.DurationVar(&o.BackoffMax, "reconnect-max-delay", o.BackoffMax, "Upper bound of any reconnect delay (full jitter).")
	fs.StringVar(&o.Selector, "published-resource-selector", o.Selector, "Label selector: this edge handles only matching PublishedResources (several edges can share a cluster).")
	fs.BoolVar(&o.InstallCRDs, "install-crds", o.InstallCRDs, "Create or update the PublishedResource CRD at start.")
	fs.BoolVar(&o.RelatedCacheClusterWide, "related-cache-cluster-wide", o.RelatedCacheClusterWide,
		"Cache related kinds (e.g. Secrets) in the whole service cluster with one watch per kind, instead of one watch per namespace ferry created or a PublishedResource names (the default: no other namespace's Secrets are held in memory). For edges serving very many workspaces.")
	fs.BoolVar(&o.LeaderElect, "leader-elect", o.LeaderElect, "Elect a leader among edge replicas (a Lease in the service cluster); only the leader connects to the broker and syncs.")
	fs.StringVar(&o.LeaderNamespace, "leader-election-namespace", o.LeaderNamespace, "Namespace of the leader election Lease (must exist).")
	fs.DurationVar(&o.LeaseDuration, "leader-election-lease-duration", o.LeaseDuration, "How long a replica waits before taking over an expired lease.")
	fs.StringVar(&o.LeaderIdentity, "leader-election-identity", o.LeaderIdentity, "Identity this replica holds the Lease under (default $POD_NAME). It must be unique among the replicas and stable across restarts of one replica: a restarted replica with the same identity takes its Lease back at once instead of waiting out the lease duration. Empty: the host name and a random suffix, new on every start.")
	fs.DurationVar(&o.RenewDeadline, "leader-election-renew-deadline", o.RenewDeadline, "How long the leader keeps trying to renew before it gives up leadership.")
	fs.DurationVar(&o.RetryPeriod, "leader-election-retry-period", o.RetryPeriod, "How often replicas try to acquire or renew the lease.")
	cli.AddClientRateFlags(fs, &o.ClientQPS, &o.ClientBurst, "the service cluster")
	cli.AddLogFlags(fs, &o.Zap)
	cli.AddProfilingFlag(fs, &o.PprofAddress)
	cli.AddObservabilityFlags(fs, &o.MetricsAddress, &o.HealthAddress)
	fs.StringVar(&o.AdminAddress, "admin-bind-address", o.AdminAddress,
		`Serve the edge's read-only admin API (ferry.v1alpha1.EdgeAdminService, plaintext gRPC with reflection: grpcurl -plaintext ADDRESS list) on this loopback host:port; "0" turns it off. Loopback only: use kubectl port-forward to reach it in a cluster.`)
}

// Validate reports every problem with the options at once.
func (o *Options) Validate() error {
	var errs []error
	if o.BrokerAddress == "" {
		errs = append(errs, errors.New("--broker-address is required"))
	}
	errs = append(errs, o.validateCredentials()...)
	if err := o.TLSProfile.Validate(); err != nil {
		errs = append(errs, err)
	}
	if msgs := validation.IsDNS1123Label(o.AgentName); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--agent-name %q must be a DNS label: %v", o.AgentName, msgs))
	}
	if o.HeartbeatInterval < protocol.MinHeartbeatInterval {
		errs = append(errs, fmt.Errorf("--heartbeat-interval must be at least %s", protocol.MinHeartbeatInterval))
	}
	if o.MaxMessageBytes < protocol.MinMaxMessageBytes {
		errs = append(errs, fmt.Errorf("--max-message-bytes must be at least %d", protocol.MinMaxMessageBytes))
	}
	if o.LeaderElect && (o.LeaderNamespace == "" || o.RetryPeriod <= 0 || o.RenewDeadline <= o.RetryPeriod || o.LeaseDuration <= o.RenewDeadline) {
		errs = append(errs, errors.New("leader election needs --leader-election-namespace and retry-period < renew-deadline < lease-duration"))
	}
	if _, err := labels.Parse(o.Selector); err != nil {
		errs = append(errs, fmt.Errorf("--published-resource-selector: %w", err))
	}
	if err := edgeadmin.ValidateAddress(o.AdminAddress); err != nil {
		errs = append(errs, err)
	}
	if o.BackoffInitial <= 0 || o.BackoffMax < o.BackoffInitial {
		errs = append(errs, errors.New("--reconnect-initial-delay must be positive and at most --reconnect-max-delay"))
	}
	return errors.Join(errs...)
}

// fileMode tells whether the certificates come from files.
func (o *Options) fileMode() bool {
	return o.TLS.CertFile != "" || o.TLS.KeyFile != "" || o.TLS.CAFile != ""
}

// validateCredentials checks the two ways of getting credentials: files
// (--tls-cert/--tls-key/--broker-ca) or enrolment (a token and the broker
// CA's fingerprint, kept in --credentials-secret), never both.
func (o *Options) validateCredentials() []error {
	var errs []error
	enrolling := o.EnrolmentTokenFile != "" || o.EnrolmentToken != "" || o.BrokerCAFingerprint != ""
	if o.fileMode() {
		if enrolling {
			return []error{errors.New("--tls-cert/--tls-key/--broker-ca (certificates from files) and --enrolment-token-file/--enrolment-token/--broker-ca-fingerprint (enrolment) exclude each other: give one")}
		}
		if o.TLS.CertFile == "" {
			errs = append(errs, errors.New("--tls-cert is required"))
		}
		if o.TLS.KeyFile == "" {
			errs = append(errs, errors.New("--tls-key is required"))
		}
		if o.TLS.CAFile == "" {
			errs = append(errs, errors.New("--broker-ca is required"))
		}
		return errs
	}
	switch {
	case !enrolling:
		// The token stays configured after the first enrolment (its file
		// may be gone by then): only needed while the Secret holds nothing.
		errs = append(errs, errors.New("--tls-cert is required (with --tls-key and --broker-ca), or enrol: --enrolment-token-file and --broker-ca-fingerprint"))
	case o.EnrolmentTokenFile != "" && o.EnrolmentToken != "":
		errs = append(errs, errors.New("--enrolment-token-file and --enrolment-token exclude each other"))
	case o.EnrolmentTokenFile == "" && o.EnrolmentToken == "":
		errs = append(errs, errors.New("--enrolment-token-file is required with --broker-ca-fingerprint"))
	case o.BrokerCAFingerprint == "":
		errs = append(errs, errors.New("--broker-ca-fingerprint is required with an enrolment token"))
	}
	if o.BrokerCAFingerprint != "" {
		if _, err := tlsconfig.ParseFingerprint(o.BrokerCAFingerprint); err != nil {
			errs = append(errs, fmt.Errorf("--broker-ca-fingerprint: %w", err))
		}
	}
	if _, _, err := enrol.ParseSecretRef(o.CredentialsSecret); err != nil {
		errs = append(errs, fmt.Errorf("--credentials-secret: %w", err))
	}
	return errs
}

// Completed holds what the options point at, loaded and checked.
type Completed struct {
	*Options
	// TLS is the client TLS configuration: from files, or (enrolment)
	// set by setupCredentials at start.
	TLS      *tlsconfig.ClientConfig
	Dialer   *proxydial.Dialer
	Service  *rest.Config
	Selector labels.Selector
}

// Complete loads the certificates and the service cluster's kubeconfig.
func (o *Options) Complete() (*Completed, error) {
	var errs []error
	var tlsCfg *tlsconfig.ClientConfig
	if o.fileMode() {
		var err error
		if tlsCfg, err = tlsconfig.Client(o.TLS, o.BrokerServerName, o.TLSProfile); err != nil {
			errs = append(errs, fmt.Errorf("TLS (--tls-cert/--tls-key/--broker-ca): %w", err))
		}
	}
	dialer, err := proxydial.New(proxydial.Options{ProxyURL: o.ProxyURL})
	if err != nil {
		errs = append(errs, err)
	}
	svc, err := clientcmd.BuildConfigFromFlags("", o.Kubeconfig)
	if err != nil {
		errs = append(errs, fmt.Errorf("service cluster kubeconfig (--kubeconfig %q): %w", o.Kubeconfig, err))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	cli.ShareRateLimit(svc, o.ClientQPS, o.ClientBurst)
	selector, err := labels.Parse(o.Selector)
	if err != nil {
		return nil, fmt.Errorf("--published-resource-selector: %w", err)
	}
	return &Completed{Options: o, TLS: tlsCfg, Dialer: dialer, Service: svc, Selector: selector}, nil
}

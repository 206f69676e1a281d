package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/enrolment"
	"github.com/ferry-dev/ferry/broker/kcp"
	"github.com/ferry-dev/ferry/broker/server"
	"github.com/ferry-dev/ferry/pkg/cli"
	"github.com/ferry-dev/ferry/pkg/protocol"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// Options are the broker's command-line options.
type Options struct {
	ListenAddress     string
	ConfigFile        string
	KCPKubeconfig     string
	TLS               tlsconfig.Files
	TLSProfile        tlsconfig.Profile
	HeartbeatInterval time.Duration
	MaxMessageBytes   uint32
	ShutdownTimeout   time.Duration
	InFlightWindow    int
	EngineIdleTimeout time.Duration
	ClientQPS         float32
	ClientBurst       int
	Zap               zap.Options
	PprofAddress      string
	MetricsAddress    string
	HealthAddress     string
	// EdgeLeaseNamespace, EdgeLeaseRenewInterval and
	// EdgeLeaseRenewalsPerSecond: the Lease per edge in kcp
	// (docs/edge-status.md).
	EdgeLeaseNamespace         string
	EdgeLeaseRenewInterval     time.Duration
	EdgeLeaseRenewalsPerSecond float64
	// VirtualWorkspaceURLRewrite maps the virtual workspace URLs kcp lists,
	// FROM=TO per shard (kcp.EndpointRewrite); none keeps them.
	VirtualWorkspaceURLRewrite []string
	// Enrolment (docs/enrolment.md): the CA that signs edge certificates,
	// the bundle enrolled edges verify the broker with, lifetimes.
	EdgeSigningCertFile     string
	EdgeSigningKeyFile      string
	BrokerCAFile            string
	EdgeCertificateLifetime time.Duration
	EnrolmentTokenTTL       time.Duration
	// StateNamespace holds the broker's durable state in kcp (enrolment
	// tokens, revocations), in the workspace of each configured APIExport.
	StateNamespace string
	// ReplicaAddress turns on ownership among broker replicas: this
	// replica's address as edges dial it (OwnershipLeaseNamespace holds the
	// Leases; broker/ownership).
	ReplicaAddress          string
	OwnershipLeaseNamespace string
	OwnershipLeaseDuration  time.Duration
	// ReplicaLeaseWorkspace holds this replica's own Lease (empty: the
	// first configured APIExport's workspace, by name).
	ReplicaLeaseWorkspace string
	// Handshake admission (server.AdmissionOptions).
	MaxConcurrentHandshakes int
	HandshakeMaxWait        time.Duration
	HandshakeRetryAfter     time.Duration
}

// NewOptions returns the defaults.
func NewOptions() *Options {
	return &Options{
		ListenAddress:              ":9443",
		HeartbeatInterval:          protocol.DefaultHeartbeatInterval,
		MaxMessageBytes:            protocol.DefaultMaxMessageBytes,
		ShutdownTimeout:            10 * time.Second,
		InFlightWindow:             256,
		EngineIdleTimeout:          15 * time.Minute,
		ClientQPS:                  cli.DefaultClientQPS,
		ClientBurst:                cli.DefaultClientBurst,
		MetricsAddress:             cli.BrokerMetricsAddress,
		HealthAddress:              cli.BrokerHealthAddress,
		EdgeLeaseNamespace:         metav1.NamespaceDefault,
		EdgeLeaseRenewInterval:     server.DefaultEdgeLeaseRenewInterval,
		EdgeLeaseRenewalsPerSecond: server.DefaultEdgeLeaseRenewalsPerSecond,
		EdgeCertificateLifetime:    enrolment.DefaultCertificateLifetime,
		EnrolmentTokenTTL:          enrolment.DefaultTokenTTL,
		StateNamespace:             metav1.NamespaceDefault,
		OwnershipLeaseNamespace:    metav1.NamespaceDefault,
		OwnershipLeaseDuration:     15 * time.Second,
		MaxConcurrentHandshakes:    server.DefaultMaxConcurrentHandshakes,
		HandshakeMaxWait:           server.DefaultHandshakeMaxWait,
		HandshakeRetryAfter:        server.DefaultHandshakeRetryAfter,
	}
}

// AddFlags registers the options on fs.
func (o *Options) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.ListenAddress, "listen-address", o.ListenAddress, "Address the gRPC server listens on.")
	fs.StringVar(&o.ConfigFile, "config", o.ConfigFile, "Broker configuration (YAML): edge identities and the APIExport each may serve, admin identities.")
	fs.StringVar(&o.KCPKubeconfig, "kcp-kubeconfig", o.KCPKubeconfig, "Kubeconfig with the broker's kcp credentials.")
	fs.StringVar(&o.TLS.CertFile, "tls-cert", o.TLS.CertFile, "Server certificate (PEM); reloaded when the file changes.")
	fs.StringVar(&o.TLS.KeyFile, "tls-key", o.TLS.KeyFile, "Server private key (PEM); reloaded when the file changes.")
	fs.StringVar(&o.TLS.CAFile, "client-ca", o.TLS.CAFile, "CA bundle (PEM) that signs edge and admin client certificates; reloaded when the file changes.")
	o.TLSProfile.AddFlags(fs, "edges and admin clients")
	fs.DurationVar(&o.HeartbeatInterval, "heartbeat-interval", o.HeartbeatInterval, "Heartbeat interval proposed to edges; a stream silent for three intervals is closed.")
	fs.Uint32Var(&o.MaxMessageBytes, "max-message-bytes", o.MaxMessageBytes, "Largest message accepted from an edge, in bytes.")
	fs.DurationVar(&o.EngineIdleTimeout, "engine-idle-timeout", o.EngineIdleTimeout, "How long an APIExport's sync engine (kcp watches, caches, outbox) is kept while no edge is connected; a reconnect within it costs no re-list from kcp.")
	fs.IntVar(&o.InFlightWindow, "in-flight-window", o.InFlightWindow, "Sync intents that may await the edge's result at once, per edge (backpressure).")
	fs.DurationVar(&o.ShutdownTimeout, "shutdown-timeout", o.ShutdownTimeout, "How long in-flight calls may take to finish on SIGTERM.")
	cli.AddClientRateFlags(fs, &o.ClientQPS, &o.ClientBurst, "kcp")
	cli.AddLogFlags(fs, &o.Zap)
	cli.AddProfilingFlag(fs, &o.PprofAddress)
	cli.AddObservabilityFlags(fs, &o.MetricsAddress, &o.HealthAddress)
	fs.StringVar(&o.EdgeLeaseNamespace, "edge-lease-namespace", o.EdgeLeaseNamespace, "Namespace, in the workspace of each configured APIExport, of the coordination.k8s.io Lease per configured edge that shows whether the edge is connected (kubectl get leases -l app.kubernetes.io/managed-by=ferry-broker); empty writes no Leases.")
	fs.StringArrayVar(&o.VirtualWorkspaceURLRewrite, kcp.EndpointRewriteFlag, o.VirtualWorkspaceURLRewrite, kcp.EndpointRewriteUsage)
	fs.StringVar(&o.EdgeSigningCertFile, "edge-signing-cert", o.EdgeSigningCertFile, "CA certificate (PEM) that signs edge client certificates at enrolment and renewal; it must verify against --client-ca. Without it, enrolment and renewal are off.")
	fs.StringVar(&o.EdgeSigningKeyFile, "edge-signing-key", o.EdgeSigningKeyFile, "Private key (PEM) of --edge-signing-cert.")
	fs.StringVar(&o.BrokerCAFile, "broker-ca", o.BrokerCAFile, "CA bundle (PEM) that verifies this broker's serving certificate, handed to enrolled edges (at enrolment and every renewal, read again each time). Default: the --client-ca file.")
	fs.DurationVar(&o.EdgeCertificateLifetime, "edge-certificate-lifetime", o.EdgeCertificateLifetime, "Lifetime of the edge certificates the broker signs; edges renew them after two thirds of it.")
	fs.DurationVar(&o.EnrolmentTokenTTL, "enrolment-token-ttl", o.EnrolmentTokenTTL, "Default lifetime of enrolment tokens (at most 168h).")
	fs.StringVar(&o.StateNamespace, "state-namespace", o.StateNamespace, "Namespace, in the workspace of each configured APIExport, of the broker's durable state in kcp: hashed enrolment tokens and revocations (Secrets).")
	fs.StringVar(&o.ReplicaAddress, "replica-address", o.ReplicaAddress, "This replica's own address (host:port) as edges dial it, e.g. its name in a headless Service; set when several broker replicas run: each APIExport is then served by the replica that holds its Lease in kcp (--ownership-lease-namespace), and the others send its edge there. Empty: this broker serves every APIExport (one replica).")
	fs.StringVar(&o.OwnershipLeaseNamespace, "ownership-lease-namespace", o.OwnershipLeaseNamespace, "Namespace, in the workspace of each configured APIExport, of the coordination.k8s.io Lease (ferry-owner-<export>) whose holder serves the export; with --replica-address.")
	fs.StringVar(&o.ReplicaLeaseWorkspace, "replica-lease-workspace", o.ReplicaLeaseWorkspace, "kcp workspace (path, e.g. root:ferry) holding each replica's own Lease (ferry-replica-<hash>, in --ownership-lease-namespace), the one Lease a replica renews: an APIExport's Lease only names its owner and where that owner's replica Lease is. Empty: the first workspace, by name, of the configured APIExports. With --replica-address.")
	fs.DurationVar(&o.OwnershipLeaseDuration, "ownership-lease-duration", o.OwnershipLeaseDuration, "How long an APIExport's owner may go without renewing its Lease before another replica takes the export over; the owner stops writing after two thirds of it. With --replica-address.")
	fs.IntVar(&o.MaxConcurrentHandshakes, "max-concurrent-handshakes", o.MaxConcurrentHandshakes, "Edge handshakes (which read kcp) run at once; one beyond waits up to --handshake-max-wait for a slot and is then refused with RESOURCE_EXHAUSTED and a retry delay the edge honours (a reconnect storm of every edge is taken in bounded bites). 0 bounds nothing.")
	fs.DurationVar(&o.HandshakeMaxWait, "handshake-max-wait", o.HandshakeMaxWait, "How long an edge handshake waits for a slot (--max-concurrent-handshakes) before it is refused as busy.")
	fs.DurationVar(&o.HandshakeRetryAfter, "handshake-retry-after", o.HandshakeRetryAfter, "Mean retry delay given to an edge refused as busy (each drawn from half to one and a half times it).")
	fs.DurationVar(&o.EdgeLeaseRenewInterval, "edge-lease-renew-interval", o.EdgeLeaseRenewInterval, "Shortest interval between two renewals of a connected edge's Lease in kcp: it is renewed every heartbeat interval, but no more often than this.")
	fs.Float64Var(&o.EdgeLeaseRenewalsPerSecond, "edge-lease-renewals-per-second", o.EdgeLeaseRenewalsPerSecond, "Renewals of the connected edges' Leases in kcp per second, all edges together: with N edges connected each Lease is renewed every max(heartbeat interval, --edge-lease-renew-interval, N / this) and lasts three such periods (1,000 edges at 50: every 20 s). Connects and disconnects are written at once. 0 bounds nothing.")
}

// Validate reports every problem with the options at once.
func (o *Options) Validate() error {
	var errs []error
	if o.ListenAddress == "" {
		errs = append(errs, errors.New("--listen-address is required"))
	}
	if o.ConfigFile == "" {
		errs = append(errs, errors.New("--config is required"))
	}
	if o.KCPKubeconfig == "" {
		errs = append(errs, errors.New("--kcp-kubeconfig is required"))
	}
	if o.TLS.CertFile == "" {
		errs = append(errs, errors.New("--tls-cert is required"))
	}
	if o.TLS.KeyFile == "" {
		errs = append(errs, errors.New("--tls-key is required"))
	}
	if o.TLS.CAFile == "" {
		errs = append(errs, errors.New("--client-ca is required"))
	}
	if err := o.TLSProfile.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.HeartbeatInterval < protocol.MinHeartbeatInterval {
		errs = append(errs, fmt.Errorf("--heartbeat-interval must be at least %s", protocol.MinHeartbeatInterval))
	}
	if o.MaxMessageBytes < protocol.MinMaxMessageBytes {
		errs = append(errs, fmt.Errorf("--max-message-bytes must be at least %d", protocol.MinMaxMessageBytes))
	}
	if o.InFlightWindow < 1 {
		errs = append(errs, errors.New("--in-flight-window must be at least 1"))
	}
	if o.MaxConcurrentHandshakes < 0 {
		errs = append(errs, errors.New("--max-concurrent-handshakes must not be negative"))
	}
	if o.MaxConcurrentHandshakes > 0 && (o.HandshakeMaxWait <= 0 || o.HandshakeMaxWait >= protocol.HandshakeTimeout) {
		errs = append(errs, fmt.Errorf("--handshake-max-wait must be positive and shorter than the edges' handshake timeout (%s)", protocol.HandshakeTimeout))
	}
	if o.MaxConcurrentHandshakes > 0 && o.HandshakeRetryAfter <= 0 {
		errs = append(errs, errors.New("--handshake-retry-after must be positive"))
	}
	if o.EngineIdleTimeout <= 0 {
		errs = append(errs, errors.New("--engine-idle-timeout must be positive"))
	}
	if o.EdgeLeaseNamespace != "" {
		if msgs := validation.IsDNS1123Label(o.EdgeLeaseNamespace); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--edge-lease-namespace %q is not a namespace name: %s", o.EdgeLeaseNamespace, strings.Join(msgs, "; ")))
		}
	}
	if msgs := validation.IsDNS1123Label(o.StateNamespace); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--state-namespace %q is not a namespace name: %s", o.StateNamespace, strings.Join(msgs, "; ")))
	}
	if o.EdgeLeaseRenewInterval < protocol.MinHeartbeatInterval {
		errs = append(errs, fmt.Errorf("--edge-lease-renew-interval must be at least %s", protocol.MinHeartbeatInterval))
	}
	if !(o.EdgeLeaseRenewalsPerSecond >= 0) || math.IsInf(o.EdgeLeaseRenewalsPerSecond, 1) {
		errs = append(errs, errors.New("--edge-lease-renewals-per-second must be a finite number, 0 or more"))
	}
	if o.ShutdownTimeout <= 0 {
		errs = append(errs, errors.New("--shutdown-timeout must be positive"))
	}
	if _, err := kcp.ParseEndpointRewrite(o.VirtualWorkspaceURLRewrite); err != nil {
		errs = append(errs, fmt.Errorf("--%s: %w", kcp.EndpointRewriteFlag, err))
	}
	if (o.EdgeSigningCertFile == "") != (o.EdgeSigningKeyFile == "") {
		errs = append(errs, errors.New("--edge-signing-cert and --edge-signing-key go together"))
	}
	if o.EdgeCertificateLifetime < enrolment.MinCertificateLifetime {
		errs = append(errs, fmt.Errorf("--edge-certificate-lifetime must be at least %s", enrolment.MinCertificateLifetime))
	}
	if o.EnrolmentTokenTTL <= 0 || o.EnrolmentTokenTTL > enrolment.MaxTokenTTL {
		errs = append(errs, fmt.Errorf("--enrolment-token-ttl must be positive and at most %s", enrolment.MaxTokenTTL))
	}
	if o.ReplicaAddress != "" {
		if _, port, err := net.SplitHostPort(o.ReplicaAddress); err != nil || port == "" {
			errs = append(errs, fmt.Errorf("--replica-address %q must be host:port, the address edges dial this replica at", o.ReplicaAddress))
		}
		if msgs := validation.IsDNS1123Label(o.OwnershipLeaseNamespace); len(msgs) > 0 {
			errs = append(errs, fmt.Errorf("--ownership-lease-namespace %q is not a namespace name: %s", o.OwnershipLeaseNamespace, strings.Join(msgs, "; ")))
		}
		if o.OwnershipLeaseDuration < 3*time.Second {
			errs = append(errs, errors.New("--ownership-lease-duration must be at least 3s"))
		}
	}
	return errors.Join(errs...)
}

// Completed holds what the options point at, loaded and checked.
type Completed struct {
	*Options
	Config *config.Config
	TLS    *tls.Config
	KCP    *rest.Config
	// EndpointRewrite is VirtualWorkspaceURLRewrite, parsed.
	EndpointRewrite kcp.EndpointRewrite
	// Signer issues edge certificates; nil when enrolment is off.
	Signer *enrolment.Signer
	// BrokerCA names the bundle handed to enrolled edges.
	BrokerCA enrolment.BrokerCAFiles
}

// Complete loads the configuration file, the certificates and the kcp
// kubeconfig; every failure names the file at fault. log receives the TLS
// server's refusals.
func (o *Options) Complete(log logr.Logger) (*Completed, error) {
	var errs []error
	cfg, err := config.Load(o.ConfigFile)
	if err != nil {
		errs = append(errs, err)
	}
	tlsCfg, err := tlsconfig.Server(o.TLS, o.TLSProfile, log.WithName("tls"))
	if err != nil {
		errs = append(errs, fmt.Errorf("TLS (--tls-cert/--tls-key/--client-ca): %w", err))
	}
	kcpCfg, err := clientcmd.BuildConfigFromFlags("", o.KCPKubeconfig)
	if err != nil {
		errs = append(errs, fmt.Errorf("--kcp-kubeconfig %s: %w", o.KCPKubeconfig, err))
	}
	rewrite, err := kcp.ParseEndpointRewrite(o.VirtualWorkspaceURLRewrite)
	if err != nil {
		errs = append(errs, fmt.Errorf("--%s: %w", kcp.EndpointRewriteFlag, err))
	}
	signer, brokerCA, err := o.completeEnrolment()
	if err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	cli.ShareRateLimit(kcpCfg, o.ClientQPS, o.ClientBurst)
	return &Completed{Options: o, Config: cfg, TLS: tlsCfg, KCP: kcpCfg, EndpointRewrite: rewrite, Signer: signer, BrokerCA: brokerCA}, nil
}

// completeEnrolment loads and checks the signing CA and the broker CA
// bundle; enrolment is off (nil signer) without --edge-signing-cert.
func (o *Options) completeEnrolment() (*enrolment.Signer, enrolment.BrokerCAFiles, error) {
	brokerCA := enrolment.BrokerCAFiles{BundleFile: o.BrokerCAFile, ServingCertFile: o.TLS.CertFile}
	if brokerCA.BundleFile == "" {
		brokerCA.BundleFile = o.TLS.CAFile
	}
	if o.EdgeSigningCertFile == "" {
		return nil, brokerCA, nil
	}
	signer, err := enrolment.LoadSigner(o.EdgeSigningCertFile, o.EdgeSigningKeyFile, o.TLS.CAFile, o.EdgeCertificateLifetime, clock.RealClock{})
	if err != nil {
		return nil, brokerCA, fmt.Errorf("--edge-signing-cert/--edge-signing-key: %w", err)
	}
	if _, err := brokerCA.Load(); err != nil {
		return nil, brokerCA, fmt.Errorf("--broker-ca: %w", err)
	}
	return signer, brokerCA, nil
}

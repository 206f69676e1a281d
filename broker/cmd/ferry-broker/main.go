// Command ferry-broker runs beside kcp: it holds the kcp credentials and
// serves the gRPC endpoint that ferry edges dial. `ferry-broker dev-certs`
// makes a development PKI; `ferry-broker release-finalizers` cleans up
// after an edge that is uninstalled for good; `ferry-broker
// enrolment-token create` issues a one-time enrolment token.
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/enrolment"
	"github.com/ferry-dev/ferry/broker/kcp"
	"github.com/ferry-dev/ferry/broker/ownership"
	"github.com/ferry-dev/ferry/broker/publish"
	"github.com/ferry-dev/ferry/broker/revocation"
	"github.com/ferry-dev/ferry/broker/server"
	"github.com/ferry-dev/ferry/pkg/cli"
	"github.com/ferry-dev/ferry/pkg/metrics"
	"github.com/ferry-dev/ferry/pkg/version"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "dev-certs" {
		if err := runDevCerts(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "ferry-broker dev-certs: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 2 && os.Args[1] == "enrolment-token" && os.Args[2] == "create" {
		if err := runCreateToken(os.Args[3:]); err != nil {
			fmt.Fprintf(os.Stderr, "ferry-broker enrolment-token create: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "release-finalizers" {
		if err := runRelease(os.Args[2:]); err != nil {
			fmt.Fprintf(os.Stderr, "ferry-broker release-finalizers: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "ferry-broker: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	opts := NewOptions()
	if help, err := cli.Parse("ferry-broker", args, opts); help || err != nil {
		return err
	}
	log := cli.NewLogger("ferry-broker", &opts.Zap)
	completed, err := opts.Complete(log)
	if err != nil {
		return err
	}
	log.Info("starting", "version", version.String(), "tls", opts.TLSProfile.String())

	m, err := metrics.NewBroker(ctrlmetrics.Registry, metrics.Certificate{Role: "server", File: opts.TLS.CertFile})
	if err != nil {
		return err
	}
	m.InstrumentClient(completed.KCP, "kcp")
	kcpClient, err := kcp.NewClient(completed.KCP)
	if err != nil {
		return err
	}
	kcpReachable, err := cli.APIServerReachable(completed.KCP, "kcp")
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if opts.PprofAddress != "" {
		if _, err := cli.ServeProfiles(ctx, opts.PprofAddress, log); err != nil {
			return err
		}
	}

	// The broker's state in kcp: revocations and enrolment tokens.
	state, err := kcp.NewSecretsClients(completed.KCP)
	if err != nil {
		return err
	}
	revocations := loadRevocations(ctx, completed, state, log)

	lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", opts.ListenAddress)
	if err != nil {
		return fmt.Errorf("cannot listen on --listen-address %s: %w", opts.ListenAddress, err)
	}
	enrol, err := enrolmentOptions(completed, state)
	if err != nil {
		return err
	}
	// Blocked identities get no certificate: neither at enrolment nor at
	// renewal.
	enrol.Blocklist = revocations
	owners, err := replicaOwnership(completed, log)
	if err != nil {
		return err
	}
	srv := server.New(server.Options{
		Config:            completed.Config,
		TLS:               completed.TLS,
		Resolver:          kcp.NewResolver(kcpClient, completed.EndpointRewrite),
		Publisher:         publish.NewPublisher(kcpClient, log.WithName("publish")),
		KCP:               completed.KCP,
		InFlightWindow:    opts.InFlightWindow,
		EngineIdleTimeout: opts.EngineIdleTimeout,
		HeartbeatInterval: opts.HeartbeatInterval,
		MaxMessageBytes:   opts.MaxMessageBytes,
		ShutdownTimeout:   opts.ShutdownTimeout,
		Log:               log,
		Metrics:           m,
		EdgeLeases: server.EdgeLeaseOptions{
			Namespace: opts.EdgeLeaseNamespace, RenewInterval: opts.EdgeLeaseRenewInterval,
			RenewalsPerSecond: opts.EdgeLeaseRenewalsPerSecond,
		},
		Revocations: revocations,
		Enrolment:   enrol,
		Ownership:   owners,
		Admission: server.AdmissionOptions{
			MaxConcurrent: opts.MaxConcurrentHandshakes, MaxWait: opts.HandshakeMaxWait, RetryAfter: opts.HandshakeRetryAfter,
		},
	})
	if err := m.RegisterSource(ctrlmetrics.Registry, srv.MetricsSource()); err != nil {
		return err
	}
	if _, err := cli.ServeMetrics(ctx, opts.MetricsAddress, ctrlmetrics.Registry, log); err != nil {
		return err
	}
	serving := func(*http.Request) error {
		if !srv.Serving() {
			return errors.New("the gRPC server is not serving (starting or shutting down)")
		}
		return nil
	}
	// An unreachable shard does not fail readiness: the broker still serves
	// every other shard's workspaces. The probe's body names it.
	shards := func(*http.Request) error {
		if down := srv.UnreachableEndpoints(); len(down) > 0 {
			return &cli.Degraded{Reason: strings.Join(down, "; ")}
		}
		return nil
	}
	if _, err := cli.ServeHealth(ctx, opts.HealthAddress, cli.Checks{"ping": cli.Ping},
		cli.Checks{"grpc": serving, "kcp": kcpReachable, "virtual-workspaces": shards}, log); err != nil {
		return err
	}
	if err := srv.Serve(ctx, lis); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	log.Info("stopped")
	return nil
}

// revocationLoadTimeout bounds the read of the revocations at start.
const revocationLoadTimeout = 30 * time.Second

// loadRevocations reads the blocks of the configuration and those kept in
// kcp. A workspace whose blocks cannot be read now does not stop the broker:
// its edges are refused until a later read succeeds (see
// revocation.Set.EnsureLoaded).
func loadRevocations(ctx context.Context, c *Completed, clients kcp.SecretsClients, log logr.Logger) *revocation.Set {
	set := revocation.New(revocation.Options{Config: c.Config, Clients: clients, Namespace: c.StateNamespace, Log: log.WithName("revocation")})
	// Bounded: a kcp that does not answer must not keep the broker from
	// serving the workspaces that did.
	loadCtx, cancel := context.WithTimeout(ctx, revocationLoadTimeout)
	defer cancel()
	if err := set.Load(loadCtx); err != nil {
		log.Error(err, "cannot read every revocation from kcp yet; the edges of those workspaces are refused until it succeeds")
	}
	return set
}

// enrolmentOptions wires the signing CA and the token store; the zero value
// (enrolment off) without a signing CA.
func enrolmentOptions(c *Completed, clients kcp.SecretsClients) (server.EnrolmentOptions, error) {
	if c.Signer == nil {
		return server.EnrolmentOptions{}, nil
	}
	return server.EnrolmentOptions{
		Signer:          c.Signer,
		Tokens:          enrolment.NewTokenStore(clients, c.StateNamespace, c.Config, clock.RealClock{}),
		BrokerCA:        c.BrokerCA,
		DefaultTokenTTL: c.EnrolmentTokenTTL,
	}, nil
}

// firstWorkspace is the first workspace, by name, of cfg's APIExports
// ("" when it has none).
func firstWorkspace(cfg *config.Config) string {
	first := ""
	for _, e := range cfg.Edges {
		if ws := e.APIExport.Workspace; ws != "" && (first == "" || ws < first) {
			first = ws
		}
	}
	return first
}

// replicaOwnership returns the ownership of APIExports among broker
// replicas with --replica-address, else nil (this broker serves them all).
func replicaOwnership(c *Completed, log logr.Logger) (*ownership.Owners, error) {
	if c.ReplicaAddress == "" {
		return nil, nil
	}
	leases, err := kcp.NewLeasesClients(c.KCP)
	if err != nil {
		return nil, err
	}
	workspace := c.ReplicaLeaseWorkspace
	if workspace == "" {
		workspace = firstWorkspace(c.Config)
		if workspace == "" {
			return nil, errors.New("--replica-lease-workspace is required: no configured edge names an APIExport whose workspace could hold this replica's Lease")
		}
		log.Info("this replica's Lease is in the first workspace of the configured APIExports; set --replica-lease-workspace to choose", "workspace", workspace)
	}
	d := c.OwnershipLeaseDuration
	return ownership.New(ownership.Options{
		Leases: leases, Namespace: c.OwnershipLeaseNamespace, Workspace: workspace, Identity: c.ReplicaAddress,
		// client-go's proportions (15 s, 10 s, 2 s).
		LeaseDuration: d, RenewDeadline: d * 2 / 3, RetryPeriod: d * 2 / 15,
		Log: log.WithName("ownership"),
	})
}

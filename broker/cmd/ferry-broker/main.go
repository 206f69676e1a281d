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

	"k8s.io/utils/clock"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/ferry-dev/ferry/broker/enrolment"
	"github.com/ferry-dev/ferry/broker/kcp"
	"github.com/ferry-dev/ferry/broker/publish"
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
	completed, err := opts.Complete()
	if err != nil {
		return err
	}
	log := cli.NewLogger("ferry-broker", &opts.Zap)
	log.Info("starting", "version", version.String())

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

	lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", opts.ListenAddress)
	if err != nil {
		return fmt.Errorf("cannot listen on --listen-address %s: %w", opts.ListenAddress, err)
	}
	enrol, err := enrolmentOptions(completed)
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
		},
		Enrolment: enrol,
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

// enrolmentOptions wires the signing CA and the token store; the zero value
// (enrolment off) without a signing CA.
func enrolmentOptions(c *Completed) (server.EnrolmentOptions, error) {
	if c.Signer == nil {
		return server.EnrolmentOptions{}, nil
	}
	clients, err := enrolment.NewClients(c.KCP)
	if err != nil {
		return server.EnrolmentOptions{}, err
	}
	return server.EnrolmentOptions{
		Signer:          c.Signer,
		Tokens:          enrolment.NewTokenStore(clients, c.StateNamespace, c.Config, clock.RealClock{}),
		BrokerCA:        c.BrokerCA,
		DefaultTokenTTL: c.EnrolmentTokenTTL,
	}, nil
}

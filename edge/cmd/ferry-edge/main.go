// Command ferry-edge runs in a service cluster: it publishes the CRDs its
// PublishedResources name through the ferry broker it dials. `ferry-edge
// migrate` converts the PublishedResources of api-syncagent and of the KDP
// servlet into ferry's; `ferry-edge render` previews offline what a
// PublishedResource publishes and how an object is copied.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/ferry-dev/ferry/pkg/logging"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	edgeadmin "github.com/ferry-dev/ferry/edge/admin"
	"github.com/ferry-dev/ferry/edge/publish"
	"github.com/ferry-dev/ferry/pkg/cli"
	"github.com/ferry-dev/ferry/pkg/metrics"
	"github.com/ferry-dev/ferry/pkg/version"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "migrate" {
		if err := runMigrate(os.Args[2:], os.Stdin, os.Stdout, os.Stderr); err != nil {
			fmt.Fprintf(os.Stderr, "ferry-edge migrate: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "render" {
		if err := runRender(os.Args[2:], os.Stdout); err != nil {
			fmt.Fprintf(os.Stderr, "ferry-edge render: %v\n", err)
			os.Exit(1)
		}
		return
	}
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "ferry-edge: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	opts := NewOptions()
	if help, err := cli.Parse("ferry-edge", args, opts); help || err != nil {
		return err
	}
	completed, err := opts.Complete()
	if err != nil {
		return err
	}
	log := cli.NewLogger("ferry-edge", &opts.Zap)
	log.Info("starting", "version", version.String(), "broker", opts.BrokerAddress, "route", completed.Dialer.Route(opts.BrokerAddress), "tls", opts.TLSProfile.String())
	p := &edgeProcess{cfg: completed, log: log}
	clientCert := metrics.Certificate{Role: "client", File: opts.TLS.CertFile}
	if !opts.fileMode() {
		clientCert = metrics.Certificate{Role: "client", Expiry: p.clientCertificateExpiry}
	}
	m, err := metrics.NewEdge(ctrlmetrics.Registry, clientCert)
	if err != nil {
		return err
	}
	p.metrics = m
	if completed.TLS != nil {
		p.tls.Store(completed.TLS)
	}
	m.InstrumentClient(completed.Service, "service")

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if opts.PprofAddress != "" {
		if _, err := cli.ServeProfiles(ctx, opts.PprofAddress, log); err != nil {
			return err
		}
	}

	// Probes and metrics first: installing the CRD may wait for the API
	// server, and liveness must not fail meanwhile.
	if _, err := cli.ServeMetrics(ctx, opts.MetricsAddress, ctrlmetrics.Registry, log); err != nil {
		return err
	}
	if _, err := cli.ServeHealth(ctx, opts.HealthAddress, cli.Checks{"ping": cli.Ping}, cli.Checks{"broker": p.ready}, log); err != nil {
		return err
	}
	// The admin view outlives incarnations; each points it at its own state.
	p.admin = edgeadmin.New(opts.AgentName, opts.BrokerAddress)
	if _, err := p.admin.Serve(ctx, opts.AdminAddress, log.WithName("admin")); err != nil {
		return err
	}

	if err := p.setupCredentials(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped while starting
		}
		return err
	}

	if opts.InstallCRDs {
		installCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		err := publish.InstallCRD(installCtx, completed.Service)
		cancel()
		if ctx.Err() != nil {
			return nil // stopped while starting
		}
		if err != nil {
			return err
		}
	}

	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiextensionsv1.AddToScheme, ferryv1alpha1.AddToScheme} {
		if err := add(scheme); err != nil {
			return err
		}
	}
	p.scheme = scheme
	if opts.LeaderElect {
		if p.identity, err = leaderIdentity(opts.LeaderIdentity); err != nil {
			return err
		}
		if p.leaderClient, err = kubernetes.NewForConfig(leaderConfig(completed.Service, opts.RenewDeadline)); err != nil {
			return fmt.Errorf("cannot create the leader election client: %w", err)
		}
		// Not bound to ctx: the Lease's release on shutdown is recorded after
		// ctx ends; Shutdown at return stops it.
		events := record.NewBroadcaster()
		defer events.Shutdown()
		events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: p.leaderClient.CoreV1().Events(opts.LeaderNamespace)})
		p.events = events.NewRecorder(scheme, corev1.EventSource{Component: "ferry-edge", Host: p.identity})
		log.Info("leader election", logging.KeyIdentity, p.identity, "lease", opts.LeaderNamespace+"/"+leaseName(opts))
	}

	// Incarnations: a lost lease ends one, and the next starts in the same
	// process (see incarnation.go). Only the first starts without waiting:
	// at startup an unreachable API server is worth failing for, as before.
	for n := 1; ; n++ {
		err := p.runIncarnation(ctx, n)
		if !restartAfter(ctx, err) {
			log.Info("stopped")
			return err
		}
		log.Info("lost the leader election lease; the process stays up and starts a new incarnation, which leads again once the service cluster's API server is back",
			"reason", err.Error(), "incarnation", n+1)
		if err := awaitAPIServer(ctx, p.leaderClient.Discovery().RESTClient(), log); err != nil {
			log.Info("stopped")
			return nil // stopped while waiting
		}
	}
}

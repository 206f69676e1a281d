// Command ferry-edge runs in a service cluster: it publishes the CRDs its
// PublishedResources name through the ferry broker it dials.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/edge/publish"
	"github.com/ferry-dev/ferry/edge/replica"
	"github.com/ferry-dev/ferry/edge/session"
	"github.com/ferry-dev/ferry/edge/stream"
	"github.com/ferry-dev/ferry/pkg/backoff"
	"github.com/ferry-dev/ferry/pkg/cli"
	"github.com/ferry-dev/ferry/pkg/link"
	"github.com/ferry-dev/ferry/pkg/version"
)

func main() {
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
	log.Info("starting", "version", version.String(), "broker", opts.BrokerAddress)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

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
	mgr, err := ctrl.NewManager(completed.Service, ctrl.Options{
		Scheme:                 scheme,
		Logger:                 log,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache: cache.Options{ByObject: map[client.Object]cache.ByObject{
			&ferryv1alpha1.PublishedResource{}: {Label: completed.Selector},
		}},
		LeaderElection:                opts.LeaderElect,
		LeaderElectionID:              "ferry-edge-" + opts.AgentName,
		LeaderElectionNamespace:       opts.LeaderNamespace,
		LeaderElectionReleaseOnCancel: true,
		LeaseDuration:                 &opts.LeaseDuration,
		RenewDeadline:                 &opts.RenewDeadline,
		RetryPeriod:                   &opts.RetryPeriod,
	})
	if err != nil {
		return fmt.Errorf("cannot set up the controller manager for the service cluster: %w", err)
	}
	dyn, err := dynamic.NewForConfig(completed.Service)
	if err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(completed.Service)
	if err != nil {
		return err
	}
	wake, pending := link.NewWake()
	store := publish.NewStore(opts.BrokerAddress, wake)
	engine := replica.NewEngine(replica.Options{Agent: opts.AgentName, Dynamic: dyn, Kube: kube, Wake: wake, Log: log.WithName("replica")})
	if err := (&publish.Reconciler{Client: mgr.GetClient(), Mapper: mgr.GetRESTMapper(), Store: store, Sync: engine, Log: log.WithName("publish")}).SetupWithManager(ctx, mgr); err != nil {
		return err
	}
	brokerStream := stream.New(stream.Options{
		BrokerAddress:     opts.BrokerAddress,
		TLS:               completed.TLS,
		AgentName:         opts.AgentName,
		HeartbeatInterval: opts.HeartbeatInterval,
		MaxMessageBytes:   opts.MaxMessageBytes,
		Backoff:           &backoff.Exponential{Initial: opts.BackoffInitial, Max: opts.BackoffMax},
		StableAfter:       30 * time.Second,
		Handler:           session.NewHandler(store, engine, pending),
		Log:               log,
	})

	// The broker link and the sync engine run only on the elected leader,
	// like the controllers: a standby replica neither connects nor writes.
	if err := mgr.Add(manager.RunnableFunc(brokerStream.Run)); err != nil {
		return err
	}
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error { return engine.Run(ctx, 4) })); err != nil {
		return err
	}
	go func() {
		<-mgr.Elected()
		log.Info("leading: connecting to the broker")
	}()
	err = mgr.Start(ctx)
	log.Info("stopped")
	return err
}

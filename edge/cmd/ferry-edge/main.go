// Command ferry-edge runs in a service cluster: it dials the ferry broker
// and keeps the link to it alive.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/discovery"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/ferry-dev/ferry/edge/client"
	"github.com/ferry-dev/ferry/pkg/backoff"
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
	fs := pflag.NewFlagSet("ferry-edge", pflag.ContinueOnError)
	opts.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	if err := opts.Validate(); err != nil {
		return err
	}
	completed, err := opts.Complete()
	if err != nil {
		return err
	}
	log := zap.New(zap.UseFlagOptions(&opts.Zap)).WithName("ferry-edge")
	ctrl.SetLogger(log)
	log.Info("starting", "version", version.String(), "broker", opts.BrokerAddress)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	// The service cluster is not used by the link yet; checking it at start
	// tells the operator early when the kubeconfig does not work.
	if dc, err := discovery.NewDiscoveryClientForConfig(completed.Service); err != nil {
		log.Error(err, "cannot build a client for the service cluster")
	} else if v, err := dc.ServerVersion(); err != nil {
		log.Error(err, "cannot reach the service cluster")
	} else {
		log.Info("service cluster reachable", "serverVersion", v.GitVersion)
	}

	c := client.New(client.Options{
		BrokerAddress:     opts.BrokerAddress,
		TLS:               completed.TLS,
		AgentName:         opts.AgentName,
		HeartbeatInterval: opts.HeartbeatInterval,
		MaxMessageBytes:   opts.MaxMessageBytes,
		Backoff:           &backoff.Exponential{Initial: opts.BackoffInitial, Max: opts.BackoffMax},
		StableAfter:       30 * time.Second,
		Log:               log,
	})
	err = c.Run(ctx)
	log.Info("stopped")
	return err
}

// Command ferry-edge runs in a service cluster: it dials the ferry broker
// and keeps the link to it alive.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"k8s.io/client-go/discovery"

	"github.com/ferry-dev/ferry/edge/client"
	"github.com/ferry-dev/ferry/pkg/backoff"
	"github.com/ferry-dev/ferry/pkg/cli"
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

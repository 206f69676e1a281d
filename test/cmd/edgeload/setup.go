package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strconv"
	"time"

	"k8s.io/client-go/rest"

	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/test/framework"
)

// exportName is the APIExport of simulated edge i: one edge per export, as
// the broker requires (its workspace: layout.exportWorkspace).
func exportName(i int) string { return exportOf(edgeName(i)) }

// exportOf is the APIExport of the simulated edge named edge.
func exportOf(edge string) string { return edge + ".edgeload.ferry.dev" }

// edgeName is simulated edge i's agent name, certificate name and, through
// its identity's last path segment, its name (finalizer) at the broker.
func edgeName(i int) string { return fmt.Sprintf("load-%05d", i) }

// createExports creates n APIExports in their workspaces (l), parallel at
// once. By default they share one workspace, while kcp creates a workspace
// far more slowly than an APIExport. What the broker pays per workspace is
// then paid once instead of n times: reading its revocations and its
// logical cluster, and the one watch of its endpoint slices that serves
// every export's engine and handshake (README, "Many edges"); --workspaces
// spreads them to measure the other case.
func createExports(ctx context.Context, cfg *rest.Config, l layout, n, parallel int) error {
	return forEach(ctx, n, parallel, func(i int) error {
		return framework.CreateAPIExport(ctx, cfg, l.exportWorkspace(i), exportName(i))
	})
}

// issueEdgeCertificates gives every simulated edge a client certificate of
// its own identity, signed by the development CA the broker trusts.
func issueEdgeCertificates(pkiDir string, n int) error {
	ca, err := devpki.LoadOrCreateCA(pkiDir, "ferry development CA")
	if err != nil {
		return err
	}
	for i := range n {
		if err := ca.IssueClient(pkiDir, edgeName(i), devpki.IdentityFor(edgeName(i))); err != nil {
			return fmt.Errorf("certificate of %s: %w", edgeName(i), err)
		}
	}
	return nil
}

// brokerConfig authorizes every simulated edge for its own APIExport, in
// its workspace.
func brokerConfig(l layout, n int) config.Config {
	c := config.Config{Admins: []string{devpki.IdentityFor("admin")}}
	for i := range n {
		c.Edges = append(c.Edges, config.Edge{
			Identity:  devpki.IdentityFor(edgeName(i)),
			APIExport: config.APIExportRef{Workspace: l.exportWorkspace(i).String(), Name: exportName(i)},
		})
	}
	return c
}

// startBroker starts ferry-broker with its pprof endpoint on a free
// loopback port (returned) and the extra flags.
func startBroker(ctx context.Context, bins framework.Binaries, dir, pkiDir, kubeconfig string, cfg config.Config, heartbeat time.Duration, extra []string) (*framework.Broker, string, error) {
	port, err := framework.FreePort()
	if err != nil {
		return nil, "", err
	}
	pprof := "127.0.0.1:" + strconv.Itoa(port)
	b, err := framework.StartBroker(ctx, bins, framework.BrokerOptions{
		Dir: dir, LogDir: filepath.Join(dir, "logs"), PKIDir: pkiDir, KCPKubeconfig: kubeconfig, Config: cfg,
		ExtraArgs: append([]string{"--pprof-bind-address", pprof, "--heartbeat-interval", heartbeat.String()}, extra...),
	})
	return b, pprof, err
}

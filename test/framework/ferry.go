package framework

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"sigs.k8s.io/yaml"

	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
)

// MakePKI runs `ferry-broker dev-certs` to create (or extend) a development
// PKI in dir with client certificates for clients.
func MakePKI(ctx context.Context, bins Binaries, dir string, clients ...string) error {
	args := []string{"dev-certs", "--dir", dir}
	for _, c := range clients {
		args = append(args, "--client", c)
	}
	out, err := exec.CommandContext(ctx, bins.Broker, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ferry-broker dev-certs: %w\n%s", err, out)
	}
	return nil
}

// BrokerOptions configure StartBroker.
type BrokerOptions struct {
	// Name prefixes the log file; default "broker".
	Name string
	// Dir holds the broker's configuration file.
	Dir string
	// LogDir receives the log.
	LogDir string
	// PKIDir holds ca.crt and broker.crt/key (MakePKI).
	PKIDir string
	// KCPKubeconfig is the broker's kcp credentials.
	KCPKubeconfig string
	// Config is written as the broker's configuration file.
	Config config.Config
	// Port to listen on; 0 picks a free one.
	Port int
	// ExtraArgs are appended to the command line.
	ExtraArgs []string
}

// Broker is a running ferry-broker.
type Broker struct {
	*Process
	Opts    BrokerOptions
	Address string
	bin     string
}

// StartBroker writes the configuration, starts ferry-broker and waits until
// its health service answers SERVING.
func StartBroker(ctx context.Context, bins Binaries, o BrokerOptions) (*Broker, error) {
	if o.Name == "" {
		o.Name = "broker"
	}
	if o.Port == 0 {
		p, err := FreePort()
		if err != nil {
			return nil, err
		}
		o.Port = p
	}
	data, err := yaml.Marshal(o.Config)
	if err != nil {
		return nil, err
	}
	cfgFile := o.configFile()
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(cfgFile, data, 0o600); err != nil {
		return nil, err
	}
	b := &Broker{Opts: o, Address: "127.0.0.1:" + strconv.Itoa(o.Port), bin: bins.Broker}
	obs, err := newObservability()
	if err != nil {
		return nil, err
	}
	args := append([]string{
		"--listen-address", b.Address,
		"--config", cfgFile,
		"--kcp-kubeconfig", o.KCPKubeconfig,
		"--tls-cert", devpki.CertFile(o.PKIDir, "broker"),
		"--tls-key", devpki.KeyFile(o.PKIDir, "broker"),
		"--client-ca", filepath.Join(o.PKIDir, devpki.CACertFile),
	}, append(obs.args(), o.ExtraArgs...)...)
	b.Process, err = StartProcess(o.Name, bins.Broker, args, nil, o.LogDir)
	if err != nil {
		return nil, err
	}
	obs.set(b.Process)
	if err := b.waitServing(ctx); err != nil {
		_ = b.Stop(10 * time.Second)
		return nil, err
	}
	return b, nil
}

// Restart stops the broker (SIGKILL when kill is true, else SIGTERM) and
// starts it again on the same address.
func (b *Broker) Restart(ctx context.Context, kill bool) error {
	if kill {
		b.Kill()
	} else if err := b.Stop(20 * time.Second); err != nil {
		return err
	}
	args := b.cmd.Args[1:]
	p, err := StartProcess(b.Opts.Name, b.bin, args, nil, b.Opts.LogDir)
	if err != nil {
		return err
	}
	p.MetricsAddress, p.HealthAddress = b.MetricsAddress, b.HealthAddress
	b.Process = p
	return b.waitServing(ctx)
}

// Reconfigure stops the broker with SIGTERM, rewrites its configuration file
// with cfg and starts it again on the same address.
func (b *Broker) Reconfigure(ctx context.Context, cfg config.Config) error {
	if err := b.Stop(20 * time.Second); err != nil {
		return err
	}
	data, err := yaml.Marshal(cfg)
	if err != nil {
		return err
	}
	if err := os.WriteFile(b.Opts.configFile(), data, 0o600); err != nil {
		return err
	}
	b.Opts.Config = cfg
	return b.Restart(ctx, false)
}

func (o BrokerOptions) configFile() string { return filepath.Join(o.Dir, o.Name+"-config.yaml") }

func (b *Broker) waitServing(ctx context.Context) error {
	conn, err := DialBroker(b.Address, b.Opts.PKIDir, "admin")
	if err != nil {
		return err
	}
	defer conn.Close()
	health := healthpb.NewHealthClient(conn)
	err = Eventually(ctx, time.Minute, 100*time.Millisecond, func(ctx context.Context) (bool, string) {
		select {
		case <-b.Exited():
			return false, fmt.Sprintf("ferry-broker exited: %v", b.ExitErr())
		default:
		}
		resp, err := health.Check(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			return false, err.Error()
		}
		if resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			return false, "health is " + resp.GetStatus().String()
		}
		return true, ""
	})
	if err != nil {
		return fmt.Errorf("ferry-broker not serving (log %s): %w", b.LogFile, err)
	}
	return nil
}

// DialBroker returns a client connection to the broker authenticated with
// the client certificate called client in pkiDir.
func DialBroker(address, pkiDir, client string) (*grpc.ClientConn, error) {
	tlsCfg, err := tlsconfig.Client(tlsconfig.Files{
		CertFile: devpki.CertFile(pkiDir, client),
		KeyFile:  devpki.KeyFile(pkiDir, client),
		CAFile:   filepath.Join(pkiDir, devpki.CACertFile),
	}, "", tlsconfig.Profile{})
	if err != nil {
		return nil, err
	}
	cfg, err := tlsCfg.Config()
	if err != nil {
		return nil, err
	}
	return grpc.NewClient(address, grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
}

// EdgeOptions configure StartEdge.
type EdgeOptions struct {
	// Name is the log file name and the agent name.
	Name string
	// LogDir receives the log.
	LogDir string
	// BrokerAddress is host:port of the broker.
	BrokerAddress string
	// CAFile verifies the broker.
	CAFile string
	// CertFile and KeyFile are the edge's client certificate. With CAFile,
	// all empty: the edge enrols (its ExtraArgs give the token).
	CertFile, KeyFile string
	// Kubeconfig is the service cluster's.
	Kubeconfig string
	// NetNS, when set, is the network namespace the edge runs in: then
	// BrokerAddress and Kubeconfig must be reachable from inside it, and the
	// Process's metrics, health and admin addresses are forwards from the
	// host into it.
	NetNS *NetNS
	// ExtraArgs are appended to the command line.
	ExtraArgs []string
}

// EdgeOptionsFor fills the certificate paths for client from pkiDir.
func EdgeOptionsFor(pkiDir, client string) EdgeOptions {
	return EdgeOptions{
		CAFile:   filepath.Join(pkiDir, devpki.CACertFile),
		CertFile: devpki.CertFile(pkiDir, client),
		KeyFile:  devpki.KeyFile(pkiDir, client),
	}
}

// StartEdge starts ferry-edge. It does not wait for the connection: tests
// observe it at the broker.
func StartEdge(bins Binaries, o EdgeOptions) (*Process, error) {
	obs, err := newObservability()
	if err != nil {
		return nil, err
	}
	// The admin API's default port would collide between edges too.
	adminPort, err := FreePort()
	if err != nil {
		return nil, err
	}
	adminAddr := "127.0.0.1:" + strconv.Itoa(adminPort)
	for i, a := range o.ExtraArgs {
		// The caller's choice wins (the last flag counts).
		if a == "--admin-bind-address" && i+1 < len(o.ExtraArgs) {
			adminAddr = o.ExtraArgs[i+1]
		} else if v, ok := strings.CutPrefix(a, "--admin-bind-address="); ok {
			adminAddr = v
		}
	}
	args := []string{
		"--broker-address", o.BrokerAddress,
		"--admin-bind-address", adminAddr,
		"--agent-name", o.Name,
		"--kubeconfig", o.Kubeconfig,
	}
	if o.CertFile != "" || o.KeyFile != "" || o.CAFile != "" {
		args = append(args, "--broker-ca", o.CAFile, "--tls-cert", o.CertFile, "--tls-key", o.KeyFile)
	}
	args = append(args, append(obs.args(), o.ExtraArgs...)...)
	// As the Deployment in deploy/ does (POD_NAME from the downward API):
	// the leader election identity is the instance's name, so an edge
	// started again under its name takes its Lease back at once.
	start := StartProcess
	if o.NetNS != nil {
		start = o.NetNS.StartProcess
	}
	p, err := start(o.Name, bins.Edge, args, []string{"POD_NAME=" + o.Name}, o.LogDir)
	if err != nil {
		return nil, err
	}
	obs.set(p)
	p.AdminAddress = adminAddr
	if o.NetNS != nil {
		// The listeners are on the namespace's loopback: the test reaches
		// them through forwards.
		for _, addr := range []*string{&p.MetricsAddress, &p.HealthAddress, &p.AdminAddress} {
			if *addr, err = o.NetNS.Forward(*addr); err != nil {
				_ = p.Stop(10 * time.Second)
				return nil, err
			}
		}
	}
	return p, nil
}

// observability holds free loopback addresses for a ferry process's
// metrics and health listeners: several brokers and edges run on one
// machine, and the defaults would collide.
type observability struct{ metrics, health string }

func newObservability() (observability, error) {
	var o observability
	for _, addr := range []*string{&o.metrics, &o.health} {
		port, err := FreePort()
		if err != nil {
			return o, err
		}
		*addr = "127.0.0.1:" + strconv.Itoa(port)
	}
	return o, nil
}

func (o observability) args() []string {
	return []string{"--metrics-bind-address", o.metrics, "--health-probe-bind-address", o.health}
}

func (o observability) set(p *Process) { p.MetricsAddress, p.HealthAddress = o.metrics, o.health }

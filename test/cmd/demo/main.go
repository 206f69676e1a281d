// Command demo runs ferry on loopback with everything it needs: kcp, a
// service cluster (kube-apiserver + etcd), a development PKI, an APIExport in
// root:demo-provider, ferry-broker and ferry-edge. It writes DIR/env and
// runs until Ctrl-C or SIGTERM, then stops every process it started.
// Start it with `make demo`.
//
// It restarts ferry-broker and ferry-edge when they die, as a kubelet would
// (supervise.go), so that one can kill them and watch them catch up; kcp,
// etcd and kube-apiserver are fail-stop: when one exits, the demo stops.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	kcpclient "github.com/ferry-dev/ferry/broker/kcp"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/test/framework"
)

const (
	providerWorkspace = "demo-provider"
	consumerWorkspace = "demo-consumer"
	exportName        = "demo.ferry.dev"
	examples          = "deploy/examples"
)

func main() {
	// Stop everything also when the parent (make, a shell) is killed
	// without signalling the demo itself.
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(syscall.SIGTERM), 0, 0, 0); err != nil {
		fmt.Fprintf(os.Stderr, "demo: cannot set parent-death signal: %v\n", err)
	}
	dir := flag.String("dir", "_demo", "Directory for the demo's state, logs and env file (wiped at start).")
	flag.Parse()
	if err := run(*dir); err != nil {
		fmt.Fprintf(os.Stderr, "demo: %v\n", err)
		os.Exit(1)
	}
}

// stack stops what was started, newest first.
type stack []func() error

func (s *stack) push(f func() error) { *s = append(*s, f) }

func (s stack) stopAll() error {
	var errs []error
	for i := len(s) - 1; i >= 0; i-- {
		errs = append(errs, s[i]())
	}
	return errors.Join(errs...)
}

func run(dir string) (err error) {
	dir, err = filepath.Abs(dir)
	if err != nil {
		return err
	}
	bins, err := framework.BinariesFromEnv()
	if err != nil {
		return err
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	logDir := filepath.Join(dir, "logs")
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	var started stack
	defer func() {
		fmt.Println("stopping everything...")
		if serr := started.stopAll(); serr != nil {
			fmt.Fprintf(os.Stderr, "demo: while stopping: %v\n", serr)
		}
	}()

	step("starting kcp (about 30 s on a cold start)")
	kcp, err := framework.StartKCP(ctx, bins.KCP, filepath.Join(dir, "kcp"), logDir)
	if err != nil {
		return err
	}
	started.push(func() error { return kcp.Stop(30 * time.Second) })

	step("starting the service cluster (etcd + kube-apiserver)")
	svc, err := framework.StartServiceCluster(ctx, bins, "service", filepath.Join(dir, "service"), logDir)
	if err != nil {
		return err
	}
	started.push(svc.Stop)

	step("creating workspace root:" + providerWorkspace + " and APIExport " + exportName)
	provider, err := framework.CreateWorkspace(ctx, kcp.Config, "root", providerWorkspace)
	if err != nil {
		return err
	}
	if err := framework.CreateAPIExport(ctx, kcp.Config, provider, exportName); err != nil {
		return err
	}

	step("making a development PKI")
	pkiDir := filepath.Join(dir, "pki")
	if err := framework.MakePKI(ctx, bins, pkiDir, "edge", "admin"); err != nil {
		return err
	}

	step("starting ferry-broker")
	edgeIdentity := devpki.IdentityFor("edge")
	// Broker and edge share the host: their metrics, health and (edge)
	// admin listeners get explicit addresses instead of the flags'
	// defaults, the same on every restart.
	addrs, err := loopbackAddresses(ctx, 5)
	if err != nil {
		return err
	}
	brokerMetrics, brokerHealth, edgeMetrics, edgeHealth, edgeAdmin := addrs[0], addrs[1], addrs[2], addrs[3], addrs[4]
	broker, err := framework.StartBroker(ctx, bins, framework.BrokerOptions{
		Dir: dir, LogDir: logDir, PKIDir: pkiDir, KCPKubeconfig: kcp.Kubeconfig,
		Config: config.Config{
			Edges: []config.Edge{{
				Identity:  edgeIdentity,
				APIExport: config.APIExportRef{Workspace: provider.String(), Name: exportName},
			}},
			Admins: []string{devpki.IdentityFor("admin")},
		},
		ExtraArgs: []string{"--metrics-bind-address", brokerMetrics, "--health-probe-bind-address", brokerHealth},
	})
	if err != nil {
		return err
	}
	brokerOpts := broker.Opts // the same port and configuration on every restart
	brokerSup := newSupervisor("ferry-broker", func(ctx context.Context) (child, error) {
		b, err := framework.StartBroker(ctx, bins, brokerOpts)
		if err != nil {
			return nil, err
		}
		return b, nil
	}, os.Stdout)
	brokerSup.pidFile = filepath.Join(dir, "broker.pid")
	started.push(brokerSup.supervise(ctx, broker))
	fmt.Printf("    pid %d, serving at %s (restarted if it dies)\n", broker.Pid(), broker.Address)

	step("starting ferry-edge")
	edgeOpts := framework.EdgeOptionsFor(pkiDir, "edge")
	edgeOpts.Name, edgeOpts.LogDir, edgeOpts.BrokerAddress, edgeOpts.Kubeconfig = "edge", logDir, broker.Address, svc.Kubeconfig
	edgeOpts.ExtraArgs = []string{"--metrics-bind-address", edgeMetrics, "--health-probe-bind-address", edgeHealth, "--admin-bind-address", edgeAdmin}
	edge, err := framework.StartEdge(bins, edgeOpts)
	if err != nil {
		return err
	}
	edgeSup := newSupervisor("ferry-edge", func(context.Context) (child, error) {
		e, err := framework.StartEdge(bins, edgeOpts)
		if err != nil {
			return nil, err
		}
		return e, nil
	}, os.Stdout)
	edgeSup.pidFile = filepath.Join(dir, "edge.pid")
	started.push(edgeSup.supervise(ctx, edge))
	fmt.Printf("    pid %d (restarted if it dies)\n", edge.Pid())

	conn, err := framework.DialBroker(broker.Address, pkiDir, "admin")
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := framework.WaitEdgeState(ctx, conn, edgeIdentity, ferryv1.EdgeState_EDGE_STATE_CONNECTED, time.Minute); err != nil {
		return fmt.Errorf("edge did not connect (logs in %s): %w", logDir, err)
	}

	step("publishing the sample Database CRD (" + examples + ")")
	for _, f := range []string{"database-crd.yaml", "database-publishedresource.yaml"} {
		if err := framework.ApplyFile(ctx, svc.Config, filepath.Join(examples, f)); err != nil {
			return err
		}
	}
	pr, err := framework.WaitPublishedCondition(ctx, svc.Config, "databases", metav1.ConditionTrue, "", time.Minute)
	if err != nil {
		return fmt.Errorf("%w (logs in %s)", err, logDir)
	}
	fmt.Printf("    published as %s (schema %s)\n", pr.Status.ServedResource, pr.Status.ResourceSchemaName)

	step("starting the demo's Database controller in the service cluster (writes each Database's connection Secret)")
	if err := runDatabaseController(ctx, svc.Config); err != nil {
		return err
	}

	step("binding the APIExport in workspace root:" + consumerWorkspace)
	consumer, err := framework.CreateWorkspace(ctx, kcp.Config, "root", consumerWorkspace)
	if err != nil {
		return err
	}
	if err := framework.BindAPIExport(ctx, kcp.Config, consumer, provider, exportName); err != nil {
		return err
	}

	kcpBase, err := kcpclient.BaseHost(kcp.Config.Host)
	if err != nil {
		return err
	}

	step("creating ManagedDatabase default/orders in root:" + consumerWorkspace)
	consumerCfg := rest.CopyConfig(kcp.Config)
	consumerCfg.Host = kcpBase + "/clusters/" + consumer.String()
	objectFile, err := filepath.Abs(filepath.Join(examples, "database-object.yaml"))
	if err != nil {
		return err
	}
	if err := framework.ApplyFile(ctx, consumerCfg, objectFile); err != nil {
		return err
	}
	local, err := waitLocalDatabase(ctx, svc.Config)
	if err != nil {
		return fmt.Errorf("%w (logs in %s)", err, logDir)
	}
	fmt.Printf("    synced to the service cluster as Database %s/%s\n", local.GetNamespace(), local.GetName())
	if err := waitConnectionSecret(ctx, consumerCfg); err != nil {
		return fmt.Errorf("%w (logs in %s)", err, logDir)
	}
	fmt.Println("    its connection Secret default/orders-connection is in root:" + consumerWorkspace)
	envFile := filepath.Join(dir, "env")
	env := fmt.Sprintf(`export KCP_KUBECONFIG=%q
export SERVICE_KUBECONFIG=%q
export BROKER_ADDR=%q
export FERRY_CA=%q
export FERRY_EDGE_CERT=%q
export FERRY_EDGE_KEY=%q
export FERRY_ADMIN_CERT=%q
export FERRY_ADMIN_KEY=%q
export GRPCURL=%q
export KCP_SERVER=%q
export BROKER_PIDFILE=%q
export EDGE_PIDFILE=%q
export BROKER_METRICS_ADDR=%q
export BROKER_HEALTH_ADDR=%q
export EDGE_METRICS_ADDR=%q
export EDGE_HEALTH_ADDR=%q
export EDGE_ADMIN_ADDR=%q
# the admin API recipes' object (README): default/orders and its local copy
export EDGE_IDENTITY=%q
export OBJ_WORKSPACE=%q
export OBJ_RESOURCE=manageddatabases
export OBJ_NAMESPACE=default
export OBJ_NAME=orders
export OBJ_CLUSTER=%q
export LOCAL_NAMESPACE=%q
export LOCAL_NAME=%q
`, kcp.Kubeconfig, svc.Kubeconfig, broker.Address,
		filepath.Join(pkiDir, devpki.CACertFile),
		devpki.CertFile(pkiDir, "edge"), devpki.KeyFile(pkiDir, "edge"),
		devpki.CertFile(pkiDir, "admin"), devpki.KeyFile(pkiDir, "admin"),
		bins.Grpcurl, kcpBase, brokerSup.pidFile, edgeSup.pidFile, brokerMetrics, brokerHealth, edgeMetrics, edgeHealth, edgeAdmin,
		edgeIdentity, consumer.String(), local.GetLabels()[naming.LabelRemoteCluster], local.GetNamespace(), local.GetName())
	if err := os.WriteFile(envFile, []byte(env), 0o644); err != nil {
		return err
	}
	fmt.Printf(`
ferry demo is running: the sample CRD is published, bound in root:%[4]s, and default/orders is synced.

In another shell:
  source %[1]s

  # health and services, with the edge's client certificate
  $GRPCURL -cacert $FERRY_CA -cert $FERRY_EDGE_CERT -key $FERRY_EDGE_KEY $BROKER_ADDR grpc.health.v1.Health/Check
  $GRPCURL -cacert $FERRY_CA -cert $FERRY_EDGE_CERT -key $FERRY_EDGE_KEY $BROKER_ADDR list

  # the broker's view of its edges, with the admin certificate
  $GRPCURL -cacert $FERRY_CA -cert $FERRY_ADMIN_CERT -key $FERRY_ADMIN_KEY $BROKER_ADDR ferry.v1alpha1.AdminService/ListEdges

  # metrics, and readiness with each check, of the broker and of the edge
  curl -s http://$BROKER_METRICS_ADDR/metrics | grep ^ferry_
  curl -s "http://$BROKER_HEALTH_ADDR/readyz?verbose"
  curl -s http://$EDGE_METRICS_ADDR/metrics | grep ^ferry_
  curl -s "http://$EDGE_HEALTH_ADDR/readyz?verbose"

  # the edge's own read-only admin API (plaintext, loopback only)
  $GRPCURL -plaintext $EDGE_ADMIN_ADDR describe ferry.v1alpha1.EdgeAdminService

  # the service cluster: the sample CRD and its PublishedResource
  kubectl --kubeconfig $SERVICE_KUBECONFIG get publishedresources

  # kcp: the APIExport and its schema, and the projected kind in the consumer workspace
  kubectl --kubeconfig $KCP_KUBECONFIG --server $KCP_SERVER/clusters/root:%[2]s get apiexports,apiresourceschemas
  kubectl --kubeconfig $KCP_KUBECONFIG --server $KCP_SERVER/clusters/root:%[4]s api-resources --api-group %[5]s

  # the synced object: in kcp, and its copy in the service cluster
  kubectl --kubeconfig $KCP_KUBECONFIG --server $KCP_SERVER/clusters/root:%[4]s get manageddatabases -n default
  kubectl --kubeconfig $SERVICE_KUBECONFIG get databases -A --show-labels

  # the related Secret: written by the demo's controller in the service cluster, copied into the workspace
  kubectl --kubeconfig $SERVICE_KUBECONFIG get secret -n %[6]s orders-connection
  kubectl --kubeconfig $KCP_KUBECONFIG --server $KCP_SERVER/clusters/root:%[4]s get secret orders-connection -n default -o jsonpath='{.data.host}' | base64 -d

  # play the service's controller: set the local status, and watch it appear in kcp
  kubectl --kubeconfig $SERVICE_KUBECONFIG patch database -n %[6]s %[7]s --subresource=status --type=merge \
    -p '{"status":{"phase":"Ready","endpoint":"orders.db.example.com:5432"}}'
  kubectl --kubeconfig $KCP_KUBECONFIG --server $KCP_SERVER/clusters/root:%[4]s get manageddatabase orders -n default -o jsonpath='{.status}'

  # break it: ferry-broker (pid %[9]d) and ferry-edge (pid %[10]d) are restarted %[11]s after they die (later if they
  # keep crashing), with a line here; kcp, etcd and kube-apiserver are not (when one dies, the demo stops).
  # Kill the edge and create an object in kcp while it is down; it arrives once the edge is back:
  kill -9 $(cat $EDGE_PIDFILE); sed 's/orders/payments/g' %[8]s | kubectl --kubeconfig $KCP_KUBECONFIG --server $KCP_SERVER/clusters/root:%[4]s create -f -
  kubectl --kubeconfig $SERVICE_KUBECONFIG get databases -A -o custom-columns='NAMESPACE:.metadata.namespace,NAME:.metadata.name,KCP NAME:.metadata.annotations.ferry\.dev/remote-name'
  kubectl --kubeconfig $KCP_KUBECONFIG --server $KCP_SERVER/clusters/root:%[4]s get secret payments-connection -n default
  # the same with the broker:
  kill -9 $(cat $BROKER_PIDFILE); sed 's/orders/invoices/g' %[8]s | kubectl --kubeconfig $KCP_KUBECONFIG --server $KCP_SERVER/clusters/root:%[4]s create -f -
  kubectl --kubeconfig $SERVICE_KUBECONFIG get databases -A -o custom-columns='NAMESPACE:.metadata.namespace,NAME:.metadata.name,KCP NAME:.metadata.annotations.ferry\.dev/remote-name'

Logs: %[3]s (a restarted process appends to its log)
Press Ctrl-C to stop.
`, envFile, providerWorkspace, logDir, consumerWorkspace, exportName, local.GetNamespace(), local.GetName(),
		objectFile, brokerSup.Pid(), edgeSup.Pid(), edgeSup.initialDelay)

	// The ferry processes are supervised; the servers are fail-stop.
	select {
	case <-ctx.Done():
	case <-kcp.Exited():
		return fmt.Errorf("kcp exited: %v (log %s)", kcp.ExitErr(), kcp.LogFile)
	case <-svc.Etcd.Exited():
		return fmt.Errorf("etcd exited: %v (log %s)", svc.Etcd.ExitErr(), svc.Etcd.LogFile)
	case <-svc.APIServer.Exited():
		return fmt.Errorf("kube-apiserver exited: %v (log %s)", svc.APIServer.ExitErr(), svc.APIServer.LogFile)
	}
	return nil
}

func step(msg string) { fmt.Println("==> " + msg) }

// loopbackAddresses returns n distinct free host:port addresses on
// 127.0.0.1 (all held open until all are chosen).
func loopbackAddresses(ctx context.Context, n int) ([]string, error) {
	addrs := make([]string, 0, n)
	for range n {
		l, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		addrs = append(addrs, l.Addr().String())
	}
	return addrs, nil
}

// waitLocalDatabase waits for the local copy of root:demo-consumer's
// default/orders (found by the labels the edge puts on copies).
func waitLocalDatabase(ctx context.Context, cfg *rest.Config) (*unstructured.Unstructured, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	gvr := schema.GroupVersionResource{Group: "demo.example.com", Version: "v1", Resource: "databases"}
	var found *unstructured.Unstructured
	err = framework.Eventually(ctx, time.Minute, 200*time.Millisecond, func(ctx context.Context) (bool, string) {
		list, err := dyn.Resource(gvr).List(ctx, metav1.ListOptions{LabelSelector: naming.LabelNameHash + "=" + naming.Hash("orders")})
		if err != nil {
			return false, err.Error()
		}
		if len(list.Items) == 0 {
			return false, "no local copy of orders yet"
		}
		found = &list.Items[0]
		return true, ""
	})
	return found, err
}

// waitConnectionSecret waits for the related Secret of default/orders in
// the consumer workspace.
func waitConnectionSecret(ctx context.Context, cfg *rest.Config) error {
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	return framework.Eventually(ctx, time.Minute, 200*time.Millisecond, func(ctx context.Context) (bool, string) {
		_, err := kube.CoreV1().Secrets("default").Get(ctx, "orders-connection", metav1.GetOptions{})
		if err != nil {
			return false, "connection Secret in kcp: " + err.Error()
		}
		return true, ""
	})
}

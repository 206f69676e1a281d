package framework

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/ferry-dev/ferry/pkg/devpki"
)

// ServiceCluster is a Kubernetes API server (kube-apiserver on etcd) that
// plays the service cluster.
type ServiceCluster struct {
	Etcd      *Process
	APIServer *Process
	// Kubeconfig authenticates as a cluster admin, for processes in the
	// cluster's network (its network namespace, when it has one).
	Kubeconfig string
	// Config authenticates as a cluster admin, for the test process (through
	// a forward into the cluster's network namespace, when it has one).
	Config *rest.Config
}

// StartServiceCluster starts etcd and kube-apiserver with their state in dir
// and waits until the API server is ready. name prefixes the log files.
func StartServiceCluster(ctx context.Context, bins Binaries, name, dir, logDir string) (*ServiceCluster, error) {
	return StartServiceClusterIn(ctx, nil, bins, name, dir, logDir)
}

// StartServiceClusterIn is StartServiceCluster with etcd and kube-apiserver
// inside the network namespace ns (on its loopback) when ns is not nil; the
// test's Config then reaches the API server through ns.Forward.
func StartServiceClusterIn(ctx context.Context, ns *NetNS, bins Binaries, name, dir, logDir string) (*ServiceCluster, error) {
	start := StartProcess
	if ns != nil {
		start = ns.StartProcess
	}
	pkiDir := filepath.Join(dir, "pki")
	ca, err := devpki.LoadOrCreateCA(pkiDir, name+" service cluster CA")
	if err != nil {
		return nil, err
	}
	if err := ca.IssueServer(pkiDir, "apiserver", []string{"127.0.0.1", "localhost"}); err != nil {
		return nil, err
	}
	saKey := filepath.Join(pkiDir, "service-account.key")
	if err := writeECKey(saKey); err != nil {
		return nil, err
	}
	token, err := randomHex(16)
	if err != nil {
		return nil, err
	}
	tokenFile := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(token+`,admin,admin,"system:masters"`+"\n"), 0o600); err != nil {
		return nil, err
	}

	var ports [3]int
	for i := range ports {
		if ports[i], err = FreePort(); err != nil {
			return nil, err
		}
	}
	etcdClient := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	etcdPeer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	etcd, err := start(name+"-etcd", bins.Etcd, []string{
		"--name", "default",
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdClient, "--advertise-client-urls", etcdClient,
		"--listen-peer-urls", etcdPeer, "--initial-advertise-peer-urls", etcdPeer,
		"--initial-cluster", "default=" + etcdPeer,
		"--unsafe-no-fsync",
	}, nil, logDir)
	if err != nil {
		return nil, err
	}
	apiPort := strconv.Itoa(ports[2])
	api, err := start(name+"-kube-apiserver", bins.KubeAPIServer, []string{
		"--etcd-servers", etcdClient,
		"--bind-address", "127.0.0.1",
		"--advertise-address", "127.0.0.1",
		"--secure-port", apiPort,
		"--tls-cert-file", devpki.CertFile(pkiDir, "apiserver"),
		"--tls-private-key-file", devpki.KeyFile(pkiDir, "apiserver"),
		"--token-auth-file", tokenFile,
		"--authorization-mode", "RBAC",
		"--service-account-issuer", "https://127.0.0.1:" + apiPort,
		"--service-account-key-file", saKey,
		"--service-account-signing-key-file", saKey,
		"--service-cluster-ip-range", "10.0.0.0/24",
		"--disable-admission-plugins", "ServiceAccount",
		"--allow-privileged",
	}, nil, logDir)
	if err != nil {
		_ = etcd.Stop(10 * time.Second)
		return nil, err
	}
	sc := &ServiceCluster{Etcd: etcd, APIServer: api, Kubeconfig: filepath.Join(dir, "admin.kubeconfig")}

	caPEM, err := os.ReadFile(filepath.Join(pkiDir, devpki.CACertFile))
	if err != nil {
		sc.Stop()
		return nil, err
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["service"] = &clientcmdapi.Cluster{Server: "https://127.0.0.1:" + apiPort, CertificateAuthorityData: caPEM}
	kc.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: token}
	kc.Contexts["service"] = &clientcmdapi.Context{Cluster: "service", AuthInfo: "admin"}
	kc.CurrentContext = "service"
	if err := clientcmd.WriteToFile(*kc, sc.Kubeconfig); err != nil {
		sc.Stop()
		return nil, err
	}
	if sc.Config, err = clientcmd.BuildConfigFromFlags("", sc.Kubeconfig); err != nil {
		sc.Stop()
		return nil, err
	}
	sc.Config.QPS, sc.Config.Burst = 100, 200 // tests create objects in bulk
	if ns != nil {
		fwd, err := ns.Forward("127.0.0.1:" + apiPort)
		if err != nil {
			sc.Stop()
			return nil, err
		}
		// The serving certificate is for 127.0.0.1, which the forward's
		// host address is too.
		sc.Config.Host = "https://" + fwd
	}
	if err := sc.waitReady(ctx); err != nil {
		sc.Stop()
		return nil, err
	}
	// The edge's leader election Lease lives here (deploy/edge/edge.yaml
	// creates it in a real cluster).
	kube, err := kubernetes.NewForConfig(sc.Config)
	if err != nil {
		sc.Stop()
		return nil, err
	}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ferry-system"}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		sc.Stop()
		return nil, err
	}
	return sc, nil
}

// waitReady waits until kube-apiserver answers /readyz, failing early when
// it or etcd exits.
func (sc *ServiceCluster) waitReady(ctx context.Context) error {
	err := Eventually(ctx, 2*time.Minute, 250*time.Millisecond, func(ctx context.Context) (bool, string) {
		for _, p := range []*Process{sc.Etcd, sc.APIServer} {
			select {
			case <-p.Exited():
				return false, fmt.Sprintf("%s exited: %v (log %s)", p.Name, p.ExitErr(), p.LogFile)
			default:
			}
		}
		return readyz(ctx, sc.Config)
	})
	if err != nil {
		return fmt.Errorf("service cluster did not become ready (logs %s, %s): %w", sc.APIServer.LogFile, sc.Etcd.LogFile, err)
	}
	return nil
}

// StopAPIServer stops only kube-apiserver (SIGTERM), as in an API server
// outage; etcd keeps running with all state.
func (sc *ServiceCluster) StopAPIServer() error {
	return sc.APIServer.Stop(20 * time.Second)
}

// StartAPIServer starts kube-apiserver again after StopAPIServer, with the
// same command line (so the same port and network namespace: kubeconfigs
// stay valid) and log file, and waits until it is ready.
func (sc *ServiceCluster) StartAPIServer(ctx context.Context) error {
	old := sc.APIServer
	select {
	case <-old.Exited():
	default:
		return fmt.Errorf("%s is still running", old.Name)
	}
	p, err := StartProcess(old.Name, old.cmd.Path, old.cmd.Args[1:], nil, filepath.Dir(old.LogFile))
	if err != nil {
		return err
	}
	sc.APIServer = p
	return sc.waitReady(ctx)
}

// Stop stops kube-apiserver before etcd (the other order leaves
// kube-apiserver hanging on its storage).
func (sc *ServiceCluster) Stop() error {
	return errors.Join(sc.APIServer.Stop(20*time.Second), sc.Etcd.Stop(10*time.Second))
}

func writeECKey(path string) error {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), 0o600)
}

func randomHex(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

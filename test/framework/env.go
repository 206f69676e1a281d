package framework

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// Binaries are the executables the framework runs.
type Binaries struct {
	KCP, KubeAPIServer, Etcd, Broker, Edge, Grpcurl string
	// DirectCopy is the bench's baseline (test/cmd/directcopy); only the
	// bench needs it.
	DirectCopy string
	// Demo is make demo's program (test/cmd/demo); only its e2e test
	// needs it.
	Demo string
	// ConnectProxy is the tests' HTTP CONNECT proxy
	// (test/cmd/connect-proxy); only the proxy tests need it.
	ConnectProxy string
}

// BinariesFromEnv reads the binary locations the Makefile exports and checks
// that each exists.
func BinariesFromEnv() (Binaries, error) {
	binDir := os.Getenv("FERRY_BIN_DIR")
	b := Binaries{
		KCP:           os.Getenv("FERRY_KCP_BIN"),
		KubeAPIServer: os.Getenv("FERRY_KUBE_APISERVER_BIN"),
		Etcd:          os.Getenv("FERRY_ETCD_BIN"),
		Grpcurl:       os.Getenv("FERRY_GRPCURL_BIN"),
	}
	if binDir != "" {
		b.Broker = filepath.Join(binDir, "ferry-broker")
		b.Edge = filepath.Join(binDir, "ferry-edge")
		b.DirectCopy = filepath.Join(binDir, "ferry-directcopy")
		b.Demo = filepath.Join(binDir, "ferry-demo")
		b.ConnectProxy = filepath.Join(binDir, "ferry-connect-proxy")
	}
	for name, path := range map[string]string{
		"FERRY_KCP_BIN": b.KCP, "FERRY_KUBE_APISERVER_BIN": b.KubeAPIServer, "FERRY_ETCD_BIN": b.Etcd,
		"FERRY_BIN_DIR (ferry-broker)": b.Broker, "FERRY_BIN_DIR (ferry-edge)": b.Edge,
	} {
		if path == "" {
			return b, fmt.Errorf("%s is not set: run the tests through make (make test-e2e), which builds and exports it", name)
		}
		if _, err := os.Stat(path); err != nil {
			return b, fmt.Errorf("%s: %w (make tools build-race builds it)", name, err)
		}
	}
	return b, nil
}

// FreePort asks the kernel for a free TCP port on 127.0.0.1.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

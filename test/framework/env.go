package framework

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
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

// Ports for servers the tests start are picked below Linux's default
// ephemeral range (32768-60999): a port the kernel hands out for a
// listener on port 0 comes from that range, and between FreePort closing
// it and the server binding it, any outgoing connection of the busy suite
// may take it as its source port ("address already in use").
const (
	serverPortLow  = 20000
	serverPortHigh = 32768
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago,
// outside the ephemeral range so outgoing connections do not take it.
func FreePort() (int, error) {
	for range 100 {
		port := serverPortLow + rand.IntN(serverPortHigh-serverPortLow)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err != nil {
			continue // in use: another
		}
		_ = l.Close()
		return port, nil
	}
	return 0, errors.New("no free TCP port on 127.0.0.1 between 20000 and 32767")
}

// Package framework starts the real servers ferry is tested against and
// ferry's own binaries as processes: kcp, a service cluster made of etcd and
// kube-apiserver, ferry-broker and ferry-edge. Both the e2e tests and
// `make demo` use it.
//
// Binaries are found through environment variables that the Makefile
// exports (FERRY_KCP_BIN, FERRY_KUBE_APISERVER_BIN, FERRY_ETCD_BIN,
// FERRY_BIN_DIR, FERRY_GRPCURL_BIN); run tests through make, or export them.
//
// Every process runs in its own process group with a parent-death signal,
// so none outlives the test binary, even when it is killed by a timeout.
package framework

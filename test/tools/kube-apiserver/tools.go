//go:build tools

// Package tools pins the kube-apiserver binary built for ferry's tests.
package tools

import _ "k8s.io/kubernetes/cmd/kube-apiserver"

//go:build tools

// Package tools pins the kcp server binary built for ferry's tests.
package tools

import _ "github.com/kcp-dev/kcp/cmd/kcp"

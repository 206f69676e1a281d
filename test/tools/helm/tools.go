//go:build tools

// Package tools pins the Helm binary that ferry's chart tests run.
package tools

import _ "helm.sh/helm/v3/cmd/helm"

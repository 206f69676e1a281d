package framework

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// Helm runs the helm binary that make tools builds (FERRY_HELM_BIN), with
// its cache, configuration and data kept in a directory of its own: never
// the user's, and no repository or plugin is ever consulted.
type Helm struct {
	Bin string
	// Home holds HELM_CACHE_HOME, HELM_CONFIG_HOME and HELM_DATA_HOME.
	Home string
}

// HelmFromEnv finds helm through FERRY_HELM_BIN; home is a scratch
// directory for its state.
func HelmFromEnv(home string) (*Helm, error) {
	bin := os.Getenv("FERRY_HELM_BIN")
	if bin == "" {
		return nil, fmt.Errorf("FERRY_HELM_BIN is not set: run the tests through make (make test-e2e), which builds helm and exports it")
	}
	if _, err := os.Stat(bin); err != nil {
		return nil, fmt.Errorf("FERRY_HELM_BIN: %w (make tools builds it)", err)
	}
	return &Helm{Bin: bin, Home: home}, nil
}

// Run runs helm with args and returns its standard output; an error carries
// standard error.
func (h *Helm) Run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, h.Bin, args...)
	cmd.Env = append(os.Environ(),
		"HELM_CACHE_HOME="+filepath.Join(h.Home, "cache"),
		"HELM_CONFIG_HOME="+filepath.Join(h.Home, "config"),
		"HELM_DATA_HOME="+filepath.Join(h.Home, "data"),
		"KUBECONFIG="+filepath.Join(h.Home, "no-kubeconfig"),
	)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("helm %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()+"\n"+stdout.String()))
	}
	return stdout.String(), nil
}

// Template renders chart as release in namespace with the given extra
// arguments (--set, -f, ...) and decodes the manifests.
func (h *Helm) Template(ctx context.Context, chart, release, namespace string, args ...string) ([]*unstructured.Unstructured, error) {
	out, err := h.Run(ctx, append([]string{"template", release, chart, "--namespace", namespace}, args...)...)
	if err != nil {
		return nil, err
	}
	objs, err := DecodeYAML(strings.NewReader(out))
	if err != nil {
		return nil, fmt.Errorf("helm template %s: the output is not YAML: %w", chart, err)
	}
	return objs, nil
}

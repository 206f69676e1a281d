package cli

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
)

// reachableTimeout bounds one reachability probe: kubelet's probe has its
// own timeout (1 s by default, the charts use more) and must get an answer.
const reachableTimeout = 3 * time.Second

// APIServerReachable returns a health check that passes while the API
// server of cfg answers HTTP at all: any response, even 401 or 403, proves
// it is reachable, and readiness must not depend on what the credentials
// may read. what names the server in the failure ("kcp").
func APIServerReachable(cfg *rest.Config, what string) (func(*http.Request) error, error) {
	probe := rest.CopyConfig(cfg)
	// Probes must not queue behind the program's own requests in the shared
	// token bucket (ShareRateLimit).
	probe.RateLimiter = nil
	dc, err := discovery.NewDiscoveryClientForConfig(probe)
	if err != nil {
		return nil, fmt.Errorf("building the %s reachability check: %w", what, err)
	}
	return func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), reachableTimeout)
		defer cancel()
		err := dc.RESTClient().Get().AbsPath("/version").Do(ctx).Error()
		var status apierrors.APIStatus
		if err == nil || (errors.As(err, &status) && status.Status().Code < http.StatusInternalServerError) {
			return nil
		}
		return fmt.Errorf("%s is not reachable: %w", what, err)
	}, nil
}

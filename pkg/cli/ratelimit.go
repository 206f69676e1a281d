package cli

import (
	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/flowcontrol"
)

// Default client rate limits. A safety net against a runaway loop, not a
// throttle: on the 2-core bench machine the direct copy (no limit at all)
// peaked at about 130 writes/s against kube-apiserver and 70/s against
// kcp, and 50/s per client had capped ferry's edge exactly there (updates
// at 50 objects/s against the direct copy's 126). One budget per process,
// whatever the number of workspaces.
const (
	DefaultClientQPS   = 500
	DefaultClientBurst = 1000
)

// AddClientRateFlags registers --client-qps and --client-burst; target
// names the API server the process talks to.
func AddClientRateFlags(fs *pflag.FlagSet, qps *float32, burst *int, target string) {
	fs.Float32Var(qps, "client-qps", *qps, "Requests per second to "+target+", for the whole process (all workspaces share it). A safety net: the default is far above what the bench machine's API servers took.")
	fs.IntVar(burst, "client-burst", *burst, "Burst of requests to "+target+", for the whole process.")
}

// ShareRateLimit gives cfg one token bucket of qps and burst: every client
// built from cfg or a copy of it (rest.CopyConfig keeps the limiter) draws
// from it, so the process has one budget instead of one per client.
func ShareRateLimit(cfg *rest.Config, qps float32, burst int) {
	cfg.QPS, cfg.Burst = qps, burst
	cfg.RateLimiter = flowcontrol.NewTokenBucketRateLimiter(qps, burst)
}

package cli

import (
	"context"
	"net"
	"net/http"
	"net/http/pprof"

	"github.com/go-logr/logr"
	"github.com/spf13/pflag"
)

// AddProfilingFlag registers --pprof-bind-address.
func AddProfilingFlag(fs *pflag.FlagSet, addr *string) {
	fs.StringVar(addr, "pprof-bind-address", *addr, "Serve Go's pprof profiles under /debug/pprof/ on this host:port (e.g. 127.0.0.1:6060); off when empty. "+
		"Profiles show the program's internals: keep the address on loopback or otherwise private.")
}

// ServeProfiles serves Go's pprof handlers on addr until ctx ends. It
// listens before returning, so a bad or busy address stops the program at
// start with a message that names the flag; the returned address is the
// one listened on (port 0 picks one).
func ServeProfiles(ctx context.Context, addr string, log logr.Logger) (net.Addr, error) {
	// Its own mux: net/http/pprof's init registers on the default mux,
	// which nothing else of ferry's serves.
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return serveHTTP(ctx, "--pprof-bind-address", addr, mux, log, "serving pprof profiles")
}

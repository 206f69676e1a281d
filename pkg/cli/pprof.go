package cli

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

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
	lis, err := (&net.ListenConfig{}).Listen(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("cannot listen on --pprof-bind-address %s: %w", addr, err)
	}
	// Its own mux: net/http/pprof's init registers on the default mux,
	// which nothing else of ferry's serves.
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error(err, "pprof server stopped")
		}
	}()
	log.Info("serving pprof profiles", "address", lis.Addr().String())
	return lis.Addr(), nil
}

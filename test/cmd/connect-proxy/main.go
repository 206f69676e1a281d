// Command connect-proxy is a small HTTP CONNECT proxy for the end-to-end
// tests (see test/connectproxy): it logs each CONNECT with a running count,
// and answers GET /counts with its counters.
//
//	connect-proxy --listen 127.0.0.1:3128 --auth user:password \
//	  --allow broker.ferry.test:9443 --resolve broker.ferry.test=127.0.0.1
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/go-logr/logr/funcr"
	"github.com/spf13/pflag"

	"github.com/ferry-dev/ferry/test/connectproxy"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "connect-proxy: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := pflag.NewFlagSet("connect-proxy", pflag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:3128", "host:port to listen on.")
	var o connectproxy.Options
	fs.StringVar(&o.Auth, "auth", "", "user:password clients must send as Basic Proxy-Authorization; empty requires none.")
	fs.StringSliceVar(&o.Allow, "allow", nil, "host:port targets a CONNECT may name (comma-separated or repeated); empty allows all.")
	resolve := fs.StringSlice("resolve", nil, "NAME=HOST: dial HOST for targets whose host is NAME (comma-separated or repeated).")
	fs.DurationVar(&o.IdleTimeout, "idle-timeout", 0, "Close tunnels idle in both directions this long (0: never).")
	if err := fs.Parse(args); err != nil {
		return err
	}
	o.Resolve = map[string]string{}
	for _, r := range *resolve {
		name, host, ok := strings.Cut(r, "=")
		if !ok || name == "" || host == "" {
			return fmt.Errorf("--resolve %q: want NAME=HOST", r)
		}
		o.Resolve[name] = host
	}
	o.Log = funcr.New(func(prefix, args string) { fmt.Fprintln(os.Stderr, args) }, funcr.Options{LogTimestamp: true})

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	lis, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	o.Log.Info("listening", "address", lis.Addr().String(), "auth", o.Auth != "", "allow", o.Allow, "resolve", o.Resolve)
	return connectproxy.New(o).Serve(ctx, lis)
}

// Command directcopy is the bench's baseline for ferry: one process that
// watches an APIExport's virtual workspace in kcp and writes the service
// cluster directly, with no broker, edge or gRPC hop in between. Objects go
// from kcp to the service cluster (namespace = logical cluster), status
// comes back.
//
// By default it puts a finalizer on every kcp object and releases it once
// the local copy is gone, as ferry does. With --finalizer "" it runs
// without one, the physical floor of a copy: watch kcp, apply locally,
// copy status back, and delete the local copy when the watch reports the
// kcp object deleted (nothing to release). A deletion missed while it was
// not running leaves the copy behind until it starts again: then every
// local copy whose kcp object is gone is deleted.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	kcpclientset "github.com/kcp-dev/kcp/sdk/client/clientset/versioned/cluster"
	"github.com/kcp-dev/logicalcluster/v3"
	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"

	"github.com/ferry-dev/ferry/pkg/watching"
)

type options struct {
	kcpKubeconfig string
	exportPath    string
	exportName    string
	resource      schema.GroupVersionResource
	kubeconfig    string
	localResource schema.GroupVersionResource
	localKind     string
	workers       int
	finalizer     string
}

// parseOptions parses args; on -h it prints the usage and returns
// pflag.ErrHelp.
func parseOptions(args []string) (*options, error) {
	var o options
	var export, resource, localResource string
	fs := pflag.NewFlagSet("directcopy", pflag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are printed once, by main
	fs.StringVar(&o.kcpKubeconfig, "kcp-kubeconfig", "", "Admin kubeconfig of kcp (required).")
	fs.StringVar(&export, "apiexport", "", "APIExport as WORKSPACE/NAME, e.g. root:provider/example.ferry.dev (required).")
	fs.StringVar(&resource, "resource", "", "Resource served in kcp as group/version/plural (required).")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Kubeconfig of the service cluster (required).")
	fs.StringVar(&localResource, "local-resource", "", "Namespaced resource in the service cluster as group/version/plural (required).")
	fs.StringVar(&o.localKind, "local-kind", "", "Kind of --local-resource (required).")
	fs.IntVar(&o.workers, "workers", 4, "Workers for each direction.")
	fs.StringVar(&o.finalizer, "finalizer", "directcopy.ferry.dev/copy",
		`Finalizer put on kcp objects until their local copy is gone; "" for none (copies are deleted on the watch's delete event).`)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			fmt.Fprint(os.Stdout, "Usage of directcopy:\n"+fs.FlagUsages())
		}
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	for _, r := range []struct{ flag, value string }{
		{"kcp-kubeconfig", o.kcpKubeconfig}, {"apiexport", export}, {"resource", resource},
		{"kubeconfig", o.kubeconfig}, {"local-resource", localResource}, {"local-kind", o.localKind},
	} {
		if r.value == "" {
			return nil, fmt.Errorf("--%s is required", r.flag)
		}
	}
	var err error
	if o.exportPath, o.exportName, err = parseExport(export); err != nil {
		return nil, fmt.Errorf("--apiexport: %w", err)
	}
	if o.resource, err = parseGVR(resource); err != nil {
		return nil, fmt.Errorf("--resource: %w", err)
	}
	if o.localResource, err = parseGVR(localResource); err != nil {
		return nil, fmt.Errorf("--local-resource: %w", err)
	}
	if o.workers < 1 {
		return nil, fmt.Errorf("--workers: must be at least 1, got %d", o.workers)
	}
	return &o, nil
}

// parseExport splits WORKSPACE/NAME.
func parseExport(s string) (path, name string, err error) {
	path, name, ok := strings.Cut(s, "/")
	if !ok || path == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("want WORKSPACE/NAME, got %q", s)
	}
	return path, name, nil
}

// parseGVR splits group/version/plural; the group may be empty (core).
func parseGVR(s string) (schema.GroupVersionResource, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 || parts[1] == "" || parts[2] == "" {
		return schema.GroupVersionResource{}, fmt.Errorf("want group/version/plural, got %q", s)
	}
	return schema.GroupVersionResource{Group: parts[0], Version: parts[1], Resource: parts[2]}, nil
}

func main() {
	o, err := parseOptions(os.Args[1:])
	if errors.Is(err, pflag.ErrHelp) {
		os.Exit(0)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "directcopy: %v\n", err)
		os.Exit(1)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, o, log); err != nil && ctx.Err() == nil {
		log.Error("directcopy failed", "err", err)
		os.Exit(1)
	}
	log.Info("stopped")
}

// loadConfig reads a kubeconfig without client-side rate limiting: a
// negative QPS makes client-go build no token bucket (rest.RESTClientFor).
func loadConfig(path string) (*rest.Config, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("cannot load kubeconfig %s: %w", path, err)
	}
	cfg.QPS = -1
	return cfg, nil
}

func run(ctx context.Context, o *options, log *slog.Logger) error {
	kcpCfg, err := loadConfig(o.kcpKubeconfig)
	if err != nil {
		return err
	}
	localCfg, err := loadConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	log.Info("started, waiting for the virtual workspace", "apiexport", o.exportPath+"/"+o.exportName)
	vwURL, err := waitForVirtualWorkspace(ctx, kcpCfg, o, log)
	if err != nil {
		return err
	}
	log.Info("virtual workspace known", "url", vwURL)
	c, err := newCopier(o, kcpCfg, localCfg, vwURL, log)
	if err != nil {
		return err
	}
	return c.run(ctx)
}

// waitForVirtualWorkspace polls the APIExportEndpointSlice until it lists
// a URL: kcp adds one only once some workspace binds the export.
func waitForVirtualWorkspace(ctx context.Context, kcpCfg *rest.Config, o *options, log *slog.Logger) (string, error) {
	cfg := rest.CopyConfig(kcpCfg)
	// The cluster-aware clientset adds its own /clusters/<path>.
	cfg.Host, _, _ = strings.Cut(cfg.Host, "/clusters/")
	client, err := kcpclientset.NewForConfig(cfg)
	if err != nil {
		return "", fmt.Errorf("cannot build kcp client: %w", err)
	}
	endpoints := client.Cluster(logicalcluster.NewPath(o.exportPath)).ApisV1alpha1().APIExportEndpointSlices()
	var url, lastErr string
	err = wait.PollUntilContextCancel(ctx, 500*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		s, err := endpoints.Get(ctx, o.exportName, metav1.GetOptions{})
		switch {
		case err != nil && !apierrors.IsNotFound(err):
			if err.Error() != lastErr && ctx.Err() == nil { // once per distinct error, not every 500ms
				lastErr = err.Error()
				log.Error("cannot read APIExportEndpointSlice", "err", err)
			}
		case err == nil && len(s.Status.APIExportEndpoints) > 0:
			url = s.Status.APIExportEndpoints[0].URL
			return true, nil
		}
		return false, nil
	})
	return strings.TrimSuffix(url, "/"), err
}

// copier holds both directions' caches, queues and clients.
type copier struct {
	o   *options
	log *slog.Logger

	vwCfg   *rest.Config
	vwHTTP  *http.Client // shared by every per-cluster client
	clients sync.Map     // logical cluster -> dynamic.Interface
	local   dynamic.Interface
	kube    kubernetes.Interface

	kcpStore      cache.Indexer
	kcpInformer   cache.Controller
	localInformer cache.SharedIndexInformer
	kcpQueue      workqueue.TypedRateLimitingInterface[string] // kcp keys
	statusQueue   workqueue.TypedRateLimitingInterface[string] // local namespace/name

	namespaces sync.Map // local namespaces known to exist
	pending    sync.Map // local keys applied but not yet seen by the local informer
}

func newCopier(o *options, kcpCfg, localCfg *rest.Config, vwURL string, log *slog.Logger) (*copier, error) {
	c := &copier{o: o, log: log, vwCfg: rest.CopyConfig(kcpCfg)}
	c.vwCfg.Host = vwURL
	var err error
	if c.vwHTTP, err = rest.HTTPClientFor(c.vwCfg); err != nil {
		return nil, fmt.Errorf("cannot build a client for %s: %w", vwURL, err)
	}
	if c.local, err = dynamic.NewForConfig(localCfg); err != nil {
		return nil, fmt.Errorf("cannot build a client for the service cluster: %w", err)
	}
	if c.kube, err = kubernetes.NewForConfig(localCfg); err != nil {
		return nil, fmt.Errorf("cannot build a client for the service cluster: %w", err)
	}
	newQueue := func(name string) workqueue.TypedRateLimitingInterface[string] {
		return workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: name})
	}
	c.kcpQueue, c.statusQueue = newQueue("kcp"), newQueue("status")
	all, err := c.kcpClient("*")
	if err != nil {
		return nil, err
	}
	c.kcpStore, c.kcpInformer = newKCPInformer(all.Resource(o.resource), c.kcpQueue.Add)
	if c.localInformer, err = c.newLocalInformer(); err != nil {
		return nil, err
	}
	return c, nil
}

// kcpClient returns the client of one logical cluster of the virtual
// workspace ("*" for all).
func (c *copier) kcpClient(cluster string) (dynamic.Interface, error) {
	if d, ok := c.clients.Load(cluster); ok {
		return d.(dynamic.Interface), nil
	}
	cfg := rest.CopyConfig(c.vwCfg)
	cfg.Host += "/clusters/" + cluster
	d, err := dynamic.NewForConfigAndClient(cfg, c.vwHTTP)
	if err != nil {
		return nil, fmt.Errorf("cannot build a client for %s: %w", cfg.Host, err)
	}
	got, _ := c.clients.LoadOrStore(cluster, d)
	return got.(dynamic.Interface), nil
}

func (c *copier) run(ctx context.Context) error {
	go c.kcpInformer.RunWithContext(ctx)
	go c.localInformer.RunWithContext(ctx)
	if !cache.WaitForCacheSync(ctx.Done(), c.kcpInformer.HasSynced, c.localInformer.HasSynced) {
		return ctx.Err()
	}
	if c.o.finalizer == "" {
		c.sweep()
	}
	c.log.Info("caches synced, workers started", "workers", c.o.workers, "finalizer", c.o.finalizer)
	var wg sync.WaitGroup
	wg.Go(func() {
		watching.RunWorkers(ctx, c.kcpQueue, c.o.workers, func() bool { return c.process(ctx, c.kcpQueue, c.reconcile) })
	})
	wg.Go(func() {
		watching.RunWorkers(ctx, c.statusQueue, c.o.workers, func() bool { return c.process(ctx, c.statusQueue, c.syncStatus) })
	})
	wg.Wait()
	return nil
}

// process handles one key of q; false once q is shut down.
func (c *copier) process(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], handle func(context.Context, string) error) bool {
	key, shutdown := q.Get()
	if shutdown {
		return false
	}
	defer q.Done(key)
	if err := handle(ctx, key); err != nil {
		// Conflicts are expected (the cache lags a write): retry quietly.
		if ctx.Err() == nil && !apierrors.IsConflict(err) {
			c.log.Error("sync failed, will retry", "key", key, "err", err)
		}
		q.AddRateLimited(key)
		return true
	}
	q.Forget(key)
	return true
}

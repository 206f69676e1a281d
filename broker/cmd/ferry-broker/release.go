package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"

	kcpclientset "github.com/kcp-dev/kcp/sdk/client/clientset/versioned/cluster"
	"github.com/kcp-dev/logicalcluster/v3"
	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/kcp"
	"github.com/ferry-dev/ferry/broker/replication"
)

// releaseUsage documents `ferry-broker release-finalizers`.
const releaseUsage = `Usage: ferry-broker release-finalizers --kcp-kubeconfig FILE --apiexport WORKSPACE/NAME --edge NAME [--dry-run]

Releases the finalizer ferry.dev/<edge> from every object of every resource
of the APIExport, in every workspace bound to it: the clean-up for an edge
that is uninstalled for good (its objects in kcp can be deleted afterwards).
The edge's name is its "name" in the broker's configuration (or the default
derived from its identity). Remove the edge from the broker's configuration
first, or a connected edge's broker adds the finalizer again. Local copies
in the service cluster are not touched.
`

// runRelease implements `ferry-broker release-finalizers`.
func runRelease(args []string) error {
	fs := pflag.NewFlagSet("ferry-broker release-finalizers", pflag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, releaseUsage); fs.PrintDefaults() }
	kubeconfig := fs.String("kcp-kubeconfig", "", "Kubeconfig with the broker's kcp credentials.")
	exportRef := fs.String("apiexport", "", "The APIExport as workspace path and name, e.g. root:org/databases.example.com.")
	edge := fs.String("edge", "", "The edge's name in the broker's configuration (its finalizer is ferry.dev/<name>).")
	dryRun := fs.Bool("dry-run", false, "List what would be released without changing anything.")
	rewrites := fs.StringArray(kcp.EndpointRewriteFlag, nil, kcp.EndpointRewriteUsage)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	var errs []error
	if *kubeconfig == "" {
		errs = append(errs, errors.New("--kcp-kubeconfig is required"))
	}
	workspace, exportName, ok := strings.Cut(*exportRef, "/")
	if !ok || workspace == "" || exportName == "" {
		errs = append(errs, fmt.Errorf("--apiexport %q: want WORKSPACE/NAME, e.g. root:org/databases.example.com", *exportRef))
	}
	entry := config.Edge{Name: *edge, APIExport: config.APIExportRef{Workspace: workspace, Name: exportName}}
	if msgs := validation.IsDNS1123Label(*edge); len(msgs) > 0 {
		errs = append(errs, fmt.Errorf("--edge %q is not an edge name (a DNS label): %s", *edge, strings.Join(msgs, "; ")))
	}
	rewrite, err := kcp.ParseEndpointRewrite(*rewrites)
	if err != nil {
		errs = append(errs, fmt.Errorf("--%s: %w", kcp.EndpointRewriteFlag, err))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	kcpCfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("--kcp-kubeconfig %s: %w", *kubeconfig, err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var released int
	// A conflict means the object changed between list and patch: the next
	// round lists it again (objects released already are not listed).
	for round := 0; ; round++ {
		n, err := releaseFinalizers(ctx, kcpCfg, rewrite, entry.APIExport, entry.Finalizer(), *dryRun, func(line string) { fmt.Println(line) })
		released += n
		if err == nil {
			break
		}
		if !apierrors.IsConflict(err) || round == 4 {
			return err
		}
	}
	verb := "released"
	if *dryRun {
		verb = "would release"
	}
	fmt.Printf("%s finalizer %s on %d objects of APIExport %s\n", verb, entry.Finalizer(), released, entry.APIExport)
	return nil
}

// releaseFinalizers removes finalizer from every object of every resource
// in export, through its virtual workspace at every endpoint (every kcp
// shard), each object at the endpoint that listed it; report gets one line
// per object.
func releaseFinalizers(ctx context.Context, kcpCfg *rest.Config, rewrite kcp.EndpointRewrite, export config.APIExportRef, finalizer string, dryRun bool, report func(string)) (int, error) {
	client, err := kcp.NewClient(kcpCfg)
	if err != nil {
		return 0, err
	}
	state, err := kcp.NewResolver(client, rewrite).Resolve(ctx, export)
	if err != nil {
		return 0, err
	}
	if len(state.VirtualWorkspaceURLs) == 0 {
		report("the APIExport's virtual workspace is not served (no workspace binds it): nothing carries its finalizers")
		return 0, nil
	}
	gvrs, err := exportResources(ctx, client, export)
	if err != nil {
		return 0, err
	}
	released := 0
	for _, url := range state.VirtualWorkspaceURLs {
		clients := func(cluster string) (dynamic.Interface, error) {
			c := rest.CopyConfig(kcpCfg)
			c.Host = url + "/clusters/" + cluster
			return dynamic.NewForConfig(c)
		}
		for _, gvr := range gvrs {
			objs, err := replication.ListFinalized(ctx, clients, gvr, finalizer)
			if err != nil {
				return released, fmt.Errorf("at virtual workspace endpoint %s: %w", url, err)
			}
			for i := range objs {
				o := &objs[i]
				where := fmt.Sprintf("%s %s|%s", gvr.GroupResource(), logicalcluster.From(o), nsName(o.GetNamespace(), o.GetName()))
				if !dryRun {
					if err := replication.RemoveFinalizer(ctx, clients, "", gvr, o, finalizer); err != nil {
						return released, fmt.Errorf("cannot release %s: %w", where, err)
					}
				}
				report(where)
				released++
			}
		}
	}
	return released, nil
}

// exportResources returns the resources export serves (the first version
// of each schema).
func exportResources(ctx context.Context, client kcpclientset.ClusterInterface, export config.APIExportRef) ([]schema.GroupVersionResource, error) {
	path := logicalcluster.NewPath(export.Workspace)
	ex, err := client.Cluster(path).ApisV1alpha2().APIExports().Get(ctx, export.Name, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("cannot read APIExport %s: %w", export, err)
	}
	var gvrs []schema.GroupVersionResource
	for _, r := range ex.Spec.Resources {
		ars, err := client.Cluster(path).ApisV1alpha1().APIResourceSchemas().Get(ctx, r.Schema, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("cannot read APIResourceSchema %s of APIExport %s: %w", r.Schema, export, err)
		}
		if len(ars.Spec.Versions) > 0 {
			gvrs = append(gvrs, schema.GroupVersionResource{Group: r.Group, Version: ars.Spec.Versions[0].Name, Resource: r.Name})
		}
	}
	return gvrs, nil
}

func nsName(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

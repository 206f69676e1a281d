package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"github.com/spf13/pflag"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/yaml"

	"github.com/ferry-dev/ferry/deploy/crd"
	"github.com/ferry-dev/ferry/edge/migrate"
)

// migrateUsage documents `ferry-edge migrate`.
const migrateUsage = `Usage: ferry-edge migrate [-f FILE|DIR|-]... [--kubeconfig FILE] [-o FILE] [--check] [--adopt-agent-name NAME [--adopt-state-namespace NS]]

Converts PublishedResources of api-syncagent (syncagent.kcp.io/v1alpha1) or
of the KDP servlet (services.kdp.k8c.io/v1alpha1) into ferry's
(ferry.dev/v1alpha1). Reads the files given with -f (YAML or JSON, several
documents or a List each; a directory means its *.yaml, *.yml and *.json
files; "-" is stdin), or without -f every such PublishedResource of the
cluster --kubeconfig points at. Writes ferry's PublishedResources (to -o or
stdout), each preceded by comments listing what changed; the same list goes
to stderr. Fields ferry cannot honour are dropped and marked "lossy" with
what to write instead. With --check nothing is written and the exit status
is 1 when anything is lossy. With --adopt-agent-name, api-syncagent's
PublishedResources also get spec.adopt, so ferry takes over the copies that
api-syncagent made in place (README: migrating from api-syncagent).
`

// runMigrate implements `ferry-edge migrate`.
func runMigrate(args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := pflag.NewFlagSet("ferry-edge migrate", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(stderr, migrateUsage); fs.PrintDefaults() }
	files := fs.StringArrayP("filename", "f", nil, "File, directory or - (stdin) to read; repeatable.")
	kubeconfig := fs.String("kubeconfig", "", "Read from this cluster when no -f is given (default: $KUBECONFIG, then in-cluster).")
	output := fs.StringP("output", "o", "", "Write ferry's PublishedResources to this file instead of stdout.")
	check := fs.Bool("check", false, "Write nothing; exit 1 when anything cannot be carried over.")
	adoptAgent := fs.String("adopt-agent-name", "", "Make api-syncagent's PublishedResources adopt the copies of the api-syncagent with this --agent-name in place (spec.adopt).")
	adoptState := fs.String("adopt-state-namespace", "", "With --adopt-agent-name: the namespace of api-syncagent's state Secrets, deleted once their objects are adopted.")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q (files are given with -f)", fs.Args())
	}
	if *adoptState != "" && *adoptAgent == "" {
		return errors.New("--adopt-state-namespace needs --adopt-agent-name")
	}
	if *check && *output != "" {
		return errors.New("--check writes nothing; drop -o")
	}
	docs, err := readMigrationInput(*files, *kubeconfig, stdin)
	if err != nil {
		return err
	}
	if len(docs) == 0 {
		return errors.New("no PublishedResources found")
	}
	var def apiextensionsv1.CustomResourceDefinition
	if err := yaml.Unmarshal(crd.PublishedResource, &def); err != nil {
		return fmt.Errorf("reading ferry's CRD: %w", err)
	}
	conv, err := migrate.NewConverter(&def)
	if err != nil {
		return err
	}
	if *adoptAgent != "" {
		conv.Adopt(migrate.Adoption{AgentName: *adoptAgent, StateNamespace: *adoptState})
	}
	var results []migrate.Result
	var errs []error
	lossy := 0
	for _, d := range docs {
		r, err := conv.Convert(d)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		results = append(results, r)
		if r.Lossy() {
			lossy++
		}
		fmt.Fprintf(stderr, "PublishedResource %q (%s):\n", r.Name, r.From)
		for _, c := range r.Changes {
			fmt.Fprintf(stderr, "  %s\n", c)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "%d PublishedResource(s) converted, %d with lossy changes\n", len(results), lossy)
	if *check {
		if lossy > 0 {
			return errLossy
		}
		return nil
	}
	out := stdout
	if *output != "" {
		f, err := os.Create(*output)
		if err != nil {
			return err
		}
		defer f.Close()
		out = f
	}
	if err := migrate.Write(out, results); err != nil {
		return err
	}
	if f, ok := out.(*os.File); ok && *output != "" {
		return f.Close()
	}
	return nil
}

// errLossy makes --check exit 1 with a short message.
var errLossy = errors.New("some fields cannot be carried over (marked lossy above)")

func readMigrationInput(files []string, kubeconfig string, stdin io.Reader) ([]map[string]any, error) {
	if len(files) == 0 {
		loading := clientcmd.NewDefaultClientConfigLoadingRules()
		loading.ExplicitPath = kubeconfig
		cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(loading, nil).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("no -f given and no cluster to read from: %w", err)
		}
		client, err := dynamic.NewForConfig(cfg)
		if err != nil {
			return nil, err
		}
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		return migrate.FromCluster(ctx, client)
	}
	var docs []map[string]any
	for _, f := range files {
		paths, err := expandInput(f)
		if err != nil {
			return nil, err
		}
		for _, p := range paths {
			var r io.Reader = stdin
			if p != "-" {
				fh, err := os.Open(p)
				if err != nil {
					return nil, err
				}
				defer fh.Close()
				r = fh
			}
			d, err := migrate.ReadDocuments(r)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", p, err)
			}
			docs = append(docs, d...)
		}
	}
	return docs, nil
}

// expandInput turns a directory into its YAML and JSON files, sorted.
func expandInput(p string) ([]string, error) {
	if p == "-" {
		return []string{p}, nil
	}
	st, err := os.Stat(p)
	if err != nil {
		return nil, err
	}
	if !st.IsDir() {
		return []string{p}, nil
	}
	entries, err := os.ReadDir(p)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		ext := strings.ToLower(filepath.Ext(e.Name()))
		if !e.IsDir() && (ext == ".yaml" || ext == ".yml" || ext == ".json") {
			out = append(out, filepath.Join(p, e.Name()))
		}
	}
	sort.Strings(out)
	return out, nil
}

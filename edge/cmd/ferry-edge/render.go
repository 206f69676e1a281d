package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"

	"github.com/spf13/pflag"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/edge/publish"
	"github.com/ferry-dev/ferry/edge/replication"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/openapischema"
	"github.com/ferry-dev/ferry/pkg/projection"
	"github.com/ferry-dev/ferry/pkg/related"
)

// renderUsage documents `ferry-edge render`.
const renderUsage = `Usage: ferry-edge render -f PUBLISHEDRESOURCE.yaml (--crd CRD.yaml | --openapi DOC.json...) [--object OBJECT.yaml] [--export NAME]

Shows, without any cluster, what publishing a PublishedResource produces:
the APIResourceSchema the broker creates in kcp (under the same name: it
carries a hash of its content), the APIExport's spec.resources entry, and,
for a sample object as a consumer writes it in kcp (--object), the local
copy the edge writes into the service cluster: its namespace and name (the
naming rules), ferry's labels and annotations, and the content after the
spec mutations. The output is YAML, one document per result, each with a
leading comment.

A built-in kind (ConfigMap, rbac Role, …) has no CRD: --openapi takes the
service cluster's OpenAPI v3 document of its group and version instead
(kubectl get --raw /openapi/v3/api/v1, /openapi/v3/apis/GROUP/VERSION),
which the edge converts as it does with the live discovery. With several
versions, the first selected one is taken as the storage version; the edge
takes the cluster's preferred one.

A PublishedResource the edge would refuse is refused with the reason and
message its Published condition would carry; the exit status is then 1.
What needs the clusters is not checked: the admission rules of the
PublishedResource CRD, whether related kinds are served, namespaces that
exist already, and conflicts with other PublishedResources.
`

// renderOptions are the flags of `ferry-edge render`.
type renderOptions struct {
	PublishedResource string
	CRD               string
	OpenAPI           []string
	Object            string
	Export            string
	Agent             string
	Cluster           string
	WorkspacePath     string
}

// runRender implements `ferry-edge render`.
func runRender(args []string, stdout io.Writer) error {
	fs := pflag.NewFlagSet("ferry-edge render", pflag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, renderUsage); fs.PrintDefaults() }
	var o renderOptions
	fs.StringVarP(&o.PublishedResource, "filename", "f", "", "The PublishedResource (YAML, ferry.dev/v1alpha1).")
	fs.StringVar(&o.CRD, "crd", "", "The CustomResourceDefinition it publishes, as in the service cluster (YAML).")
	fs.StringSliceVar(&o.OpenAPI, "openapi", nil, "For a built-in kind: the service cluster's OpenAPI v3 document(s) of its group and version (JSON), instead of --crd.")
	fs.StringVar(&o.Object, "object", "", "A sample object of the projected kind as a consumer writes it in kcp (YAML); its local copy is shown.")
	fs.StringVar(&o.Export, "export", "", "The APIExport's name (the broker's apiExport.name for this edge): the API group in kcp. Default: the group of --object's apiVersion.")
	fs.StringVar(&o.Agent, "agent-name", "edge", "The edge's --agent-name (the ferry.dev/agent label on copies).")
	fs.StringVar(&o.Cluster, "cluster", "", "The logical cluster name of the sample object's workspace. Default: its kcp.io/cluster annotation, else \"sample\".")
	fs.StringVar(&o.WorkspacePath, "workspace-path", "root:sample", "The sample object's workspace path (shown only with spec.enableWorkspacePaths).")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	var errs []error
	if o.PublishedResource == "" {
		errs = append(errs, errors.New("-f (the PublishedResource) is required"))
	}
	if (o.CRD == "") == (len(o.OpenAPI) == 0) {
		errs = append(errs, errors.New("one of --crd (a CRD) and --openapi (a built-in kind) is required"))
	}
	if o.Export == "" && o.Object == "" {
		errs = append(errs, errors.New("--export is required without --object (the APIExport's name is the API group in kcp)"))
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	in, err := readRenderInput(&o)
	if err != nil {
		return err
	}
	return render(stdout, in)
}

// renderInput is what render works on, read from the files.
type renderInput struct {
	pr            *ferryv1alpha1.PublishedResource
	crd           *apiextensionsv1.CustomResourceDefinition
	object        *unstructured.Unstructured // nil without --object
	export        string
	agent         string
	cluster       string
	workspacePath string
}

func readRenderInput(o *renderOptions) (*renderInput, error) {
	in := &renderInput{pr: &ferryv1alpha1.PublishedResource{}, crd: &apiextensionsv1.CustomResourceDefinition{},
		export: o.Export, agent: o.Agent, cluster: o.Cluster, workspacePath: o.WorkspacePath}
	if err := readYAML(o.PublishedResource, ferryv1alpha1.GroupVersion.WithKind("PublishedResource"), in.pr); err != nil {
		return nil, err
	}
	if o.CRD != "" {
		if err := readYAML(o.CRD, apiextensionsv1.SchemeGroupVersion.WithKind("CustomResourceDefinition"), in.crd); err != nil {
			return nil, err
		}
	} else {
		crd, err := describeBuiltin(in.pr.Spec.Resource, o.OpenAPI)
		if err != nil {
			return nil, err
		}
		in.crd = crd
	}
	if o.Object != "" {
		data, err := os.ReadFile(o.Object)
		if err != nil {
			return nil, fmt.Errorf("--object: %w", err)
		}
		in.object = &unstructured.Unstructured{}
		if err := yaml.Unmarshal(data, &in.object.Object); err != nil {
			return nil, fmt.Errorf("--object %s: %w", o.Object, err)
		}
		if in.object.Object == nil || in.object.GetName() == "" {
			return nil, fmt.Errorf("--object %s: not an object with metadata.name", o.Object)
		}
		if in.export == "" {
			in.export = in.object.GroupVersionKind().Group
		}
	}
	if in.cluster == "" {
		in.cluster = "sample"
		if in.object != nil && in.object.GetAnnotations()["kcp.io/cluster"] != "" {
			in.cluster = in.object.GetAnnotations()["kcp.io/cluster"]
		}
	}
	return in, nil
}

// readYAML decodes file strictly (a misspelt field is an error here; the
// API server would drop it silently) and checks its apiVersion and kind.
func readYAML(file string, gvk schema.GroupVersionKind, into any) error {
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var tm struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(data, &tm); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	if tm.APIVersion != gvk.GroupVersion().String() || tm.Kind != gvk.Kind {
		return fmt.Errorf("%s is a %s %s, not a %s %s", file, tm.APIVersion, tm.Kind, gvk.GroupVersion(), gvk.Kind)
	}
	if err := yaml.UnmarshalStrict(data, into); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	return nil
}

// render writes the documents for in to w; a PublishedResource the edge
// would refuse is an error carrying the condition's reason and message.
func render(w io.Writer, in *renderInput) error {
	pr, crd := in.pr, in.crd
	proj, err := publish.Project(pr, crd, in.export)
	if err != nil {
		return err
	}
	compiled, refusal := publish.CompileRules(pr, crd)
	if refusal != nil {
		return refusal
	}
	if _, err := related.Compile(pr.Spec.Related); err != nil {
		return &publish.Refusal{Reason: ferryv1alpha1.ReasonRelatedInvalid, Message: err.Error()}
	}
	pub := publish.NewPublished(pr, crd, proj, "", compiled)

	ars := proj.Schema
	if err := writeDoc(w, fmt.Sprintf("APIResourceSchema the broker creates in the APIExport's workspace (kind %s, served as %s)",
		proj.Kind, proj.Resource.GroupResource()), ars); err != nil {
		return err
	}
	entry := projection.ExportEntry(in.export, proj.Resource.Resource, ars.Name)
	if err := writeDoc(w, fmt.Sprintf("APIExport %s: the spec.resources entry the broker adds (or points at the new schema)", in.export), entry); err != nil {
		return err
	}
	if in.object == nil {
		return nil
	}
	return renderCopy(w, in, proj, pub)
}

// renderCopy writes the local copy of in.object.
func renderCopy(w io.Writer, in *renderInput, proj *projection.Result, pub *replication.Published) error {
	if in.pr.Spec.SyncDisabled() {
		_, err := fmt.Fprintf(w, "---\n# No local copy: spec.synchronization.enabled is false, so objects of %s are not synced.\n", proj.Resource.GroupResource())
		return err
	}
	obj := in.object
	gvk := obj.GroupVersionKind()
	var versions []string
	for _, v := range proj.VersionMap {
		versions = append(versions, v)
	}
	slices.Sort(versions)
	if gvk.Group != proj.Resource.Group || gvk.Kind != proj.Kind || !slices.Contains(versions, gvk.Version) {
		return fmt.Errorf("the sample object is a %s, but the PublishedResource serves kind %s in %s/%s",
			strings.TrimPrefix(gvk.GroupVersion().String()+" "+gvk.Kind, "/"), proj.Kind, proj.Resource.Group, strings.Join(versions, ", "))
	}
	if !pub.Namespaced && obj.GetNamespace() != "" {
		return fmt.Errorf("the sample object has namespace %q, but %s is cluster-scoped", obj.GetNamespace(), proj.Kind)
	}
	if pub.Namespaced && obj.GetNamespace() == "" {
		return fmt.Errorf("the sample object has no namespace, but %s is namespaced", proj.Kind)
	}
	remote := naming.Remote{ClusterName: in.cluster, Namespace: obj.GetNamespace(), Name: obj.GetName(), UID: string(obj.GetUID())}
	if in.pr.Spec.EnableWorkspacePaths {
		remote.WorkspacePath = in.workspacePath
	}
	ns, name, err := pub.Naming.Local(remote, pub.Namespaced)
	if err != nil {
		return fmt.Errorf("naming: %w", err)
	}
	local, err := pub.DesiredCopy(obj, replication.Copy{
		Agent: in.agent, Remote: remote, Namespace: ns, Name: name, ResourceVersion: obj.GetResourceVersion(),
	})
	if err != nil {
		return err
	}
	where := name
	if ns != "" {
		where = ns + "/" + name
	}
	return writeDoc(w, fmt.Sprintf("The local copy the edge writes into the service cluster: %s %s (workspace %s; the broker's content hash annotation is left out)",
		pub.LocalKind, where, in.cluster), local.Object)
}

// writeDoc writes v as one YAML document with a leading comment.
func writeDoc(w io.Writer, comment string, v any) error {
	data, err := yaml.Marshal(v)
	if err != nil {
		return fmt.Errorf("cannot encode %s: %w", comment, err)
	}
	_, err = fmt.Fprintf(w, "---\n# %s\n%s", comment, data)
	return err
}

// describeBuiltin describes src's built-in kind as a CRD from the OpenAPI
// v3 documents in files, as the edge's Builtins do from discovery.
func describeBuiltin(src ferryv1alpha1.SourceResource, files []string) (*apiextensionsv1.CustomResourceDefinition, error) {
	docs := make(map[string][]byte, len(files))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("--openapi: %w", err)
		}
		docs[f] = data
	}
	gk := schema.GroupKind{Group: src.APIGroup, Kind: src.Kind}
	var (
		versions   []openapischema.Version
		plural     string
		namespaced bool
	)
	selected := projection.SelectedVersions(&src, nil)
	if len(selected) == 0 {
		return nil, fmt.Errorf("--openapi: set spec.resource.version or versions (offline, ferry-edge render cannot tell which versions of %s the cluster serves)", gk)
	}
	for i, v := range selected {
		gvk := gk.WithVersion(v)
		var found *openapischema.Schema
		for _, f := range files {
			s, err := openapischema.Convert(docs[f], gvk)
			if err != nil {
				continue // another document's group or version
			}
			if plural, namespaced, err = openapischema.ResourceOf(docs[f], gvk); err != nil {
				return nil, fmt.Errorf("--openapi %s: %w", f, err)
			}
			found = s
			break
		}
		if found == nil {
			return nil, fmt.Errorf("no --openapi document has a schema for %s (the service cluster's is at /openapi/v3/%s)", gvk, openAPIPath(gvk.GroupVersion()))
		}
		versions = append(versions, openapischema.Version{Name: v, Storage: i == 0, Schema: found})
	}
	if len(versions) == 0 {
		return nil, errors.New("spec.resource names no version")
	}
	return openapischema.DescribeAsCRD(gk, plural, namespaced, versions), nil
}

// openAPIPath is where an API server serves gv's OpenAPI v3 document.
func openAPIPath(gv schema.GroupVersion) string {
	if gv.Group == "" {
		return "api/" + gv.Version
	}
	return "apis/" + gv.Group + "/" + gv.Version
}

package e2e

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	apisv1alpha1 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha1"
	apisv1alpha2 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha2"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

// TestRenderNamesTheBrokersSchema is issue 21's acceptance of `ferry-edge
// render`: for the demo's PublishedResource and CRD (deploy/examples), the
// real binary's offline output names the APIResourceSchema the broker
// creates in kcp, with the same spec, and the APIExport entry the broker
// writes.
func TestRenderNamesTheBrokersSchema(t *testing.T) {
	examples, err := filepath.Abs(filepath.Join("..", "..", "deploy", "examples"))
	if err != nil {
		t.Fatal(err)
	}
	prFile, crdFile := filepath.Join(examples, "database-publishedresource.yaml"), filepath.Join(examples, "database-crd.yaml")
	var crd apiextensionsv1.CustomResourceDefinition
	var pr ferryv1alpha1.PublishedResource
	for file, into := range map[string]any{crdFile: &crd, prFile: &pr} {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		if err := yaml.UnmarshalStrict(data, into); err != nil {
			t.Fatalf("%s: %v", file, err)
		}
	}

	e := newPubEnv(t)
	apply(t, &crd)
	e.publish(t, "render-"+pr.Name, pr.Spec)
	published := e.waitCondition(t, "render-"+pr.Name, metav1.ConditionTrue, ferryv1alpha1.ReasonPublished)

	cmd := exec.Command(env.bins.Edge, "render", "-f", prFile, "--crd", crdFile, "--export", e.export.Name)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("ferry-edge render: %v\n%s", err, stderr.String())
	}
	docs := strings.Split(strings.TrimPrefix(string(out), "---\n"), "\n---\n")
	if len(docs) != 2 {
		t.Fatalf("render printed %d documents, want the schema and the APIExport entry:\n%s", len(docs), out)
	}
	var rendered apisv1alpha1.APIResourceSchema
	if err := yaml.UnmarshalStrict([]byte(docs[0]), &rendered); err != nil {
		t.Fatalf("the first document is not an APIResourceSchema: %v\n%s", err, docs[0])
	}
	var entry apisv1alpha2.ResourceSchema
	if err := yaml.UnmarshalStrict([]byte(docs[1]), &entry); err != nil {
		t.Fatalf("the second document is not an APIExport resource entry: %v\n%s", err, docs[1])
	}

	if rendered.Name != published.Status.ResourceSchemaName {
		t.Fatalf("render names the schema %s, the broker created %s", rendered.Name, published.Status.ResourceSchemaName)
	}
	inKCP := e.schemas(t, "manageddatabases")
	if len(inKCP) != 1 || inKCP[0].Name != rendered.Name {
		t.Fatalf("kcp has schemas %v for manageddatabases, want exactly the rendered %s", schemaNames(inKCP), rendered.Name)
	}
	if rendered.Spec.NameValidation == "" {
		// kcp defaults it when the schema is created (the name hashes
		// the spec as the broker sent it).
		rendered.Spec.NameValidation = inKCP[0].Spec.NameValidation
	}
	if !equality.Semantic.DeepEqual(inKCP[0].Spec, rendered.Spec) {
		t.Fatalf("the schema in kcp differs from the rendered one:\nkcp:      %+v\nrendered: %+v", inKCP[0].Spec, rendered.Spec)
	}
	ex := e.apiExport(t)
	if got := exportSchema(ex, entry.Group, entry.Name); got != entry.Schema || entry.Group != e.export.Name {
		t.Fatalf("the APIExport serves %s.%s from %q, render says %+v", entry.Name, entry.Group, got, entry)
	}
	t.Logf("render and the broker agree on APIResourceSchema %s", rendered.Name)
}

func schemaNames(list []apisv1alpha1.APIResourceSchema) []string {
	out := make([]string, 0, len(list))
	for _, s := range list {
		out = append(out, s.Name)
	}
	return out
}

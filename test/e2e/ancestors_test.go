package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/test/framework"
)

// ancestorExample is one PublishedResource of the seeds' or api-syncagent's
// documentation (testdata/ancestors, apiVersion changed to ferry's) and
// what it must do on the real service cluster.
type ancestorExample struct {
	file string
	// slug makes the example's CRD and PublishedResource names unique on
	// the shared service cluster (the document's own names are rewritten
	// by the test, not in the file).
	slug string
	// refused is part of the admission error; empty: accepted and syncing.
	refused string
	// namespace and labels of the kcp object created to see it sync.
	namespace string
	labels    []string
}

// TestAncestorDocumentsAcceptedAsWritten: every complete PublishedResource
// example of the seeds and of api-syncagent's docs (without the related
// object/resource shape) is, with only the apiVersion changed, accepted by
// the real API server and syncs a kcp object, or is refused at admission
// with a message that says what to write instead.
func TestAncestorDocumentsAcceptedAsWritten(t *testing.T) {
	examples := []ancestorExample{
		{file: "seed-basic.yaml", slug: "ancseedbasic", namespace: "default"},
		{file: "seed-filter.yaml", slug: "ancseedfilter", namespace: "my-app", labels: []string{"foo=bar"}},
		{file: "seed-projection.yaml", slug: "ancseedproj", refused: "kcp serves only lowercase resource names: write zertifikate"},
		{file: "seed-naming.yaml", slug: "ancseednaming", namespace: "default"},
		{file: "seed-related.yaml", slug: "ancseedrel", namespace: "default"},
		{file: "seed-related-no-identifier.yaml", slug: "ancseedrelnoid", namespace: "default"},
		{file: "syncagent-basic.yaml", slug: "ancsabasic", namespace: "default"},
		{file: "syncagent-filter.yaml", slug: "ancsafilter", namespace: "my-app", labels: []string{"foo=bar"}},
		{file: "syncagent-projection.yaml", slug: "ancsaproj", refused: "kcp serves only lowercase resource names: write sertifikater"},
		{file: "syncagent-naming.yaml", slug: "ancsanaming", namespace: "default"},
		{file: "syncagent-related-reference.yaml", slug: "ancsarelref", namespace: "default"},
		{file: "syncagent-related-selector.yaml", slug: "ancsarelsel", refused: "rewrite sets exactly one of regex (pattern and replacement) and template"},
		{file: "syncagent-related-selector-regex.yaml", slug: "ancsarelselre", namespace: "default"},
		{file: "syncagent-related-owned.yaml", slug: "ancsarelowned", refused: "projection.apiGroup is not supported: ferry serves every published resource in the API group of the APIExport"},
	}
	ctx := context.Background()
	p := newPubEnv(t)
	crds := map[string]*apiextensionsv1.CustomResourceDefinition{}
	for _, ex := range examples {
		// Each example publishes its own CRD: a Certificate-like kind in a
		// group of its own, named after the slug.
		kind := strings.ToUpper(ex.slug[:1]) + ex.slug[1:]
		crd := testCRD(ex.slug+".ancestors.example", kind, ex.slug+"s", apiextensionsv1.NamespaceScoped, "v1")
		apply(t, crd)
		crds[ex.file] = crd

		objs, err := framework.DecodeYAML(mustOpen(t, filepath.Join("testdata", "ancestors", ex.file)))
		if err != nil || len(objs) != 1 {
			t.Fatalf("%s: %v (%d documents)", ex.file, err, len(objs))
		}
		pr := objs[0]
		pr.SetName(crd.Spec.Names.Plural)
		pr.SetLabels(map[string]string{testLabel: p.label})
		if err := unstructured.SetNestedField(pr.Object, crd.Spec.Group, "spec", "resource", "apiGroup"); err != nil {
			t.Fatal(err)
		}
		if err := unstructured.SetNestedField(pr.Object, kind, "spec", "resource", "kind"); err != nil {
			t.Fatal(err)
		}
		err = framework.Apply(ctx, p.serviceCluster().Config, pr)
		switch {
		case ex.refused == "" && err != nil:
			t.Errorf("%s is refused: %v", ex.file, err)
		case ex.refused != "" && (err == nil || !strings.Contains(err.Error(), ex.refused)):
			t.Errorf("%s: admission error %v, want one saying %q", ex.file, err, ex.refused)
		}
	}
	if t.Failed() {
		return
	}

	var accepted []*syncEnv
	var acceptedEx []ancestorExample
	for _, ex := range examples {
		if ex.refused == "" {
			accepted = append(accepted, publishedSyncEnv(t, p, crds[ex.file]))
			acceptedEx = append(acceptedEx, ex)
		}
	}
	consumer := bindConsumer(t, p, "anc")
	for _, e := range accepted {
		e.useConsumer(t, consumer)
	}
	// Bound: the broker watches the virtual workspace, and says so.
	p.waitPRCondition(t, crds[acceptedEx[0].file].Spec.Names.Plural, ferryv1alpha1.ConditionVirtualWorkspaceReady, metav1.ConditionTrue, ferryv1alpha1.ReasonVirtualWorkspaceReady)
	if _, err := accepted[0].consumerKube(t).CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "my-app"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	for i, e := range accepted {
		ex := acceptedEx[i]
		t.Run(strings.TrimSuffix(ex.file, ".yaml"), func(t *testing.T) {
			e.createRemote(t, ex.namespace, "cert-1", map[string]any{"fieldV1": "x", "secretName": "cert-1-tls"}, ex.labels...)
			e.waitLocal(t, ex.namespace, "cert-1", func(*unstructured.Unstructured) (bool, string) { return true, "" })
		})
	}
}

func mustOpen(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// TestAncestorRefusalsAtAdmission: what ferry cannot honour in the
// ancestors' documents is refused by the real API server with a message
// that says what to write instead, and their other spellings are accepted
// (the PublishedResources are deleted again; no edge publishes them).
func TestAncestorRefusalsAtAdmission(t *testing.T) {
	ctx := context.Background()
	const resource = "resource: {apiGroup: refusals.ancestors.example, kind: Widget, version: v1}\n"
	// An edge installs the PublishedResource CRD (the test may run alone).
	newPubEnv(t)
	dyn, err := dynamic.NewForConfig(env.service.Config)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, spec string
		refused    string // part of the admission error; empty: accepted
	}{
		{name: "ancrefgroup", spec: resource + "projection: {group: other.example}",
			refused: "projection.group is not supported: ferry serves every published resource in the API group of the APIExport"},
		{name: "ancrefapigroup", spec: resource + "projection: {apiGroup: other.example}", refused: "projection.apiGroup is not supported"},
		{name: "ancrefrudi", spec: resource + `mutation: {spec: [{rudi: {script: '(set! .metadata.name "x")'}}]}`,
			refused: "Rudi is not supported: write it as cel"},
		{name: "ancrefbadplural", spec: resource + "projection: {plural: Widgets}", refused: "kcp serves only lowercase resource names: write widgets"},
		{name: "ancrefbothversions", spec: "resource: {apiGroup: refusals.ancestors.example, kind: Widget, version: v1, versions: [v1]}",
			refused: "set at most one of version and versions"},
		{name: "ancrefdupidentifier", spec: resource +
			"related: [{origin: service, kind: Secret, reference: {name: {path: a}}}, {origin: platform, kind: Secret, reference: {name: {path: b}}}]",
			refused: "set identifier on the entries of the same kind"},
		{name: "ancrefallversions", spec: "resource: {apiGroup: refusals.ancestors.example, kind: Widget}"},
		// Related mutations: the primary's steps; status steps need
		// syncStatus, Rudi is refused as for the primary.
		{name: "ancrefrelstatusmut", spec: resource +
			"related: [{identifier: a, origin: kcp, resource: secrets, object: {reference: {path: spec.s}}, mutation: {status: [{delete: {path: status.x}}]}}]",
			refused: "mutation.status rewrites the status carried with syncStatus"},
		{name: "ancrefrelrudi", spec: resource +
			"related: [{identifier: a, origin: kcp, resource: secrets, object: {reference: {path: spec.s}}, mutation: {spec: [{rudi: {script: x}}]}}]",
			refused: "Rudi is not supported: write it as cel"},
		// api-syncagent's list reference, with a mutation of each object.
		{name: "ancrefrellistmut", spec: resource + `related: [{identifier: a, origin: service, resource: secrets, object: {reference: {path: spec.users.#.name, regex: {pattern: '^(.*)$', replacement: '\1-creds'}}},
  mutation: {spec: [{regex: {path: metadata.labels.tier, pattern: '^internal-(.*)$', replacement: '\1'}}, {cel: {path: metadata.labels.by, expression: "'ferry'"}}]}}]`},
		{name: "ancrefspellings", spec: resource + `filter: {namespace: my-app}
related: [{origin: platform, kind: ConfigMap, reference: {name: {path: spec.config, regex: {pattern: '(.+)', replacement: 'cfg-\1'}}}}]
mutation: {spec: [{template: {path: spec.owner, template: '{{ .LocalObject.ObjectMeta.Namespace }}'}}]}`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			objs, err := framework.DecodeYAML(strings.NewReader("apiVersion: ferry.dev/v1alpha1\nkind: PublishedResource\nmetadata: {name: " + tc.name + "}\nspec:\n" + indent(tc.spec)))
			if err != nil || len(objs) != 1 {
				t.Fatalf("bad test document: %v", err)
			}
			// Labelled for no edge: nothing publishes it or adds a finalizer.
			objs[0].SetLabels(map[string]string{testLabel: "unpublished-" + tc.name})
			err = framework.Apply(ctx, env.service.Config, objs[0])
			if err == nil {
				t.Cleanup(func() {
					if err := dyn.Resource(ferryv1alpha1.GroupVersion.WithResource("publishedresources")).Delete(context.Background(), tc.name, metav1.DeleteOptions{}); err != nil {
						t.Logf("cleanup: %v", err)
					}
				})
			}
			switch {
			case tc.refused == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.refused != "" && (err == nil || !strings.Contains(err.Error(), tc.refused)):
				t.Fatalf("admission error %v, want one saying %q", err, tc.refused)
			}
		})
	}
}

func indent(s string) string {
	return "  " + strings.ReplaceAll(s, "\n", "\n  ") + "\n"
}

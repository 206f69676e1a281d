package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	apisv1alpha1 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha1"
	apisv1alpha2 "github.com/kcp-dev/kcp/sdk/apis/apis/v1alpha2"
	kcpclientset "github.com/kcp-dev/kcp/sdk/client/clientset/versioned/cluster"
	"github.com/kcp-dev/logicalcluster/v3"
	"google.golang.org/grpc"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/test/framework"
)

// pubEnv is a broker and an edge serving a fresh APIExport. The edge only
// handles PublishedResources labelled for the test, so tests sharing the
// service cluster do not see each other's.
type pubEnv struct {
	export config.APIExportRef
	broker *framework.Broker
	edge   *framework.Process
	label  string
	kcp    kcpclientset.ClusterInterface
	// kcpConfig is the admin config for the root workspace of the kcp
	// that kcp talks to; nil is the suite's kcp (a sharded environment sets
	// its front-proxy's).
	kcpConfig *rest.Config
	path      logicalcluster.Path
	pki       string
	admin     *grpc.ClientConn // the broker's admin API, dialled on first use
	// edgeArgs are extra flags of every edge the environment starts.
	edgeArgs []string
	// edgeDial, when set, is the address edges dial instead of the
	// broker's (a proxy in front of it).
	edgeDial string
	// service is the edge's service cluster; nil is the suite's.
	service *framework.ServiceCluster
}

// serviceCluster is the environment's service cluster.
func (e *pubEnv) serviceCluster() *framework.ServiceCluster {
	if e.service != nil {
		return e.service
	}
	return env.service
}

const testLabel = "e2e.ferry.dev/test"

func newPubEnv(t testing.TB, brokerArgs ...string) *pubEnv {
	t.Helper()
	return newPubEnvArgs(t, brokerArgs, nil, nil)
}

// newPubEnvArgs is newPubEnv with extra flags for the broker and the edge;
// with via set, edges dial via(the broker's address) instead.
func newPubEnvArgs(t testing.TB, brokerArgs, edgeArgs []string, via func(brokerAddress string) string) *pubEnv {
	t.Helper()
	e := &pubEnv{label: sanitize(t.Name()), path: env.provider, edgeArgs: edgeArgs}
	if len(e.label) > 63 {
		e.label = e.label[:63]
	}
	e.pki, e.export, e.broker = brokerFor(t, brokerArgs...)
	if via != nil {
		e.edgeDial = via(e.broker.Address)
	}
	e.edge = e.startEdge(t)
	// Connected implies the edge installed the PublishedResource CRD.
	if _, err := framework.WaitEdgeState(context.Background(), adminConn(t, e.broker, e.pki), devpki.IdentityFor("edge"),
		ferryv1.EdgeState_EDGE_STATE_CONNECTED, time.Minute); err != nil {
		t.Fatal(err)
	}
	var err error
	if e.kcp, err = framework.KCPClient(env.kcp.Config); err != nil {
		t.Fatal(err)
	}
	return e
}

// kcpRootConfig is the admin config of the environment's kcp, for its root
// workspace.
func (e *pubEnv) kcpRootConfig() *rest.Config {
	if e.kcpConfig != nil {
		return e.kcpConfig
	}
	return env.kcp.Config
}

func (e *pubEnv) startEdge(t testing.TB) *framework.Process {
	t.Helper()
	addr := e.broker.Address
	if e.edgeDial != "" {
		addr = e.edgeDial
	}
	return startEdge(t, "edge", e.pki, "edge", addr, append([]string{"--published-resource-selector", testLabel + "=" + e.label}, e.edgeArgs...)...)
}

// apply server-side-applies a typed object to the suite's service cluster.
func apply(t testing.TB, obj runtime.Object) {
	t.Helper()
	applyTo(t, env.service, obj)
}

// publish applies a PublishedResource labelled for this environment.
func (e *pubEnv) publish(t testing.TB, name string, spec ferryv1alpha1.PublishedResourceSpec) {
	t.Helper()
	applyTo(t, e.serviceCluster(), &ferryv1alpha1.PublishedResource{
		TypeMeta:   metav1.TypeMeta{APIVersion: "ferry.dev/v1alpha1", Kind: "PublishedResource"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{testLabel: e.label}},
		Spec:       spec,
	})
}

func (e *pubEnv) waitCondition(t testing.TB, name string, status metav1.ConditionStatus, reason string) *ferryv1alpha1.PublishedResource {
	t.Helper()
	pr, err := framework.WaitPublishedCondition(context.Background(), e.serviceCluster().Config, name, status, reason, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return pr
}

// schemas lists the APIResourceSchemas of this environment's APIExport group
// for plural.
func (e *pubEnv) schemas(t testing.TB, plural string) []apisv1alpha1.APIResourceSchema {
	t.Helper()
	list, err := e.kcp.Cluster(e.path).ApisV1alpha1().APIResourceSchemas().List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []apisv1alpha1.APIResourceSchema
	for _, s := range list.Items {
		if strings.HasSuffix(s.Name, "."+plural+"."+e.export.Name) {
			out = append(out, s)
		}
	}
	return out
}

func (e *pubEnv) apiExport(t testing.TB) *apisv1alpha2.APIExport {
	t.Helper()
	ex, err := e.kcp.Cluster(e.path).ApisV1alpha2().APIExports().Get(context.Background(), e.export.Name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return ex
}

// exportSchema returns the schema the APIExport lists for group/plural, or "".
func exportSchema(ex *apisv1alpha2.APIExport, group, plural string) string {
	for _, r := range ex.Spec.Resources {
		if r.Group == group && r.Name == plural {
			return r.Schema
		}
	}
	return ""
}

// testCRD is a CRD in group with the given versions (the first is the
// storage version); each version's spec has a field named after it, so
// tests can tell the schemas apart.
func testCRD(group, kind, plural string, scope apiextensionsv1.ResourceScope, versions ...string) *apiextensionsv1.CustomResourceDefinition {
	crd := &apiextensionsv1.CustomResourceDefinition{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: plural + "." + group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: group,
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Kind: kind, ListKind: kind + "List", Plural: plural, Singular: strings.ToLower(kind),
				ShortNames: []string{strings.ToLower(kind)[:3]}, Categories: []string{"source-category"},
			},
			Scope: scope,
		},
	}
	for i, v := range versions {
		crd.Spec.Versions = append(crd.Spec.Versions, apiextensionsv1.CustomResourceDefinitionVersion{
			Name: v, Served: true, Storage: i == 0,
			Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
			Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
				Type: "object",
				Properties: map[string]apiextensionsv1.JSONSchemaProps{
					"spec": {Type: "object", XPreserveUnknownFields: ptr(true), Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"field" + strings.ToUpper(v[:1]) + v[1:]: {Type: "string"},
					}},
					"status": {Type: "object", XPreserveUnknownFields: ptr(true)},
				},
			}},
		})
	}
	return crd
}

func ptr[T any](v T) *T { return &v }

// waitPRCondition waits until PublishedResource name's condition of type
// condType has status and reason, and returns its message.
func (e *pubEnv) waitPRCondition(t testing.TB, name, condType string, status metav1.ConditionStatus, reason string) string {
	t.Helper()
	dyn, err := dynamic.NewForConfig(e.serviceCluster().Config)
	if err != nil {
		t.Fatal(err)
	}
	var msg string
	waitFor(t, fmt.Sprintf("PublishedResource %s condition %s %s/%s", name, condType, status, reason), func(ctx context.Context) (bool, string) {
		u, err := dyn.Resource(ferryv1alpha1.GroupVersion.WithResource("publishedresources")).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] == condType {
				msg, _ = m["message"].(string)
				return m["status"] == string(status) && m["reason"] == reason, fmt.Sprintf("%s %s: %s", m["status"], m["reason"], msg)
			}
		}
		return false, "no such condition"
	})
	return msg
}

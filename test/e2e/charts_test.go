package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"

	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/test/framework"
)

const (
	brokerChart = "../../deploy/charts/ferry-broker"
	edgeChart   = "../../deploy/charts/ferry-edge"
)

// customBrokerValues turn on everything optional in the broker chart and
// move every port.
const customBrokerValues = `
image: {repository: example.com/ferry/ferry-broker, tag: v9.9.9, pullPolicy: Always}
grpc: {port: 9443}
service: {type: LoadBalancer, port: 443, loadBalancerSourceRanges: [10.0.0.0/8]}
metrics:
  port: 9090
  serviceMonitor: {enabled: true, labels: {release: prometheus}, interval: 15s, scrapeTimeout: 10s}
health: {port: 9091}
logLevel: 4
pprofBindAddress: 127.0.0.1:6060
extraArgs: ["--in-flight-window=512"]
config:
  edges:
    - identity: spiffe://example.com/ferry/edge/databases-eu
      name: databases
      apiExport: {workspace: "root:databases", name: databases.example.com}
      relatedResources: [secrets, configmaps]
  admins: [spiffe://example.com/ferry/ops]
kcp:
  kubeconfig: |
    apiVersion: v1
    kind: Config
    clusters: [{name: kcp, cluster: {server: "https://kcp.example.com:6443"}}]
    users: [{name: broker, user: {token: not-a-real-token}}]
    contexts: [{name: kcp, context: {cluster: kcp, user: broker}}]
    current-context: kcp
certManager:
  enabled: true
  server: {dnsNames: [ferry.example.com]}
  clients:
    - {name: databases-eu, identity: "spiffe://example.com/ferry/edge/databases-eu"}
    - {name: ops, identity: "spiffe://example.com/ferry/ops"}
podDisruptionBudget: {enabled: true}
nodeSelector: {kubernetes.io/os: linux}
tolerations: [{key: dedicated, operator: Equal, value: kcp, effect: NoSchedule}]
resources: {requests: {cpu: 200m, memory: 256Mi}}
`

// customEdgeValues do the same for the edge chart.
const customEdgeValues = `
replicaCount: 3
brokerAddress: ferry.example.com:443
brokerServerName: ferry.example.com
agentName: databases-eu
publishedResourceSelector: ferry.dev/edge=databases-eu
certManager:
  enabled: true
  issuerRef: {name: ferry-ca, kind: ClusterIssuer}
  identity: spiffe://example.com/ferry/edge/databases-eu
crds: {installByEdge: true}
rbac:
  syncedResources:
    - apiGroups: [demo.example.com]
      resources: [databases, databases/status]
      verbs: [get, list, watch, create, update, patch, delete]
metrics:
  port: 9090
  serviceMonitor: {enabled: true}
health: {port: 9091}
logLevel: debug
extraArgs: ["--reconnect-max-delay=10s"]
`

// minimalEdgeValues are the only values the edge chart requires.
var minimalEdgeValues = []string{"--set", "brokerAddress=ferry-broker.ferry-system.svc:8443"}

func newHelm(t *testing.T) *framework.Helm {
	t.Helper()
	h, err := framework.HelmFromEnv(filepath.Join(testDir(t), "helm"))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// valuesFile writes values for helm -f.
func valuesFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(testDir(t), name)
	writeFile(t, p, content)
	return p
}

func render(t *testing.T, h *framework.Helm, chart, release, namespace string, args ...string) []*unstructured.Unstructured {
	t.Helper()
	objs, err := h.Template(context.Background(), chart, release, namespace, args...)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// TestChartsLint runs helm lint --strict on both charts.
func TestChartsLint(t *testing.T) {
	h := newHelm(t)
	ctx := context.Background()

	// The Makefile's HELM_VERSION (stamped into the binary) is the module
	// test/tools/helm pins.
	mod, err := os.ReadFile("../tools/helm/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	version, err := h.Run(ctx, "version", "--template", "{{.Version}}")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mod), "helm.sh/helm/v3 "+strings.TrimSpace(version)+"\n") {
		t.Errorf("helm reports version %s, test/tools/helm/go.mod pins another: keep HELM_VERSION in the Makefile in step", version)
	}

	for _, c := range []struct {
		chart string
		args  []string
	}{
		{brokerChart, nil},
		{brokerChart, []string{"-f", valuesFile(t, "broker-values.yaml", customBrokerValues)}},
		{edgeChart, minimalEdgeValues},
		{edgeChart, []string{"-f", valuesFile(t, "edge-values.yaml", customEdgeValues)}},
	} {
		out, err := h.Run(ctx, append([]string{"lint", "--strict", c.chart}, c.args...)...)
		if err != nil {
			t.Errorf("%v", err)
			continue
		}
		if !strings.Contains(out, "0 chart(s) failed") {
			t.Errorf("helm lint %s %v:\n%s", c.chart, c.args, out)
		}
	}
}

// TestChartsEdgeCRDIsCurrent: the edge chart's copy of the PublishedResource
// CRD is the generated one.
func TestChartsEdgeCRDIsCurrent(t *testing.T) {
	want, err := os.ReadFile("../../deploy/crd/ferry.dev_publishedresources.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(edgeChart + "/files/ferry.dev_publishedresources.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("deploy/charts/ferry-edge/files/ferry.dev_publishedresources.yaml differs from deploy/crd/ferry.dev_publishedresources.yaml: run make generate")
	}
}

// TestChartsBrokerTemplate renders the broker chart with its defaults and
// with every option changed, and checks what the cluster would run.
func TestChartsBrokerTemplate(t *testing.T) {
	h := newHelm(t)

	t.Run("defaults", func(t *testing.T) {
		objs := render(t, h, brokerChart, "ferry", "ferry-system")
		assertKinds(t, objs, "ConfigMap", "Deployment", "Service", "Service", "ServiceAccount")
		dep := deployment(t, objs, "ferry-ferry-broker")
		c := onlyContainer(t, dep)
		assertArgs(t, c.Args,
			"--listen-address=:8443", "--config=/etc/ferry/config/config.yaml", "--kcp-kubeconfig=/etc/ferry/kcp/kubeconfig",
			"--tls-cert=/etc/ferry/tls/tls.crt", "--tls-key=/etc/ferry/tls/tls.key", "--client-ca=/etc/ferry/client-ca/ca.crt",
			"--metrics-bind-address=:8080", "--health-probe-bind-address=:8081", "--zap-log-level=info")
		assertNoArgPrefix(t, c.Args, "--pprof-bind-address")
		// No signing CA without cert-manager or enrolment.signingSecret:
		// enrolment is off.
		assertNoArgPrefix(t, c.Args, "--edge-signing-cert")
		assertArgs(t, c.Args, "--state-namespace=default")
		assertPorts(t, c, map[string]int32{"grpc": 8443, "metrics": 8080, "health": 8081})
		assertProbes(t, c)
		assertRestricted(t, dep)
		assertFlagsKnown(t, env.bins.Broker, c.Args)
		if *dep.Spec.Replicas != 1 || dep.Spec.Strategy.Type != appsv1.RecreateDeploymentStrategyType {
			t.Errorf("replicas %d, strategy %s: want one broker, replaced (Recreate)", *dep.Spec.Replicas, dep.Spec.Strategy.Type)
		}
		if dep.Spec.Template.Spec.AutomountServiceAccountToken == nil || *dep.Spec.Template.Spec.AutomountServiceAccountToken {
			t.Error("the broker pod mounts a service account token; it never talks to its own cluster")
		}
		assertVolumeSecret(t, dep, "kcp", "ferry-broker-kcp")
		assertVolumeSecret(t, dep, "tls", "ferry-broker-tls")
		assertVolumeSecret(t, dep, "client-ca", "ferry-broker-tls")
		svc := service(t, objs, "ferry-ferry-broker")
		if p := svc.Spec.Ports; len(p) != 1 || p[0].Port != 8443 || p[0].TargetPort.StrVal != "grpc" || svc.Spec.Type != corev1.ServiceTypeClusterIP {
			t.Errorf("gRPC Service %s ports %+v, want ClusterIP 8443 -> grpc only", svc.Spec.Type, p)
		}
		if p := service(t, objs, "ferry-ferry-broker-metrics").Spec.Ports; len(p) != 1 || p[0].Port != 8080 || p[0].TargetPort.StrVal != "metrics" {
			t.Errorf("metrics Service ports %+v, want 8080 -> metrics", p)
		}
		cfg := loadBrokerConfig(t, objs)
		if len(cfg.Edges) != 0 || len(cfg.Admins) != 0 {
			t.Errorf("default broker config %+v, want empty", cfg)
		}
	})

	t.Run("custom", func(t *testing.T) {
		objs := render(t, h, brokerChart, "kcp-side", "ferry-system", "-f", valuesFile(t, "broker-values.yaml", customBrokerValues))
		assertKinds(t, objs, "Certificate", "Certificate", "Certificate", "Certificate", "ConfigMap", "Deployment", "Issuer", "Issuer",
			"PodDisruptionBudget", "Secret", "Service", "Service", "ServiceAccount", "ServiceMonitor")
		dep := deployment(t, objs, "kcp-side-ferry-broker")
		c := onlyContainer(t, dep)
		if c.Image != "example.com/ferry/ferry-broker:v9.9.9" || c.ImagePullPolicy != corev1.PullAlways {
			t.Errorf("image %s (%s)", c.Image, c.ImagePullPolicy)
		}
		assertArgs(t, c.Args, "--listen-address=:9443", "--metrics-bind-address=:9090", "--health-probe-bind-address=:9091",
			"--zap-log-level=4", "--pprof-bind-address=127.0.0.1:6060", "--in-flight-window=512")
		assertPorts(t, c, map[string]int32{"grpc": 9443, "metrics": 9090, "health": 9091})
		assertProbes(t, c)
		assertRestricted(t, dep)
		assertFlagsKnown(t, env.bins.Broker, c.Args)
		if dep.Spec.Template.Spec.NodeSelector["kubernetes.io/os"] != "linux" || len(dep.Spec.Template.Spec.Tolerations) != 1 {
			t.Errorf("nodeSelector %v tolerations %v", dep.Spec.Template.Spec.NodeSelector, dep.Spec.Template.Spec.Tolerations)
		}
		assertVolumeSecret(t, dep, "kcp", "kcp-side-ferry-broker-kcp")
		assertVolumeSecret(t, dep, "tls", "kcp-side-ferry-broker-tls")
		assertVolumeSecret(t, dep, "client-ca", "kcp-side-ferry-broker-tls")
		if dep.Spec.Template.Annotations["checksum/config"] == "" || dep.Spec.Template.Annotations["checksum/kcp"] == "" {
			t.Errorf("pod annotations %v: want checksums of the configuration and the kubeconfig (a change restarts the broker)", dep.Spec.Template.Annotations)
		}
		var kcpSecret corev1.Secret
		convert(t, find(t, objs, "Secret", "kcp-side-ferry-broker-kcp"), &kcpSecret)
		if !strings.Contains(string(kcpSecret.Data["kubeconfig"]), "https://kcp.example.com:6443") {
			t.Errorf("kcp Secret data %q", kcpSecret.Data)
		}
		svc := service(t, objs, "kcp-side-ferry-broker")
		if p := svc.Spec.Ports; svc.Spec.Type != corev1.ServiceTypeLoadBalancer || p[0].Port != 443 || p[0].TargetPort.StrVal != "grpc" {
			t.Errorf("gRPC Service %s ports %+v", svc.Spec.Type, p)
		}
		if p := service(t, objs, "kcp-side-ferry-broker-metrics").Spec; p.Type != corev1.ServiceTypeClusterIP || p.Ports[0].Port != 9090 {
			t.Errorf("metrics Service %s %+v: want ClusterIP on 9090 (never exposed with the gRPC Service)", p.Type, p.Ports)
		}

		cfg := loadBrokerConfig(t, objs)
		if len(cfg.Edges) != 1 || cfg.Edges[0].Identity != "spiffe://example.com/ferry/edge/databases-eu" || cfg.Edges[0].ResolvedName() != "databases" ||
			len(cfg.Admins) != 1 {
			t.Errorf("broker config %+v", cfg)
		}

		// cert-manager: a CA chain, the server certificate with the
		// Service's names, client certificates with the identity as URI SAN.
		server := find(t, objs, "Certificate", "kcp-side-ferry-broker-tls")
		dnsNames, _, _ := unstructured.NestedStringSlice(server.Object, "spec", "dnsNames")
		for _, want := range []string{"kcp-side-ferry-broker.ferry-system.svc", "ferry.example.com"} {
			if !slices.Contains(dnsNames, want) {
				t.Errorf("server certificate dnsNames %v lack %s", dnsNames, want)
			}
		}
		assertUsages(t, server, "server auth")
		if name, _, _ := unstructured.NestedString(server.Object, "spec", "issuerRef", "name"); name != "kcp-side-ferry-broker-ca" {
			t.Errorf("server certificate issuer %q, want the chart's CA issuer", name)
		}
		client := find(t, objs, "Certificate", "kcp-side-ferry-broker-client-databases-eu")
		if uris, _, _ := unstructured.NestedStringSlice(client.Object, "spec", "uris"); !slices.Equal(uris, []string{"spiffe://example.com/ferry/edge/databases-eu"}) {
			t.Errorf("client certificate URIs %v", uris)
		}
		assertUsages(t, client, "client auth")
		if isCA, _, _ := unstructured.NestedBool(find(t, objs, "Certificate", "kcp-side-ferry-broker-ca").Object, "spec", "isCA"); !isCA {
			t.Error("the CA certificate is not a CA")
		}
		assertServiceMonitor(t, objs, "kcp-side-ferry-broker", "15s")
	})

	t.Run("replicas", func(t *testing.T) {
		objs := render(t, h, brokerChart, "ferry", "ferry-system", "--set", "replicaCount=3", "--set", "podDisruptionBudget.enabled=true",
			"--set", "replication.leaseDuration=20s", "--set", "replication.leaseWorkspace=root:ferry")
		dep := deployment(t, objs, "ferry-ferry-broker")
		c := onlyContainer(t, dep)
		if *dep.Spec.Replicas != 3 || dep.Spec.Strategy.Type != appsv1.RollingUpdateDeploymentStrategyType ||
			dep.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 0 {
			t.Errorf("replicas %d, strategy %+v: want 3, rolling with none unavailable", *dep.Spec.Replicas, dep.Spec.Strategy)
		}
		assertArgs(t, c.Args, "--replica-address=$(POD_IP):8443", "--ownership-lease-namespace=default", "--ownership-lease-duration=20s",
			"--replica-lease-workspace=root:ferry")
		assertFlagsKnown(t, env.bins.Broker, c.Args)
		if !slices.ContainsFunc(c.Env, func(e corev1.EnvVar) bool {
			return e.Name == "POD_IP" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "status.podIP"
		}) {
			t.Errorf("env %+v lacks POD_IP from the downward API", c.Env)
		}
		find(t, objs, "PodDisruptionBudget", "ferry-ferry-broker")
		// One replica: no ownership flags (it serves every export).
		single := onlyContainer(t, deployment(t, render(t, h, brokerChart, "ferry", "ferry-system"), "ferry-ferry-broker"))
		assertNoArgPrefix(t, single.Args, "--replica-address")
	})
}

// TestChartsEdgeTemplate does the same for the edge chart.
func TestChartsEdgeTemplate(t *testing.T) {
	h := newHelm(t)

	t.Run("defaults", func(t *testing.T) {
		objs := render(t, h, edgeChart, "ferry-edge", "ferry-system", minimalEdgeValues...)
		assertKinds(t, objs, "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Deployment", "PodDisruptionBudget",
			"Role", "RoleBinding", "Service", "ServiceAccount")
		dep := deployment(t, objs, "ferry-edge")
		if *dep.Spec.Replicas != 2 {
			t.Errorf("replicas %d, want 2 (a leader and a standby)", *dep.Spec.Replicas)
		}
		c := onlyContainer(t, dep)
		assertArgs(t, c.Args,
			"--broker-address=ferry-broker.ferry-system.svc:8443", "--broker-ca=/etc/ferry/broker-ca/ca.crt",
			"--tls-cert=/etc/ferry/tls/tls.crt", "--tls-key=/etc/ferry/tls/tls.key", "--agent-name=ferry-edge",
			"--install-crds=false", "--leader-elect=true", "--leader-election-namespace=ferry-system",
			"--metrics-bind-address=:8090", "--health-probe-bind-address=:8091", "--zap-log-level=info")
		assertPorts(t, c, map[string]int32{"metrics": 8090, "health": 8091})
		assertProbes(t, c)
		assertRestricted(t, dep)
		assertFlagsKnown(t, env.bins.Edge, c.Args)
		assertPodNameEnv(t, c)
		assertVolumeSecret(t, dep, "tls", "ferry-edge-tls")
		assertVolumeSecret(t, dep, "broker-ca", "ferry-edge-tls")
		var pdb policyv1.PodDisruptionBudget
		convert(t, find(t, objs, "PodDisruptionBudget", "ferry-edge"), &pdb)
		if pdb.Spec.MaxUnavailable == nil || pdb.Spec.MaxUnavailable.IntValue() != 1 ||
			!reflect.DeepEqual(pdb.Spec.Selector.MatchLabels, dep.Spec.Selector.MatchLabels) {
			t.Errorf("PodDisruptionBudget %+v, want maxUnavailable 1 over the Deployment's pods", pdb.Spec)
		}

		// The CRD is the generated one, kept on uninstall.
		crd := find(t, objs, "CustomResourceDefinition", "publishedresources.ferry.dev")
		if crd.GetAnnotations()["helm.sh/resource-policy"] != "keep" {
			t.Errorf("CRD annotations %v: want helm.sh/resource-policy keep", crd.GetAnnotations())
		}
		generated := decodeFile(t, "../../deploy/crd/ferry.dev_publishedresources.yaml")
		if len(generated) != 1 || !reflect.DeepEqual(crd.Object["spec"], generated[0].Object["spec"]) {
			t.Error("the chart's PublishedResource CRD spec differs from deploy/crd/ferry.dev_publishedresources.yaml")
		}

		// RBAC: deploy/edge/edge.yaml's rules (which the e2e tests run a
		// least-privilege edge with, see limitedKubeconfig), minus creating
		// and patching CRDs: the chart installs the CRD itself.
		manifest := decodeFile(t, "../../deploy/edge/edge.yaml")
		want := rules(t, find(t, manifest, "ClusterRole", "ferry-edge"))
		for i, r := range want {
			if slices.Contains(r.Resources, "customresourcedefinitions") {
				want[i].Verbs = slices.DeleteFunc(slices.Clone(r.Verbs), func(v string) bool { return v == "create" || v == "patch" })
			}
		}
		if got := rules(t, find(t, objs, "ClusterRole", "ferry-edge")); !reflect.DeepEqual(got, want) {
			t.Errorf("ClusterRole rules\n got %+v\nwant %+v", got, want)
		}
		role := find(t, objs, "Role", "ferry-edge-leader-election")
		if role.GetNamespace() != "ferry-system" || !reflect.DeepEqual(rules(t, role), rules(t, find(t, manifest, "Role", "ferry-edge-leader-election"))) {
			t.Errorf("leader election Role %s/%s rules %+v differ from deploy/edge/edge.yaml's", role.GetNamespace(), role.GetName(), rules(t, role))
		}
	})

	t.Run("custom", func(t *testing.T) {
		objs := render(t, h, edgeChart, "svc-side", "ferry-edge", "-f", valuesFile(t, "edge-values.yaml", customEdgeValues))
		assertKinds(t, objs, "Certificate", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "Deployment",
			"PodDisruptionBudget", "Role", "RoleBinding", "Service", "ServiceAccount", "ServiceMonitor")
		dep := deployment(t, objs, "svc-side-ferry-edge")
		if *dep.Spec.Replicas != 3 {
			t.Errorf("replicas %d, want 3", *dep.Spec.Replicas)
		}
		c := onlyContainer(t, dep)
		assertArgs(t, c.Args, "--broker-address=ferry.example.com:443", "--broker-server-name=ferry.example.com",
			"--agent-name=databases-eu", "--published-resource-selector=ferry.dev/edge=databases-eu", "--install-crds=true",
			"--leader-election-namespace=ferry-edge", "--metrics-bind-address=:9090", "--health-probe-bind-address=:9091",
			"--zap-log-level=debug", "--reconnect-max-delay=10s")
		assertPorts(t, c, map[string]int32{"metrics": 9090, "health": 9091})
		assertProbes(t, c)
		assertRestricted(t, dep)
		assertFlagsKnown(t, env.bins.Edge, c.Args)
		assertPodNameEnv(t, c)
		assertVolumeSecret(t, dep, "tls", "svc-side-ferry-edge-tls")

		cert := find(t, objs, "Certificate", "svc-side-ferry-edge-tls")
		if uris, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "uris"); !slices.Equal(uris, []string{"spiffe://example.com/ferry/edge/databases-eu"}) {
			t.Errorf("client certificate URIs %v", uris)
		}
		if kind, _, _ := unstructured.NestedString(cert.Object, "spec", "issuerRef", "kind"); kind != "ClusterIssuer" {
			t.Errorf("client certificate issuer kind %q", kind)
		}
		assertUsages(t, cert, "client auth")

		got := rules(t, find(t, objs, "ClusterRole", "svc-side-ferry-edge"))
		if !slices.ContainsFunc(got, func(r rbacv1.PolicyRule) bool {
			return slices.Equal(r.APIGroups, []string{"demo.example.com"}) && slices.Equal(r.Resources, []string{"databases", "databases/status"}) && slices.Contains(r.Verbs, "delete")
		}) {
			t.Errorf("ClusterRole rules %+v lack rbac.syncedResources", got)
		}
		if !slices.ContainsFunc(got, func(r rbacv1.PolicyRule) bool {
			return slices.Contains(r.Resources, "customresourcedefinitions") && slices.Contains(r.Verbs, "create")
		}) {
			t.Errorf("ClusterRole rules %+v: crds.installByEdge needs create on CRDs", got)
		}
		assertServiceMonitor(t, objs, "svc-side-ferry-edge", "30s")
	})
}

// TestChartsEdgeEnrolment: with enrolment.enabled the edge gets a token
// file, the fingerprint and its credentials Secret instead of certificate
// files; the token Secret is optional.
func TestChartsEdgeEnrolment(t *testing.T) {
	h := newHelm(t)
	const fp = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	objs := render(t, h, edgeChart, "ferry-edge", "ferry-system", append(slices.Clone(minimalEdgeValues),
		"--set", "enrolment.enabled=true", "--set", "enrolment.brokerCAFingerprint="+fp)...)
	dep := deployment(t, objs, "ferry-edge")
	c := onlyContainer(t, dep)
	assertArgs(t, c.Args, "--enrolment-token-file=/etc/ferry/enrolment/token", "--broker-ca-fingerprint="+fp,
		"--credentials-secret=ferry-system/ferry-edge-credentials")
	for _, a := range c.Args {
		if strings.HasPrefix(a, "--tls-cert") || strings.HasPrefix(a, "--broker-ca=") {
			t.Errorf("an enrolling edge got %s", a)
		}
	}
	assertFlagsKnown(t, env.bins.Edge, c.Args)
	assertVolumeSecret(t, dep, "enrolment-token", "ferry-edge-enrolment-token")
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Name == "enrolment-token" && (v.Secret.Optional == nil || !*v.Secret.Optional) {
			t.Error("the token Secret is not optional: deleting it after enrolment would stop new pods")
		}
		if v.Name == "tls" {
			t.Error("an enrolling edge mounts a certificate Secret")
		}
	}
	for _, bad := range [][]string{
		{"--set", "enrolment.enabled=true"},
		{"--set", "enrolment.enabled=true", "--set", "enrolment.brokerCAFingerprint=sha256:abc"},
		{"--set", "enrolment.enabled=true", "--set", "enrolment.brokerCAFingerprint=" + fp, "--set", "certManager.enabled=true",
			"--set", "certManager.issuerRef.name=x", "--set", "certManager.identity=spiffe://x"},
	} {
		args := append([]string{"template", "ferry-edge", edgeChart, "-n", "ferry-system"}, append(slices.Clone(minimalEdgeValues), bad...)...)
		if _, err := h.Run(context.Background(), args...); err == nil || !strings.Contains(err.Error(), "enrolment") {
			t.Errorf("helm %v: %v, want a refusal naming enrolment", bad, err)
		}
	}
}

// TestChartsBrokerEnrolment: enrolment.signingCASecret mounts the signing
// CA and passes the enrolment flags; without it none are passed.
func TestChartsBrokerEnrolment(t *testing.T) {
	h := newHelm(t)
	off := onlyContainer(t, deployment(t, render(t, h, brokerChart, "ferry", "ferry-system"), "ferry-ferry-broker"))
	for _, a := range off.Args {
		if strings.HasPrefix(a, "--edge-signing") || strings.HasPrefix(a, "--broker-ca") {
			t.Errorf("enrolment is off by default, but the broker got %s", a)
		}
	}
	objs := render(t, h, brokerChart, "ferry", "ferry-system", "--set", "enrolment.signingCASecret=edge-ca",
		"--set", "enrolment.certificateLifetime=2h", "--set", "enrolment.brokerCA.existingSecret=broker-ca")
	dep := deployment(t, objs, "ferry-ferry-broker")
	c := onlyContainer(t, dep)
	assertArgs(t, c.Args, "--edge-signing-cert=/etc/ferry/edge-signing-ca/tls.crt", "--edge-signing-key=/etc/ferry/edge-signing-ca/tls.key",
		"--edge-certificate-lifetime=2h", "--enrolment-token-ttl=1h", "--broker-ca=/etc/ferry/broker-ca/ca.crt")
	assertFlagsKnown(t, env.bins.Broker, c.Args)
	assertVolumeSecret(t, dep, "edge-signing-ca", "edge-ca")
	assertVolumeSecret(t, dep, "broker-ca", "broker-ca")
}

// TestChartsRejectBadValues: the values schemas and the charts' own checks
// refuse bad values with a message that names the value.
func TestChartsRejectBadValues(t *testing.T) {
	h := newHelm(t)
	ctx := context.Background()
	for _, c := range []struct {
		name  string
		cmd   string
		chart string
		args  []string
		want  string
	}{
		{"edge without brokerAddress", "template", edgeChart, nil, "missing property 'brokerAddress'"},
		{"edge brokerAddress without port", "template", edgeChart, []string{"--set", "brokerAddress=ferry.example.com"}, "at '/brokerAddress': 'ferry.example.com' does not match pattern"},
		{"replicas not a number", "template", edgeChart, append([]string{"--set", "replicaCount=two"}, minimalEdgeValues...), "at '/replicaCount': got string, want integer"},
		{"bad log level", "template", brokerChart, []string{"--set", "logLevel=verbose"}, "at '/logLevel': 'verbose' does not match pattern"},
		{"port out of range", "template", brokerChart, []string{"--set", "grpc.port=70000"}, "at '/grpc/port': maximum: got 70,000, want 65,535"},
		{"unknown value", "template", brokerChart, []string{"--set", "replicas=3"}, "additional properties 'replicas' not allowed"},
		{"edge entry without apiExport", "template", brokerChart, []string{"--set", "config.edges[0].identity=spiffe://example.com/e"}, "at '/config/edges/0': missing property 'apiExport'"},
		{"lint: bad log level", "lint", edgeChart, append([]string{"--set", "logLevel=loud"}, minimalEdgeValues...), "at '/logLevel': 'loud' does not match pattern"},
		{"same port twice", "template", brokerChart, []string{"--set", "metrics.port=8081"}, "grpc.port (8443), metrics.port (8081) and health.port (8081) must differ"},
		{"cert-manager without issuer", "template", edgeChart, append([]string{"--set", "certManager.enabled=true", "--set", "certManager.identity=spiffe://example.com/e"}, minimalEdgeValues...),
			"certManager.enabled needs certManager.issuerRef.name"},
		{"replicas without leader election", "template", edgeChart, append([]string{"--set", "leaderElection.enabled=false"}, minimalEdgeValues...),
			"replicaCount above 1 needs leaderElection.enabled"},
		{"no kcp credentials", "template", brokerChart, []string{"--set", "kcp.existingSecret="}, "set kcp.kubeconfig (the kubeconfig's content) or kcp.existingSecret"},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := []string{c.cmd, c.chart}
			if c.cmd == "template" {
				args = []string{"template", "bad", c.chart}
			}
			out, err := h.Run(ctx, append(args, c.args...)...)
			if err == nil {
				t.Fatalf("helm %s accepted the values:\n%s", c.cmd, out)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("helm %s failed with\n%v\nwant a message containing %q", c.cmd, err, c.want)
			}
		})
	}
}

// TestChartsApply applies the rendered charts, with default and with custom
// values, to the real service cluster in a namespace of the test's own that
// enforces the restricted Pod Security Standard: the API server validates
// every object strictly (unknown fields are errors) and warns about any pod
// template the restricted profile would refuse. cert-manager and the
// Prometheus operator are not installed; minimal stand-ins for their CRDs
// (testdata/chart-dependency-crds.yaml) let their objects be validated too.
// The PublishedResource CRD is applied as a dry run only: it is shared with
// the edges the other tests run. Nothing runs the Deployments here (no
// controller manager); TestChartsBrokerTemplate and TestChartsEdgeTemplate
// check what they would run.
func TestChartsApply(t *testing.T) {
	ctx := context.Background()
	h := newHelm(t)
	suffix := rand.String(5)
	ns := "charts-" + suffix

	warnings := &warningRecorder{}
	cfg := rest.CopyConfig(env.service.Config)
	cfg.WarningHandler = warnings
	kube := kubernetes.NewForConfigOrDie(cfg)
	dyn := dynamic.NewForConfigOrDie(cfg)

	// Stand-in CRDs for the optional kinds (removed afterwards unless they
	// were there before).
	for _, crd := range decodeFile(t, "testdata/chart-dependency-crds.yaml") {
		if _, err := dyn.Resource(crdResource).Get(ctx, crd.GetName(), metav1.GetOptions{}); err == nil {
			continue
		}
		if err := framework.Apply(ctx, env.service.Config, crd); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = dyn.Resource(crdResource).Delete(context.Background(), crd.GetName(), metav1.DeleteOptions{})
		})
		waitEstablished(t, dyn, crd.GetName())
	}

	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: map[string]string{
		"pod-security.kubernetes.io/enforce": "restricted",
		"pod-security.kubernetes.io/warn":    "restricted",
	}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kube.CoreV1().Namespaces().Delete(context.Background(), ns, metav1.DeleteOptions{}) })

	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(discovery.NewDiscoveryClientForConfigOrDie(cfg)))
	releases := []struct {
		release, chart string
		args           []string
	}{
		{"b-" + suffix, brokerChart, nil},
		{"bc-" + suffix, brokerChart, []string{"-f", valuesFile(t, "broker-values.yaml", customBrokerValues)}},
		{"e-" + suffix, edgeChart, minimalEdgeValues},
		{"ec-" + suffix, edgeChart, []string{"-f", valuesFile(t, "edge-values.yaml", customEdgeValues)}},
	}
	for _, r := range releases {
		objs := render(t, h, r.chart, r.release, ns, r.args...)
		for _, obj := range objs {
			if !obj.GroupVersionKind().Empty() && obj.GetNamespace() == "" && obj.GetKind() != "CustomResourceDefinition" {
				// Cluster-scoped (ClusterRole, ClusterRoleBinding): named after
				// the release; removed by the release label.
				t.Cleanup(func() { deleteClusterScoped(dyn, mapper, obj) })
			}
			dryRun := obj.GetKind() == "CustomResourceDefinition"
			before := warnings.count()
			if err := applyChecked(ctx, dyn, mapper, obj, dryRun); err != nil {
				t.Errorf("%s: %s %s rejected: %v", r.release, obj.GetKind(), obj.GetName(), err)
			}
			if w := warnings.since(before); len(w) > 0 {
				t.Errorf("%s: %s %s: the API server warned: %q", r.release, obj.GetKind(), obj.GetName(), w)
			}
		}
		t.Logf("%s: applied %d objects of %s", r.release, len(objs), filepath.Base(r.chart))
	}

	// The restricted profile is checked for real: a pod template that
	// allows privilege escalation draws a warning.
	insecure := render(t, h, edgeChart, "insecure-"+suffix, ns, append([]string{"--set", "securityContext.allowPrivilegeEscalation=true"}, minimalEdgeValues...)...)
	before := warnings.count()
	if err := applyChecked(ctx, dyn, mapper, find(t, insecure, "Deployment", "insecure-"+suffix+"-ferry-edge"), true); err != nil {
		t.Fatal(err)
	}
	if w := warnings.since(before); !slices.ContainsFunc(w, func(s string) bool { return strings.Contains(s, `violate PodSecurity "restricted`) }) {
		t.Errorf("a pod template allowing privilege escalation drew warnings %q, want a PodSecurity warning (else the check above proves nothing)", w)
	}

	// The edge's RBAC, as the API server's authorizer sees it.
	for _, c := range []struct {
		release string
		attrs   authorizationv1.ResourceAttributes
		allowed bool
	}{
		{"e-" + suffix, authorizationv1.ResourceAttributes{Namespace: ns, Verb: "update", Group: "coordination.k8s.io", Resource: "leases"}, true},
		{"e-" + suffix, authorizationv1.ResourceAttributes{Namespace: "kube-system", Verb: "update", Group: "coordination.k8s.io", Resource: "leases"}, false},
		{"e-" + suffix, authorizationv1.ResourceAttributes{Verb: "watch", Group: "ferry.dev", Resource: "publishedresources"}, true},
		{"e-" + suffix, authorizationv1.ResourceAttributes{Verb: "update", Group: "ferry.dev", Resource: "publishedresources", Subresource: "status"}, true},
		{"e-" + suffix, authorizationv1.ResourceAttributes{Verb: "create", Group: "", Resource: "namespaces"}, true},
		{"e-" + suffix, authorizationv1.ResourceAttributes{Verb: "delete", Group: "", Resource: "namespaces"}, false},
		{"e-" + suffix, authorizationv1.ResourceAttributes{Verb: "create", Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"}, false},
		{"e-" + suffix, authorizationv1.ResourceAttributes{Namespace: "default", Verb: "patch", Group: "demo.example.com", Resource: "databases"}, false},
		{"ec-" + suffix, authorizationv1.ResourceAttributes{Verb: "create", Group: "apiextensions.k8s.io", Resource: "customresourcedefinitions"}, true},
		{"ec-" + suffix, authorizationv1.ResourceAttributes{Namespace: "default", Verb: "patch", Group: "demo.example.com", Resource: "databases"}, true},
		{"ec-" + suffix, authorizationv1.ResourceAttributes{Namespace: "default", Verb: "update", Group: "demo.example.com", Resource: "databases", Subresource: "status"}, true},
	} {
		user := "system:serviceaccount:" + ns + ":" + c.release + "-ferry-edge"
		attrs := c.attrs
		err := framework.Eventually(ctx, 30*time.Second, 200*time.Millisecond, func(ctx context.Context) (bool, string) {
			sar, err := kube.AuthorizationV1().SubjectAccessReviews().Create(ctx, &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
				User: user, Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + ns, "system:authenticated"}, ResourceAttributes: &attrs,
			}}, metav1.CreateOptions{})
			if err != nil {
				return false, err.Error()
			}
			return sar.Status.Allowed == c.allowed, fmt.Sprintf("allowed=%t (%s)", sar.Status.Allowed, sar.Status.Reason)
		})
		if err != nil {
			t.Errorf("%s %+v: want allowed=%t: %v", user, attrs, c.allowed, err)
		}
	}
}

var crdResource = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// applyChecked server-side-applies obj with strict field validation, as a
// dry run when asked.
func applyChecked(ctx context.Context, dyn dynamic.Interface, mapper meta.ResettableRESTMapper, obj *unstructured.Unstructured, dryRun bool) error {
	gvk := obj.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if meta.IsNoMatchError(err) {
		mapper.Reset()
		m, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	}
	if err != nil {
		return err
	}
	data, err := yaml.Marshal(obj.Object)
	if err != nil {
		return err
	}
	opts := metav1.PatchOptions{FieldManager: "ferry-charts-test", Force: ptr(true), FieldValidation: "Strict"}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	_, err = dyn.Resource(m.Resource).Namespace(obj.GetNamespace()).Patch(ctx, obj.GetName(), types.ApplyYAMLPatchType, data, opts)
	return err
}

func deleteClusterScoped(dyn dynamic.Interface, mapper meta.RESTMapper, obj *unstructured.Unstructured) {
	gvk := obj.GroupVersionKind()
	m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return
	}
	if err := dyn.Resource(m.Resource).Delete(context.Background(), obj.GetName(), metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		fmt.Fprintf(os.Stderr, "cleanup: cannot delete %s %s: %v\n", gvk.Kind, obj.GetName(), err)
	}
}

// warningRecorder keeps the API server's warnings (rest.WarningHandler).
type warningRecorder struct {
	mu       sync.Mutex
	messages []string
}

func (w *warningRecorder) HandleWarningHeader(_ int, _ string, message string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.messages = append(w.messages, message)
}

func (w *warningRecorder) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.messages)
}

func (w *warningRecorder) since(n int) []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.messages[n:])
}

// --- helpers for rendered manifests ---

func decodeFile(t *testing.T, path string) []*unstructured.Unstructured {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	objs, err := framework.DecodeYAML(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return objs
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s among %s", kind, name, strings.Join(kindNames(objs), ", "))
	return nil
}

func kindNames(objs []*unstructured.Unstructured) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.GetKind()+"/"+o.GetName())
	}
	return out
}

func assertKinds(t *testing.T, objs []*unstructured.Unstructured, want ...string) {
	t.Helper()
	var got []string
	for _, o := range objs {
		got = append(got, o.GetKind())
	}
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("rendered %s\nwant kinds %v", strings.Join(kindNames(objs), ", "), want)
	}
}

func convert(t *testing.T, u *unstructured.Unstructured, into any) {
	t.Helper()
	if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(u.Object, into, true); err != nil {
		t.Fatalf("%s %s: %v", u.GetKind(), u.GetName(), err)
	}
}

func deployment(t *testing.T, objs []*unstructured.Unstructured, name string) *appsv1.Deployment {
	t.Helper()
	var d appsv1.Deployment
	convert(t, find(t, objs, "Deployment", name), &d)
	return &d
}

func service(t *testing.T, objs []*unstructured.Unstructured, name string) *corev1.Service {
	t.Helper()
	var s corev1.Service
	convert(t, find(t, objs, "Service", name), &s)
	return &s
}

func rules(t *testing.T, role *unstructured.Unstructured) []rbacv1.PolicyRule {
	t.Helper()
	var r rbacv1.ClusterRole // a Role's rules have the same shape
	convert(t, role, &r)
	return r.Rules
}

func onlyContainer(t *testing.T, d *appsv1.Deployment) *corev1.Container {
	t.Helper()
	if n := len(d.Spec.Template.Spec.Containers); n != 1 {
		t.Fatalf("%d containers, want 1", n)
	}
	return &d.Spec.Template.Spec.Containers[0]
}

func assertArgs(t *testing.T, args []string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !slices.Contains(args, w) {
			t.Errorf("args %q lack %q", args, w)
		}
	}
}

func assertNoArgPrefix(t *testing.T, args []string, prefix string) {
	t.Helper()
	for _, a := range args {
		if strings.HasPrefix(a, prefix) {
			t.Errorf("args have %q", a)
		}
	}
}

func assertPorts(t *testing.T, c *corev1.Container, want map[string]int32) {
	t.Helper()
	got := map[string]int32{}
	for _, p := range c.Ports {
		got[p.Name] = p.ContainerPort
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("container ports %v, want %v", got, want)
	}
}

// assertProbes: liveness on /healthz and readiness on /readyz, both at the
// port named health (assertPorts checks its number).
func assertProbes(t *testing.T, c *corev1.Container) {
	t.Helper()
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"liveness", c.LivenessProbe, "/healthz"}, {"readiness", c.ReadinessProbe, "/readyz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("no HTTP %s probe", p.name)
			continue
		}
		if g := p.probe.HTTPGet; g.Path != p.path || g.Port.StrVal != "health" {
			t.Errorf("%s probe %s on port %s, want %s on port health", p.name, g.Path, g.Port.String(), p.path)
		}
	}
}

// assertRestricted: the pod and container security contexts the restricted
// Pod Security Standard asks for, plus a read-only root file system.
func assertRestricted(t *testing.T, d *appsv1.Deployment) {
	t.Helper()
	pod := d.Spec.Template.Spec.SecurityContext
	if pod == nil || pod.RunAsNonRoot == nil || !*pod.RunAsNonRoot || pod.RunAsUser == nil || *pod.RunAsUser == 0 ||
		pod.SeccompProfile == nil || pod.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("pod securityContext %+v: want runAsNonRoot, a non-zero runAsUser and seccomp RuntimeDefault", pod)
	}
	c := onlyContainer(t, d).SecurityContext
	if c == nil || c.AllowPrivilegeEscalation == nil || *c.AllowPrivilegeEscalation || c.ReadOnlyRootFilesystem == nil || !*c.ReadOnlyRootFilesystem ||
		c.Capabilities == nil || !slices.Equal(c.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(c.Capabilities.Add) > 0 ||
		c.RunAsNonRoot == nil || !*c.RunAsNonRoot {
		t.Errorf("container securityContext %+v: want no privilege escalation, a read-only root, ALL capabilities dropped, non-root", c)
	}
}

// assertFlagsKnown runs the binary with the rendered args and --help last:
// pflag parses every flag before it reaches --help, so an unknown flag or a
// value of the wrong type fails here instead of in a crash-looping pod.
func assertFlagsKnown(t *testing.T, binary string, args []string) {
	t.Helper()
	out, err := exec.Command(binary, append(slices.Clone(args), "--help")...).CombinedOutput()
	if err != nil {
		t.Errorf("%s does not accept the rendered args %q: %v\n%s", filepath.Base(binary), args, err, out)
	}
}

func assertPodNameEnv(t *testing.T, c *corev1.Container) {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == "POD_NAME" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name" {
			return
		}
	}
	t.Errorf("env %+v lacks POD_NAME from metadata.name (the leader election identity)", c.Env)
}

func assertVolumeSecret(t *testing.T, d *appsv1.Deployment, volume, secret string) {
	t.Helper()
	for _, v := range d.Spec.Template.Spec.Volumes {
		if v.Name == volume {
			if v.Secret == nil || v.Secret.SecretName != secret {
				t.Errorf("volume %s: %+v, want Secret %s", volume, v.VolumeSource, secret)
			}
			return
		}
	}
	t.Errorf("no volume %s", volume)
}

func assertUsages(t *testing.T, cert *unstructured.Unstructured, want string) {
	t.Helper()
	if usages, _, _ := unstructured.NestedStringSlice(cert.Object, "spec", "usages"); !slices.Contains(usages, want) {
		t.Errorf("Certificate %s usages %v lack %q", cert.GetName(), usages, want)
	}
}

func assertServiceMonitor(t *testing.T, objs []*unstructured.Unstructured, name, interval string) {
	t.Helper()
	sm := find(t, objs, "ServiceMonitor", name)
	endpoints, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(endpoints) != 1 {
		t.Fatalf("ServiceMonitor endpoints %v", endpoints)
	}
	ep := endpoints[0].(map[string]any)
	if ep["port"] != "metrics" || ep["path"] != "/metrics" || ep["interval"] != interval {
		t.Errorf("ServiceMonitor endpoint %v, want port metrics, path /metrics, interval %s", ep, interval)
	}
	sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	svc := find(t, objs, "Service", name+"-metrics")
	for k, v := range sel {
		if svc.GetLabels()[k] != v {
			t.Errorf("ServiceMonitor selects %s=%s; the metrics Service has labels %v", k, v, svc.GetLabels())
		}
	}
}

// loadBrokerConfig loads the rendered ConfigMap's config.yaml the way the
// broker does.
func loadBrokerConfig(t *testing.T, objs []*unstructured.Unstructured) *config.Config {
	t.Helper()
	var cm *unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == "ConfigMap" {
			cm = o
		}
	}
	if cm == nil {
		t.Fatal("no ConfigMap rendered")
	}
	data, _, _ := unstructured.NestedString(cm.Object, "data", "config.yaml")
	p := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, p, data)
	cfg, err := config.Load(p)
	if err != nil {
		t.Fatalf("the broker would refuse the rendered configuration: %v\n%s", err, data)
	}
	return cfg
}

func waitEstablished(t *testing.T, dyn dynamic.Interface, name string) {
	t.Helper()
	err := framework.Eventually(context.Background(), 30*time.Second, 100*time.Millisecond, func(ctx context.Context) (bool, string) {
		crd, err := dyn.Resource(crdResource).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		conds, _, _ := unstructured.NestedSlice(crd.Object, "status", "conditions")
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
				return true, ""
			}
		}
		return false, "not established"
	})
	if err != nil {
		t.Fatalf("CRD %s: %v", name, err)
	}
}

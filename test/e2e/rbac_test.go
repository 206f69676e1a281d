package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rbacv1 "k8s.io/api/rbac/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/test/framework"
)

// limitedEdgeUser is the user a least-privilege edge runs as (through
// impersonation by the harness's admin credentials).
const limitedEdgeUser = "e2e-limited-edge"

// limitedKubeconfig grants limitedEdgeUser the rules of deploy/edge/edge.yaml
// (its ClusterRole and its leader election Role) plus full access to the
// resources in extra, and returns a kubeconfig acting as that user.
func limitedKubeconfig(t testing.TB, extra ...rbacv1.PolicyRule) string {
	t.Helper()
	f, err := os.Open("../../deploy/edge/edge.yaml")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	objs, err := framework.DecodeYAML(f)
	if err != nil {
		t.Fatal(err)
	}
	subject := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: limitedEdgeUser}}
	var rbac []runtime.Object
	for _, obj := range objs {
		if obj.GetKind() != "ClusterRole" && obj.GetKind() != "Role" {
			continue
		}
		var role struct {
			Rules []rbacv1.PolicyRule `json:"rules"`
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &role); err != nil {
			t.Fatal(err)
		}
		rules := role.Rules
		name := limitedEdgeUser + "-" + obj.GetName()
		if obj.GetKind() == "ClusterRole" {
			rbac = append(rbac,
				&rbacv1.ClusterRole{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRole"},
					ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: append(rules, extra...)},
				&rbacv1.ClusterRoleBinding{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "ClusterRoleBinding"},
					ObjectMeta: metav1.ObjectMeta{Name: name}, Subjects: subject,
					RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: name}})
			continue
		}
		meta := metav1.ObjectMeta{Name: name, Namespace: obj.GetNamespace()}
		rbac = append(rbac,
			&rbacv1.Role{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "Role"}, ObjectMeta: meta, Rules: rules},
			&rbacv1.RoleBinding{TypeMeta: metav1.TypeMeta{APIVersion: "rbac.authorization.k8s.io/v1", Kind: "RoleBinding"}, ObjectMeta: meta,
				Subjects: subject, RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name}})
	}
	for _, obj := range rbac {
		apply(t, obj)
	}
	kc, err := clientcmd.LoadFromFile(env.service.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, ai := range kc.AuthInfos {
		ai.Impersonate = limitedEdgeUser
	}
	path := filepath.Join(testDir(t), "limited.kubeconfig")
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestForbiddenResourceDoesNotStopAnother: an edge with the least privilege
// of deploy/edge/edge.yaml, granted one published kind but not the other,
// keeps syncing the granted kind's objects while the other's local watch is
// forbidden.
func TestForbiddenResourceDoesNotStopAnother(t *testing.T) {
	envs := newSyncEnvs(t, "c",
		publication{crd: testCRD("granted.example.com", "Grant", "grants", apiextensionsv1.NamespaceScoped, "v1")},
		publication{crd: testCRD("denied.example.com", "Denial", "denials", apiextensionsv1.NamespaceScoped, "v1")})
	granted, denied := envs[0], envs[1]
	kubeconfig := limitedKubeconfig(t, rbacv1.PolicyRule{APIGroups: []string{"granted.example.com"},
		Resources: []string{"grants", "grants/status"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}})

	// The edge that published both is replaced by a least-privilege one.
	if err := granted.edge.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	o := framework.EdgeOptionsFor(granted.pki, "edge")
	o.Name, o.LogDir, o.BrokerAddress, o.Kubeconfig = "edge", testDir(t), granted.broker.Address, kubeconfig
	o.ExtraArgs = []string{"--heartbeat-interval", "1s", "--published-resource-selector", testLabel + "=" + granted.label}
	edge, err := framework.StartEdge(env.bins, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopChecked(t, edge) })
	granted.edge = edge
	waitLog(t, granted.edge, time.Minute, "cannot watch local copies", `"publishedResource":"denials"`, "forbidden")
	// The service owner sees why on the PublishedResource.
	pr, err := framework.WaitCondition(context.Background(), env.service.Config, "denials", ferryv1alpha1.ConditionSynced,
		metav1.ConditionFalse, ferryv1alpha1.ReasonLocalWatchFailed, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if c := meta.FindStatusCondition(pr.Status.Conditions, ferryv1alpha1.ConditionSynced); !strings.Contains(c.Message, "forbidden") {
		t.Errorf("Synced condition does not say why: %q", c.Message)
	}
	if _, err := framework.WaitCondition(context.Background(), env.service.Config, "grants", ferryv1alpha1.ConditionSynced,
		metav1.ConditionTrue, ferryv1alpha1.ReasonWatching, time.Minute); err != nil {
		t.Fatal(err)
	}

	// Many intents for the forbidden kind first: they once filled the
	// window that all resources share.
	var names []string
	for i := range 300 {
		names = append(names, fmt.Sprintf("denial-%03d", i))
	}
	denied.createRemoteParallel(t, names)
	granted.createRemote(t, "default", "works", map[string]any{"fieldV1": "v1"})
	granted.waitLocal(t, "default", "works", func(u *unstructured.Unstructured) (bool, string) {
		v, _ := specField(u, "fieldV1")
		return v == "v1", "spec.fieldV1 = " + v
	})
	if list, err := denied.local.List(context.Background(), metav1.ListOptions{}); err != nil || len(list.Items) != 0 {
		t.Fatalf("local copies of the forbidden kind: %v (err %v)", len(list.Items), err)
	}
}

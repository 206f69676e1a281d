package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"

	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/test/framework"
)

// The README's "Admin API recipes" are shell blocks marked
// <!-- recipe: NAME -->; these tests run them verbatim with bash, with the
// variables the README documents set in the environment, and check the JSON
// grpcurl prints.

// recipeMarker precedes a recipe's ```sh block in README.md.
var recipeMarker = regexp.MustCompile("(?m)^<!-- recipe: ([a-z0-9-]+) -->\n```sh\n((?s:.*?))```\n")

// readmeRecipes returns the README's recipes by name.
func readmeRecipes(t testing.TB) map[string]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, m := range recipeMarker.FindAllStringSubmatch(string(data), -1) {
		if _, dup := out[m[1]]; dup {
			t.Fatalf("README.md has two recipes called %s", m[1])
		}
		out[m[1]] = m[2]
	}
	return out
}

// recipeVars are the variables the README's recipes use.
type recipeVars map[string]string

// newRecipeVars sets the variables for e's broker and edge and the object
// namespace/name in e's consumer workspace.
func newRecipeVars(e *syncEnv, namespace, name string) recipeVars {
	return recipeVars{
		"GRPCURL":          env.bins.Grpcurl,
		"BROKER_ADDR":      e.broker.Address,
		"FERRY_CA":         filepath.Join(e.pki, devpki.CACertFile),
		"FERRY_ADMIN_CERT": devpki.CertFile(e.pki, "admin"),
		"FERRY_ADMIN_KEY":  devpki.KeyFile(e.pki, "admin"),
		"EDGE_IDENTITY":    devpki.IdentityFor("edge"),
		"OBJ_WORKSPACE":    e.consumer.String(),
		"OBJ_RESOURCE":     e.remoteGVR.Resource,
		"OBJ_NAMESPACE":    namespace,
		"OBJ_NAME":         name,
		"OBJ_CLUSTER":      e.consumerLC,
		"EDGE_ADMIN_ADDR":  e.edge.AdminAddress,
	}
}

// run runs recipe name with bash and returns what it printed.
func (v recipeVars) run(t testing.TB, recipes map[string]string, name string) (string, error) {
	t.Helper()
	script, ok := recipes[name]
	if !ok {
		t.Fatalf("README.md has no recipe %q", name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-euo", "pipefail", "-c", script)
	cmd.Env = os.Environ()
	for k, val := range v {
		cmd.Env = append(cmd.Env, k+"="+val)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("recipe %s: %w\nstdout:\n%s\nstderr:\n%s", name, err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

// runJSON runs recipe name and decodes its JSON output.
func (v recipeVars) runJSON(t testing.TB, recipes map[string]string, name string) map[string]any {
	t.Helper()
	out, err := v.run(t, recipes, name)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("recipe %s printed no JSON object: %v\n%s", name, err, out)
	}
	t.Logf("recipe %s:\n%s", name, out)
	return doc
}

// jsonPath returns the value at a dotted path of doc ("a.b.0.c"), nil when
// absent.
func jsonPath(doc any, path string) any {
	cur := doc
	for _, p := range strings.Split(path, ".") {
		switch c := cur.(type) {
		case map[string]any:
			cur = c[p]
		case []any:
			var i int
			if _, err := fmt.Sscan(p, &i); err != nil || i < 0 || i >= len(c) {
				return nil
			}
			cur = c[i]
		default:
			return nil
		}
	}
	return cur
}

func jsonString(doc any, path string) string {
	s, _ := jsonPath(doc, path).(string)
	return s
}

// jsonNumber reads a number, which protojson prints as a string for 64-bit
// integers.
func jsonNumber(doc any, path string) float64 {
	switch v := jsonPath(doc, path).(type) {
	case float64:
		return v
	case string:
		var f float64
		_, _ = fmt.Sscan(v, &f)
		return f
	}
	return 0
}

// expect records a failed expectation about a recipe's output.
func expect(t testing.TB, recipe string, ok bool, format string, args ...any) {
	t.Helper()
	if !ok {
		t.Errorf("recipe %s: "+format, append([]any{recipe}, args...)...)
	}
}

// TestAdminRecipesFromREADME runs every admin recipe of the README against
// a broker and an edge syncing one object.
func TestAdminRecipesFromREADME(t *testing.T) {
	recipes := readmeRecipes(t)
	known := []string{"list-edges", "get-object-state", "resync", "edge-list", "edge-status", "edge-object-state", "edge-object-state-by-copy"}
	for name := range recipes {
		if !slices.Contains(known, name) {
			t.Errorf("README.md recipe %q is not run by this test: add its checks here", name)
		}
	}

	e := newSyncEnv(t, "recipes.example.com", "Recipe", "recipes", nil)
	e.createRemote(t, "default", "good", map[string]any{"fieldV1": "v1"})
	local := e.waitLocal(t, "default", "good", func(*unstructured.Unstructured) (bool, string) { return true, "" })
	v := newRecipeVars(e, "default", "good")
	v["LOCAL_NAMESPACE"], v["LOCAL_NAME"] = local.GetNamespace(), local.GetName()

	// The answer to the kcp object comes once the edge's ack arrived.
	var state map[string]any
	err := framework.Eventually(context.Background(), time.Minute, 200*time.Millisecond, func(context.Context) (bool, string) {
		state = v.runJSON(t, recipes, "get-object-state")
		return jsonString(state, "intent.phase") == "INTENT_PHASE_ACKED", "intent " + fmt.Sprint(jsonPath(state, "intent"))
	})
	if err != nil {
		t.Fatal(err)
	}
	const r = "get-object-state"
	expect(t, r, jsonPath(state, "applied.current") == true, "the edge's applied state is not current: %v", jsonPath(state, "applied"))
	expect(t, r, jsonString(state, "applied.contentHash") == jsonString(state, "kcp.contentHash") && jsonString(state, "kcp.contentHash") != "",
		"applied hash %q, kcp hash %q", jsonString(state, "applied.contentHash"), jsonString(state, "kcp.contentHash"))
	expect(t, r, jsonString(state, "localCopy.namespace") == local.GetNamespace() && jsonString(state, "localCopy.name") == local.GetName(),
		"local copy %v, want %s/%s", jsonPath(state, "localCopy"), local.GetNamespace(), local.GetName())
	expect(t, r, jsonString(state, "key.cluster") == e.consumerLC && jsonString(state, "kcp.uid") != "" && jsonString(state, "workspacePath") == e.consumer.String(),
		"key %v, kcp %v, path %q", jsonPath(state, "key"), jsonPath(state, "kcp"), jsonString(state, "workspacePath"))
	expect(t, r, jsonNumber(state, "intent.version.sequence") > 0 && jsonString(state, "kcp.resourceVersion") != "", "intent %v", jsonPath(state, "intent"))
	expect(t, r, strings.Contains(jsonString(state, "summary"), "synced"), "summary %q", jsonString(state, "summary"))
	expect(t, r, jsonPath(state, "lastError") == nil, "last error %v", jsonPath(state, "lastError"))

	edges := v.runJSON(t, recipes, "list-edges")
	var edge any
	list, _ := jsonPath(edges, "edges").([]any)
	for _, ed := range list {
		if jsonString(ed, "identity") == devpki.IdentityFor("edge") {
			edge = ed
		}
	}
	const l = "list-edges"
	expect(t, l, jsonString(edge, "state") == "EDGE_STATE_CONNECTED", "edge %v", edge)
	expect(t, l, jsonPath(edge, "exportStatus.virtualWorkspaceReady") == true && jsonString(edge, "exportStatus.waitingFor") == "",
		"export status %v", jsonPath(edge, "exportStatus"))
	expect(t, l, jsonNumber(edge, "protocolVersion") > 0 && jsonString(edge, "edgeVersion") != "", "versions %v %v", jsonPath(edge, "protocolVersion"), jsonPath(edge, "edgeVersion"))
	caps, _ := jsonPath(edge, "capabilities").([]any)
	expect(t, l, slices.Contains(caps, any("CAPABILITY_INVENTORY_REQUEST")), "capabilities %v", caps)
	expect(t, l, jsonString(edge, "engine.resources.0.publishedResource") == "recipes" && jsonNumber(edge, "engine.resources.0.objects") == 1 &&
		jsonNumber(edge, "engine.resources.0.applied") == 1, "resources %v", jsonPath(edge, "engine.resources"))
	expect(t, l, jsonPath(edge, "engine.oldestUnacknowledgedAge") == nil && jsonPath(edge, "engine.outboxInFlight") == nil,
		"nothing awaits an answer, yet: %v", jsonPath(edge, "engine"))
	session := jsonString(edge, "sessionId")

	resync := v.runJSON(t, recipes, "resync")
	const rs = "resync"
	expect(t, rs, jsonString(resync, "resync.completedAt") != "" && jsonString(resync, "resync.error") == "", "resync %v", resync)
	expect(t, rs, jsonNumber(resync, "resync.inventoryEntries") == 1 && jsonNumber(resync, "resync.queuedIntents") == 0 &&
		jsonString(resync, "resync.sessionId") == session, "resync %v (session %s)", resync, session)
	waitLog(t, e.edge, 10*time.Second, "broker asked for the inventory")
	if got := jsonPath(v.runJSON(t, recipes, "list-edges"), "edges"); !strings.Contains(fmt.Sprint(got), "lastResync") {
		t.Errorf("ListEdges does not show the last resync: %v", got)
	}

	out, err := v.run(t, recipes, "edge-list")
	if err != nil {
		t.Fatal(err)
	}
	expect(t, "edge-list", strings.Contains(out, "ferry.v1alpha1.EdgeAdminService") && strings.Contains(out, "grpc.reflection"), "services:\n%s", out)

	st := v.runJSON(t, recipes, "edge-status")
	const es = "edge-status"
	expect(t, es, st["connected"] == true && st["leading"] == true && jsonString(st, "sessionId") == session, "status %v (session %s)", st, session)
	expect(t, es, jsonString(st, "brokerAddress") == e.broker.Address && jsonString(st, "agentName") == "edge", "status %v", st)
	expect(t, es, jsonString(st, "resources.0.publishedResource") == "recipes" && jsonNumber(st, "resources.0.objects") == 1 &&
		jsonPath(st, "resources.0.listed") == true, "resources %v", jsonPath(st, "resources"))
	expect(t, es, jsonNumber(st, "intentsApplied") >= 1, "intents applied %v", jsonPath(st, "intentsApplied"))

	for _, name := range []string{"edge-object-state", "edge-object-state-by-copy"} {
		obj := v.runJSON(t, recipes, name)
		expect(t, name, jsonString(obj, "key.name") == "good" && jsonString(obj, "key.cluster") == e.consumerLC, "key %v", jsonPath(obj, "key"))
		expect(t, name, jsonString(obj, "localCopy.name") == local.GetName() && jsonString(obj, "localUid") == string(local.GetUID()),
			"local copy %v uid %q", jsonPath(obj, "localCopy"), jsonString(obj, "localUid"))
		expect(t, name, jsonString(obj, "applied.contentHash") == jsonString(state, "kcp.contentHash"), "applied %v", jsonPath(obj, "applied"))
		expect(t, name, jsonPath(obj, "lastError") == nil, "last error %v", jsonPath(obj, "lastError"))
	}

	// The broker's API is for admins only.
	v["FERRY_ADMIN_CERT"], v["FERRY_ADMIN_KEY"] = devpki.CertFile(e.pki, "edge"), devpki.KeyFile(e.pki, "edge")
	if _, err := v.run(t, recipes, "list-edges"); err == nil || !strings.Contains(err.Error(), "PermissionDenied") {
		t.Errorf("ListEdges with the edge's certificate: %v", err)
	}
}

// TestAdminGetObjectStateExplainsFailure: the service cluster refuses an
// object (a ValidatingAdmissionPolicy); the README's GetObjectState recipes,
// at the broker and at the edge, say why and that there is no local copy.
func TestAdminGetObjectStateExplainsFailure(t *testing.T) {
	recipes := readmeRecipes(t)
	e := newSyncEnv(t, "explained.example.com", "Gadget", "gadgets", nil)
	denyFieldV1(t, e, "explained.example.com", "Gadget", "gadgets")
	e.createRemote(t, "default", "bad", map[string]any{"fieldV1": "forbidden"})
	v := newRecipeVars(e, "default", "bad")

	var state map[string]any
	err := framework.Eventually(context.Background(), time.Minute, 500*time.Millisecond, func(context.Context) (bool, string) {
		out, err := v.run(t, recipes, "get-object-state")
		if err != nil {
			return false, err.Error() // NOT_FOUND until the broker's cache has it
		}
		state = nil
		if err := json.Unmarshal([]byte(out), &state); err != nil {
			return false, err.Error()
		}
		return jsonString(state, "intent.phase") == "INTENT_PHASE_NACKED", "intent " + fmt.Sprint(jsonPath(state, "intent"))
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("GetObjectState of the refused object: %v", state)
	const r = "get-object-state"
	expect(t, r, jsonString(state, "lastError.source") == "intent" && jsonString(state, "lastError.error.reason") == "APPLY_ERROR_REASON_REJECTED",
		"last error %v", jsonPath(state, "lastError"))
	expect(t, r, strings.Contains(jsonString(state, "lastError.error.message"), "fieldV1 may not be forbidden here"),
		"the error does not carry the service cluster's message: %q", jsonString(state, "lastError.error.message"))
	expect(t, r, jsonPath(state, "localCopy") == nil && jsonPath(state, "applied") == nil, "a refused object has a local copy %v or applied state %v",
		jsonPath(state, "localCopy"), jsonPath(state, "applied"))
	expect(t, r, jsonPath(state, "intent.held") == true, "a final refusal is not held: %v", jsonPath(state, "intent"))
	expect(t, r, strings.Contains(jsonString(state, "summary"), "rejected") && strings.Contains(jsonString(state, "summary"), "fieldV1 may not be forbidden here"),
		"summary %q", jsonString(state, "summary"))

	obj := v.runJSON(t, recipes, "edge-object-state")
	const eo = "edge-object-state"
	expect(t, eo, jsonPath(obj, "localCopy") == nil, "local copy %v", jsonPath(obj, "localCopy"))
	expect(t, eo, jsonString(obj, "lastError.error.reason") == "APPLY_ERROR_REASON_REJECTED" &&
		strings.Contains(jsonString(obj, "lastError.error.message"), "fieldV1 may not be forbidden here"), "last error %v", jsonPath(obj, "lastError"))
	expect(t, eo, strings.Contains(jsonString(obj, "summary"), "no local copy"), "summary %q", jsonString(obj, "summary"))
}

// denyFieldV1 makes the service cluster refuse objects of group/resource
// (kind) whose spec.fieldV1 is "forbidden", and waits until the policy
// bites. lift removes the policy's binding and waits until it no longer
// does.
func denyFieldV1(t testing.TB, e *syncEnv, group, kind, resource string) (lift func()) {
	t.Helper()
	ctx := context.Background()
	kube, err := kubernetes.NewForConfig(env.service.Config)
	if err != nil {
		t.Fatal(err)
	}
	policy := &admissionv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: e.label + "-deny"},
		Spec: admissionv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr(admissionv1.Fail),
			MatchConstraints: &admissionv1.MatchResources{ResourceRules: []admissionv1.NamedRuleWithOperations{{
				RuleWithOperations: admissionv1.RuleWithOperations{
					Operations: []admissionv1.OperationType{admissionv1.Create, admissionv1.Update},
					Rule:       admissionv1.Rule{APIGroups: []string{group}, APIVersions: []string{"*"}, Resources: []string{resource}},
				},
			}}},
			Validations: []admissionv1.Validation{{Expression: "object.spec.fieldV1 != 'forbidden'", Message: "fieldV1 may not be forbidden here"}},
		},
	}
	if _, err := kube.AdmissionregistrationV1().ValidatingAdmissionPolicies().Create(ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: e.label + "-deny"},
		Spec:       admissionv1.ValidatingAdmissionPolicyBindingSpec{PolicyName: policy.Name, ValidationActions: []admissionv1.ValidationAction{admissionv1.Deny}},
	}
	if _, err := kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Create(ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
		_ = kube.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(context.Background(), policy.Name, metav1.DeleteOptions{})
	})
	probe := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": e.localGVR.GroupVersion().String(), "kind": kind,
		"metadata": map[string]any{"name": "probe", "namespace": "default"}, "spec": map[string]any{"fieldV1": "forbidden"},
	}}
	err = framework.Eventually(ctx, time.Minute, 200*time.Millisecond, func(ctx context.Context) (bool, string) {
		_, err := e.local.Namespace("default").Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return apierrors.IsInvalid(err) || apierrors.IsForbidden(err), fmt.Sprintf("probe create: %v", err)
	})
	if err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		if err := kube.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(ctx, binding.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		// Policies stop biting asynchronously too.
		err := framework.Eventually(ctx, time.Minute, 200*time.Millisecond, func(ctx context.Context) (bool, string) {
			_, err := e.local.Namespace("default").Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
			return err == nil, fmt.Sprintf("probe create: %v", err)
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

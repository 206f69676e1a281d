package e2e

import (
	"bytes"
	"context"
	"crypto/sha1" //nolint:gosec // api-syncagent's hashes, reproduced as it writes them
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// serviceKube is a Kubernetes client of the environment's service cluster.
func (e *pubEnv) serviceKube(t testing.TB) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(e.serviceCluster().Config)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// conflictsOf reads status.objects.conflicting of PublishedResource name.
func (e *pubEnv) conflictsOf(t testing.TB, ctx context.Context, name string) (int64, error) {
	return e.objectCount(t, ctx, name, "conflicting")
}

// objectCount reads status.objects.<field> of PublishedResource name.
func (e *pubEnv) objectCount(t testing.TB, ctx context.Context, name, field string) (int64, error) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(e.serviceCluster().Config)
	if err != nil {
		t.Fatal(err)
	}
	pr, err := dyn.Resource(ferryv1alpha1.GroupVersion.WithResource("publishedresources")).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	n, _, _ := unstructured.NestedInt64(pr.Object, "status", "objects", field)
	return n, nil
}

// createNamespace creates namespace name in the service cluster (not
// ferry's: unlabelled), removed when the test ends.
func createNamespace(t testing.TB, kube kubernetes.Interface, name string) {
	t.Helper()
	ctx := context.Background()
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = kube.CoreV1().Namespaces().Delete(context.Background(), name, metav1.DeleteOptions{}) })
}

// createLocalObject creates u in the service cluster with labels and
// annotations, as the service owner or another tool would, and returns it
// as created.
func (e *syncEnv) createLocalObject(t testing.TB, u *unstructured.Unstructured, labels, annotations map[string]string) *unstructured.Unstructured {
	t.Helper()
	u.SetLabels(labels)
	u.SetAnnotations(annotations)
	got, err := e.local.Namespace(u.GetNamespace()).Create(context.Background(), u, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// TestConflictPolicyAdoptAndFail: a local object ferry did not create sits
// at the place of a kcp object's copy. Under conflictPolicy Adopt it is
// taken over in place (same UID), says so (annotations and an Adopted
// Event), carries the kcp object's content from then on, and is ferry's
// copy like any other (deleted with the kcp object). Under Fail (the
// default) it is untouched, the kcp object is refused with a reason, and
// status.objects.conflicting counts it.
func TestConflictPolicyAdoptAndFail(t *testing.T) {
	ctx := context.Background()
	ns := "conflict-policy-e2e"
	place := func(s *ferryv1alpha1.PublishedResourceSpec) {
		// A static namespace that exists (the service owner's); the name
		// carries the workspace.
		s.Naming = &ferryv1alpha1.ResourceNaming{Namespace: ns, Name: "$remoteClusterName-$remoteName"}
	}
	envs := newSyncEnvs(t, "c", publication{
		crd: testCRD("adopt.conflicts.example.com", "Pantry", "pantries", apiextensionsv1.NamespaceScoped, "v1"),
		spec: func(s *ferryv1alpha1.PublishedResourceSpec) {
			place(s)
			s.ConflictPolicy = ferryv1alpha1.ConflictPolicyAdopt
		},
	}, publication{
		crd:  testCRD("fail.conflicts.example.com", "Larder", "larders", apiextensionsv1.NamespaceScoped, "v1"),
		spec: place,
	})
	adopt, fail := envs[0], envs[1]
	kube := adopt.serviceKube(t)
	createNamespace(t, kube, ns)

	// The service owner's objects, at the names the kcp objects' copies get.
	mk := func(e *syncEnv, kind, name string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": e.localGVR.GroupVersion().String(), "kind": kind,
			"metadata": map[string]any{"name": e.consumerLC + "-" + name, "namespace": ns},
			"spec":     map[string]any{"fieldV1": "service owner's", "region": "eu"},
		}}
		return e.createLocalObject(t, u, map[string]string{"app": "db"}, nil)
	}
	taken := mk(adopt, "Pantry", "taken")
	kept := mk(fail, "Larder", "kept")

	adopt.createRemote(t, "default", "taken", map[string]any{"fieldV1": "consumer's"})
	fail.createRemote(t, "default", "kept", map[string]any{"fieldV1": "consumer's"})

	// Adopt: the same object (UID), now ferry's copy with kcp's content.
	got := adopt.waitLocal(t, "default", "taken", func(u *unstructured.Unstructured) (bool, string) {
		v, _ := specField(u, "fieldV1")
		return v == "consumer's", "spec.fieldV1 = " + v
	})
	if got.GetUID() != taken.GetUID() || got.GetName() != taken.GetName() {
		t.Fatalf("adopted %s uid %s, want %s uid %s (in place, never recreated)", got.GetName(), got.GetUID(), taken.GetName(), taken.GetUID())
	}
	if a := got.GetAnnotations(); a["ferry.dev/adopted-from"] != "unmanaged" || a["ferry.dev/adopted-at"] == "" {
		t.Errorf("the adoption is not recorded on the object: annotations %v", a)
	}
	waitEvent(t, kube, ns, taken.GetName(), "Adopted", "conflictPolicy")

	// Fail: untouched, refused with the reason, counted.
	waitEvent(t, fail.consumerKube(t), "default", "kept", "SyncFailed", "was not created by ferry")
	fail.assertLocalUntouched(t, kept)
	waitFor(t, "status.objects.conflicting of larders = 1", func(ctx context.Context) (bool, string) {
		n, err := fail.conflictsOf(t, ctx, "larders")
		if err != nil {
			return false, err.Error()
		}
		return n == 1, fmt.Sprintf("status.objects.conflicting = %d", n)
	})
	if n, err := adopt.conflictsOf(t, ctx, "pantries"); err != nil || n != 0 {
		t.Errorf("status.objects.conflicting of pantries = %d (%v), want 0", n, err)
	}
	// The adopted object counts as a copy (the count is written batched).
	waitFor(t, "status.objects.synced of pantries = 1", func(ctx context.Context) (bool, string) {
		n, err := adopt.objectCount(t, ctx, "pantries", "synced")
		if err != nil {
			return false, err.Error()
		}
		return n == 1, fmt.Sprintf("status.objects.synced = %d", n)
	})

	// The adopted object is ferry's copy: deleted with its kcp object.
	adopt.deleteRemoteAndWaitGone(t, "default", "taken")
	if _, err := adopt.local.Namespace(ns).Get(ctx, taken.GetName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the adopted copy outlived its kcp object: %v", err)
	}
	fail.assertLocalUntouched(t, kept)
}

// api-syncagent's marks, written here as api-syncagent writes them.
const (
	saAgentLabel     = "syncagent.kcp.io/agent-name"
	saClusterLabel   = "syncagent.kcp.io/remote-object-cluster"
	saNSHashLabel    = "syncagent.kcp.io/remote-object-namespace-hash"
	saNameHashLabel  = "syncagent.kcp.io/remote-object-name-hash"
	saNSAnnotation   = "syncagent.kcp.io/remote-object-namespace"
	saNameAnnotation = "syncagent.kcp.io/remote-object-name"
	saStateLabel     = "syncagent.kcp.io/object-state"
	saFinalizer      = "syncagent.kcp.io/cleanup"
)

func saSHA1(s string) string {
	sum := sha1.Sum([]byte(s)) //nolint:gosec // see import
	return hex.EncodeToString(sum[:])
}

// saStateSecret is api-syncagent's last-known-state Secret of the kcp
// object apiVersion/kind ns/name in logical cluster lc, in namespace in.
func saStateSecret(t testing.TB, in, lc, apiVersion, kind, ns, name string) *corev1.Secret {
	t.Helper()
	var buf bytes.Buffer
	if err := json.NewEncoder(&buf).Encode(map[string]any{"apiVersion": apiVersion, "kind": kind, "namespace": ns, "name": name}); err != nil {
		t.Fatal(err)
	}
	sum := sha1.Sum(buf.Bytes()) //nolint:gosec // see import
	return &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "obj-state-" + lc + "-" + hex.EncodeToString(sum[:])[:20], Namespace: in, Labels: map[string]string{
			saStateLabel: "true", saClusterLabel: lc, saNameHashLabel: saSHA1(name), saNSHashLabel: saSHA1(ns),
		}},
		Data: map[string][]byte{saSHA1(name): []byte(`{"spec":{"fieldV1":"v1"}}`)},
	}
}

// TestMigrateFromAPISyncAgent: a service cluster synced by an
// api-syncagent-shaped setup (its copies with its labels and annotations,
// one of them where ferry's naming would not put it, its finalizer on the
// kcp objects, its state Secrets) switched to ferry: every copy is adopted
// with the same UID (never recreated), the finalizers are swapped in kcp,
// the state Secrets of the adopted objects are gone (another one stays),
// then create, update, status and delete work and a deletion leaves no
// finalizer.
func TestMigrateFromAPISyncAgent(t *testing.T) {
	ctx := context.Background()
	stateNS := "sa-state-migrate-e2e"
	const agent = "old-sync-agent"
	// api-syncagent's PublishedResource, converted by ferry-edge migrate
	// (golden), is what ferry publishes: it adopts the copies (spec.adopt)
	// where api-syncagent put them (naming.allowExistingNamespaces).
	migrated := migrateWithBinary(t, "testdata/migrate/silos.syncagent.yaml", "testdata/migrate/silos.golden",
		"--adopt-agent-name", agent, "--adopt-state-namespace", stateNS)
	e := newSyncEnv(t, "migrate.example.com", "Silo", "silos", func(s *ferryv1alpha1.PublishedResourceSpec) {
		*s = migrated.Spec
		if s.Adopt == nil || s.Adopt.AgentName != agent || s.Naming == nil || !s.Naming.AllowExistingNamespaces {
			t.Fatalf("the migrated PublishedResource does not adopt api-syncagent's copies: %+v", s)
		}
	})
	kube := e.serviceKube(t)
	createNamespace(t, kube, stateNS)
	// api-syncagent's default namespace for a workspace's copies.
	createNamespace(t, kube, e.consumerLC)

	// What api-syncagent left: a copy per kcp object, its state Secret.
	apiVersion := e.remoteGVR.GroupVersion().String()
	copies := map[string]*unstructured.Unstructured{}
	for name, place := range map[string]string{
		"one": naming.Hash("default") + "-" + naming.Hash("one"), // api-syncagent's default naming (ferry's too)
		"two": "renamed-by-old-rules",                            // where only its own rules put it
	} {
		u := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": e.localGVR.GroupVersion().String(), "kind": "Silo",
			"metadata": map[string]any{"name": place, "namespace": e.consumerLC},
			"spec":     map[string]any{"fieldV1": "v1", "legacy": "set-before-ferry"},
		}}
		copies[name] = e.createLocalObject(t, u,
			map[string]string{saAgentLabel: agent, saClusterLabel: e.consumerLC, saNSHashLabel: saSHA1("default"), saNameHashLabel: saSHA1(name), "team": "blue"},
			map[string]string{saNSAnnotation: "default", saNameAnnotation: name})
		if _, err := kube.CoreV1().Secrets(stateNS).Create(ctx, saStateSecret(t, stateNS, e.consumerLC, apiVersion, e.remoteKind, "default", name), metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The state of an object ferry does not adopt stays.
	unrelated := saStateSecret(t, stateNS, e.consumerLC, apiVersion, e.remoteKind, "default", "never-synced")
	if _, err := kube.CoreV1().Secrets(stateNS).Create(ctx, unrelated, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The kcp objects, with api-syncagent's finalizer.
	for name := range copies {
		obj := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": apiVersion, "kind": e.remoteKind,
			"metadata": map[string]any{"name": name, "namespace": "default", "labels": map[string]any{"team": "blue"}, "finalizers": []any{saFinalizer}},
			"spec":     map[string]any{"fieldV1": "v1", "legacy": "set-before-ferry"},
		}}
		if _, err := e.remote.Namespace("default").Create(ctx, obj, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// Every copy adopted in place, same UID; the finalizers swapped.
	for name, before := range copies {
		got := e.waitLocal(t, "default", name, func(u *unstructured.Unstructured) (bool, string) {
			return u.GetAnnotations()["ferry.dev/adopted-from"] == "api-syncagent/"+agent, fmt.Sprintf("annotations %v", u.GetAnnotations())
		})
		if got.GetUID() != before.GetUID() || got.GetNamespace() != before.GetNamespace() || got.GetName() != before.GetName() {
			t.Errorf("%s: adopted %s/%s uid %s, want api-syncagent's copy %s/%s uid %s in place", name, got.GetNamespace(), got.GetName(), got.GetUID(),
				before.GetNamespace(), before.GetName(), before.GetUID())
		}
		e.waitRemote(t, "default", name, func(u *unstructured.Unstructured, err error) (bool, string) {
			if err != nil {
				return false, err.Error()
			}
			f := u.GetFinalizers()
			return slices.Contains(f, "ferry.dev/edge") && !slices.Contains(f, saFinalizer), fmt.Sprintf("finalizers %v", f)
		})
		state := saStateSecret(t, stateNS, e.consumerLC, apiVersion, e.remoteKind, "default", name)
		waitFor(t, "api-syncagent's state of "+name+" deleted", func(ctx context.Context) (bool, string) {
			_, err := kube.CoreV1().Secrets(stateNS).Get(ctx, state.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), fmt.Sprintf("state Secret %s: %v", state.Name, err)
		})
	}
	if _, err := kube.CoreV1().Secrets(stateNS).Get(ctx, unrelated.Name, metav1.GetOptions{}); err != nil {
		t.Errorf("the state Secret of an object ferry did not adopt was touched: %v", err)
	}

	// Update, status, create and delete work as for any copy.
	remote, err := e.remote.Namespace("default").Get(ctx, "two", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A field removed in kcp goes from the adopted copy too, although
	// api-syncagent (here: the test, which created the copy) wrote it
	// first: once ferry adopts a copy it alone owns the fields it sets.
	_ = unstructured.SetNestedField(remote.Object, "v2", "spec", "fieldV1")
	unstructured.RemoveNestedField(remote.Object, "spec", "legacy")
	if _, err := e.remote.Namespace("default").Update(ctx, remote, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	two := e.waitLocal(t, "default", "two", func(u *unstructured.Unstructured) (bool, string) {
		v, _ := specField(u, "fieldV1")
		legacy, has := specField(u, "legacy")
		return v == "v2" && !has, fmt.Sprintf("spec.fieldV1 = %s, spec.legacy = %q (present %t)", v, legacy, has)
	})
	_ = unstructured.SetNestedField(two.Object, "Ready", "status", "phase")
	if _, err := e.local.Namespace(two.GetNamespace()).UpdateStatus(ctx, two, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitRemote(t, "default", "two", func(u *unstructured.Unstructured, err error) (bool, string) {
		if err != nil {
			return false, err.Error()
		}
		phase, _, _ := unstructured.NestedString(u.Object, "status", "phase")
		return phase == "Ready", "status.phase = " + phase
	})
	e.createRemote(t, "default", "three", map[string]any{"fieldV1": "new"})
	three := e.waitLocal(t, "default", "three", func(u *unstructured.Unstructured) (bool, string) {
		v, _ := specField(u, "fieldV1")
		return v == "new", "spec.fieldV1 = " + v
	})
	if three.GetAnnotations()["ferry.dev/adopted-from"] != "" {
		t.Errorf("a new copy is marked adopted: %v", three.GetAnnotations())
	}
	for _, name := range []string{"one", "two", "three"} {
		e.deleteRemoteAndWaitGone(t, "default", name)
	}
	for name, before := range copies {
		if _, err := e.local.Namespace(before.GetNamespace()).Get(ctx, before.GetName(), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the adopted copy of %s outlived its kcp object: %v", name, err)
		}
	}
}

// migrateWithBinary runs `ferry-edge migrate -f input args...`, compares its
// output with the golden file (FERRY_UPDATE_GOLDEN=1 rewrites it) and
// returns the one PublishedResource it wrote.
func migrateWithBinary(t *testing.T, input, golden string, args ...string) *ferryv1alpha1.PublishedResource {
	t.Helper()
	cmd := exec.Command(env.bins.Edge, append([]string{"migrate", "-f", input}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("ferry-edge migrate: %v\n%s", err, stderr.String())
	}
	if os.Getenv("FERRY_UPDATE_GOLDEN") == "1" {
		if err := os.WriteFile(golden, stdout.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (FERRY_UPDATE_GOLDEN=1 writes it)", err)
	}
	if !bytes.Equal(want, stdout.Bytes()) {
		t.Fatalf("ferry-edge migrate output differs from %s:\n%s", golden, stdout.String())
	}
	var pr ferryv1alpha1.PublishedResource
	if err := yaml.UnmarshalStrict(stdout.Bytes(), &pr); err != nil {
		t.Fatalf("the output is not one PublishedResource: %v", err)
	}
	return &pr
}

package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/test/framework"
)

// brokerFinalizer is the broker's finalizer for the client certificate
// "edge": named after the edge's entry in the broker's configuration (the
// identity's last path segment), not after the agent name.
const brokerFinalizer = "ferry.dev/edge"

// waitFinalizer waits until the kcp object ns/name exists, is not being
// deleted and carries (want) or lacks (!want) the broker's finalizer.
func (e *syncEnv) waitFinalizer(t testing.TB, ns, name string, want bool) *unstructured.Unstructured {
	t.Helper()
	var got *unstructured.Unstructured
	e.waitRemote(t, ns, name, func(u *unstructured.Unstructured, err error) (bool, string) {
		if err != nil {
			return false, err.Error()
		}
		if u.GetDeletionTimestamp() != nil {
			return false, fmt.Sprintf("being deleted, finalizers %v", u.GetFinalizers())
		}
		got = u
		return slices.Contains(u.GetFinalizers(), brokerFinalizer) == want, fmt.Sprintf("finalizers %v", u.GetFinalizers())
	})
	return got
}

// deleteRemoteAndWaitGone deletes the kcp object ns/name and waits until it
// is gone, i.e. no finalizer keeps it Terminating.
func (e *syncEnv) deleteRemoteAndWaitGone(t testing.TB, ns, name string) {
	t.Helper()
	if err := e.remote.Namespace(ns).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitRemote(t, ns, name, func(u *unstructured.Unstructured, err error) (bool, string) {
		if apierrors.IsNotFound(err) {
			return true, ""
		}
		return false, fmt.Sprintf("still there (err %v), finalizers %v", err, u.GetFinalizers())
	})
}

// localCopiesOf lists the local copies of the kcp object ns/name.
func (e *syncEnv) localCopiesOf(t testing.TB, ns, name string) []unstructured.Unstructured {
	t.Helper()
	return e.localCopies(t, naming.LabelNamespaceHash+"="+naming.Hash(ns)+","+naming.LabelNameHash+"="+naming.Hash(name))
}

// localCopies lists, across all namespaces, the local copies of objects of
// the consumer workspace (narrowed by an optional extra selector).
func (e *syncEnv) localCopies(t testing.TB, selector string) []unstructured.Unstructured {
	t.Helper()
	sel := naming.LabelRemoteCluster + "=" + e.consumerLC
	if selector != "" {
		sel += "," + selector
	}
	list, err := e.local.List(context.Background(), metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	return list.Items
}

// waitNoLocalCopy waits until the kcp object ns/name has no local copy.
func (e *syncEnv) waitNoLocalCopy(t testing.TB, ns, name string) {
	t.Helper()
	err := framework.Eventually(context.Background(), time.Minute, 100*time.Millisecond, func(context.Context) (bool, string) {
		n := len(e.localCopiesOf(t, ns, name))
		return n == 0, fmt.Sprintf("%d local copies of %s/%s", n, ns, name)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// assertLocalUntouched fails unless before (a local copy) still exists with
// the same resourceVersion, i.e. nobody wrote it since.
func (e *syncEnv) assertLocalUntouched(t testing.TB, before *unstructured.Unstructured) {
	t.Helper()
	got, err := e.local.Namespace(before.GetNamespace()).Get(context.Background(), before.GetName(), metav1.GetOptions{})
	switch {
	case err != nil:
		t.Errorf("orphaned local copy %s/%s: %v", before.GetNamespace(), before.GetName(), err)
	case got.GetDeletionTimestamp() != nil:
		t.Errorf("orphaned local copy %s/%s is being deleted", got.GetNamespace(), got.GetName())
	case got.GetResourceVersion() != before.GetResourceVersion():
		t.Errorf("orphaned local copy %s/%s was written: resourceVersion %s, was %s; labels %v, were %v",
			got.GetNamespace(), got.GetName(), got.GetResourceVersion(), before.GetResourceVersion(), got.GetLabels(), before.GetLabels())
	}
}

// setTeam relabels the kcp object ns/name.
func (e *syncEnv) setTeam(t testing.TB, ns, name, team string) {
	t.Helper()
	patch := []byte(`{"metadata":{"labels":{"team":"` + team + `"}}}`)
	if _, err := e.remote.Namespace(ns).Patch(context.Background(), name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// syncedRemote creates the kcp object default/name and waits for its local
// copy and the broker's finalizer; it returns the local copy as it is then.
func (e *syncEnv) syncedRemote(t testing.TB, name string) *unstructured.Unstructured {
	t.Helper()
	e.createRemote(t, "default", name, map[string]any{"fieldV1": "v1"})
	e.waitLocal(t, "default", name, func(*unstructured.Unstructured) (bool, string) { return true, "" })
	e.waitFinalizer(t, "default", name, true)
	// Read the copy again: the content it holds now is final.
	return e.waitLocal(t, "default", name, func(*unstructured.Unstructured) (bool, string) { return true, "" })
}

// deletePublished deletes the PublishedResource name in the service cluster
// and waits until it is gone; the edge holds it (finalizer
// ferry.dev/release-objects) until the broker released the objects.
func deletePublished(t testing.TB, names ...string) {
	t.Helper()
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(env.service.Config)
	if err != nil {
		t.Fatal(err)
	}
	prs := dyn.Resource(framework.PublishedResourceGVR)
	for _, name := range names {
		pr, err := prs.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Contains(pr.GetFinalizers(), ferryv1alpha1.PublishedResourceFinalizer) {
			t.Errorf("PublishedResource %s lacks the edge's finalizer %s: %v", name, ferryv1alpha1.PublishedResourceFinalizer, pr.GetFinalizers())
		}
		if err := prs.Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range names {
		err := framework.Eventually(ctx, time.Minute, 100*time.Millisecond, func(ctx context.Context) (bool, string) {
			pr, err := framework.GetPublishedResource(ctx, env.service.Config, name)
			if apierrors.IsNotFound(err) {
				return true, ""
			}
			if err != nil {
				return false, err.Error()
			}
			return false, fmt.Sprintf("still there, finalizers %v, conditions %+v", pr.Finalizers, pr.Status.Conditions)
		})
		if err != nil {
			t.Fatalf("PublishedResource %s: %v", name, err)
		}
	}
}

// countLogLines counts the lines of p's log that contain all of substrs.
func countLogLines(t testing.TB, p *framework.Process, substrs ...string) int {
	t.Helper()
	data, err := p.Log()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(string(data), "\n") {
		if containsAll(line, substrs) {
			n++
		}
	}
	return n
}

// TestObjectLeavingFilterIsReleased: an object relabelled out of
// filter.resource loses its local copy and then the broker's finalizer (it
// is not deleted itself, and deleting it later is not held up); an object
// relabelled back into the filter is synced again.
func TestObjectLeavingFilterIsReleased(t *testing.T) {
	e := newSyncEnv(t, "leave.example.com", "Kite", "kites", func(s *ferryv1alpha1.PublishedResourceSpec) {
		s.Filter = &ferryv1alpha1.ResourceFilter{Resource: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "blue"}}}
	})
	e.syncedRemote(t, "leaver")
	e.syncedRemote(t, "returner")

	e.setTeam(t, "default", "leaver", "red")
	e.setTeam(t, "default", "returner", "red")
	for _, name := range []string{"leaver", "returner"} {
		e.waitNoLocalCopy(t, "default", name)
		u := e.waitFinalizer(t, "default", name, false)
		if u.GetLabels()["team"] != "red" {
			t.Errorf("%s: labels %v", name, u.GetLabels())
		}
	}

	// Released, so deleting it in kcp completes at once.
	e.deleteRemoteAndWaitGone(t, "default", "leaver")

	// Back into the filter: local copy and finalizer again.
	e.setTeam(t, "default", "returner", "blue")
	e.waitLocal(t, "default", "returner", func(*unstructured.Unstructured) (bool, string) { return true, "" })
	e.waitFinalizer(t, "default", "returner", true)
	assertLogLacks(t, e.edge, "reconnecting")
}

// TestDeletedPublishedResourceReleasesObjects: deleting a PublishedResource
// releases the broker's finalizer on its objects in kcp; with
// deletionPolicy Orphan (the default) the local copies stay untouched, with
// Delete they are deleted.
func TestDeletedPublishedResourceReleasesObjects(t *testing.T) {
	envs := newSyncEnvs(t, "c",
		publication{crd: testCRD("orphan.example.com", "Vault", "vaults", apiextensionsv1.NamespaceScoped, "v1")},
		publication{
			crd: testCRD("purge.example.com", "Scratch", "scratches", apiextensionsv1.NamespaceScoped, "v1"),
			spec: func(s *ferryv1alpha1.PublishedResourceSpec) {
				s.DeletionPolicy = ferryv1alpha1.DeletionPolicyDelete
			},
		},
	)
	orphan, purge := envs[0], envs[1]
	if pr, err := framework.GetPublishedResource(context.Background(), env.service.Config, "vaults"); err != nil {
		t.Fatal(err)
	} else if pr.Spec.DeletionPolicy != ferryv1alpha1.DeletionPolicyOrphan {
		t.Errorf("default deletionPolicy is %q, want %q", pr.Spec.DeletionPolicy, ferryv1alpha1.DeletionPolicyOrphan)
	}
	kept := orphan.syncedRemote(t, "v1")
	purge.syncedRemote(t, "s1")

	deletePublished(t, "vaults", "scratches")

	// Orphan: the finalizer is released, the local copy is left alone and
	// stays after the kcp object is deleted.
	orphan.waitFinalizer(t, "default", "v1", false)
	orphan.assertLocalUntouched(t, kept)
	orphan.deleteRemoteAndWaitGone(t, "default", "v1")
	orphan.assertLocalUntouched(t, kept)

	// Delete: the local copy was deleted before the PublishedResource went.
	if n := len(purge.localCopies(t, "")); n != 0 {
		t.Errorf("deletionPolicy Delete: %d local copies left after the PublishedResource is gone", n)
	}
	purge.waitFinalizer(t, "default", "s1", false)
	purge.deleteRemoteAndWaitGone(t, "default", "s1")
}

// TestDisabledSyncReleasesObjects: synchronization.enabled=false releases
// the broker's finalizer on the resource's objects; the local copies stay
// (deletionPolicy Orphan).
func TestDisabledSyncReleasesObjects(t *testing.T) {
	e := newSyncEnv(t, "disable.example.com", "Lamp", "lamps", nil)
	kept := e.syncedRemote(t, "l1")

	e.publish(t, "lamps", ferryv1alpha1.PublishedResourceSpec{
		Resource:        ferryv1alpha1.SourceResource{APIGroup: "disable.example.com", Kind: "Lamp", Version: "v1"},
		Synchronization: &ferryv1alpha1.SynchronizationSpec{Enabled: ptr(false)},
	})
	e.waitFinalizer(t, "default", "l1", false)
	e.assertLocalUntouched(t, kept)
	e.deleteRemoteAndWaitGone(t, "default", "l1")
	e.assertLocalUntouched(t, kept)
}

// TestRenamedAgentStrandsNothing: the broker's finalizer is named by its
// configuration, not by the agent name; an edge restarted under another
// agent name (same certificate) still deletes the local copy and releases
// the finalizer.
func TestRenamedAgentStrandsNothing(t *testing.T) {
	ctx := context.Background()
	e := newSyncEnv(t, "rename.example.com", "Sled", "sleds", nil)
	e.syncedRemote(t, "s1")

	inventories := countLogLines(t, e.broker.Process, "edge inventory complete", "sleds")
	stopChecked(t, e.edge)
	const agent = "renamed"
	e.edge = startEdge(t, agent, e.pki, "edge", e.broker.Address, "--published-resource-selector", testLabel+"="+e.label)
	admin := ferryv1.NewAdminServiceClient(adminConn(t, e.broker, e.pki))
	err := framework.Eventually(ctx, time.Minute, 100*time.Millisecond, func(ctx context.Context) (bool, string) {
		resp, err := admin.ListEdges(ctx, &ferryv1.ListEdgesRequest{})
		if err != nil {
			return false, err.Error()
		}
		for _, edge := range resp.GetEdges() {
			if edge.GetIdentity() == devpki.IdentityFor("edge") {
				return edge.GetAgentName() == agent && edge.GetState() == ferryv1.EdgeState_EDGE_STATE_CONNECTED,
					fmt.Sprintf("agent %q is %s", edge.GetAgentName(), edge.GetState())
			}
		}
		return false, "edge not listed"
	})
	if err != nil {
		t.Fatal(err)
	}
	// The broker has the renamed edge's inventory (what follows is a
	// deletion, not a race with the reconnect).
	waitLogCount(t, e.broker.Process, time.Minute, inventories+1, "edge inventory complete", "sleds")

	u := e.waitFinalizer(t, "default", "s1", true)
	if fs := u.GetFinalizers(); slices.Contains(fs, "ferry.dev/"+agent) {
		t.Errorf("a finalizer named after the agent appeared: %v", fs)
	}
	e.deleteRemoteAndWaitGone(t, "default", "s1")
	if copies := e.localCopies(t, ""); len(copies) != 0 {
		var names []string
		for _, c := range copies {
			names = append(names, fmt.Sprintf("%s/%s (agent %s)", c.GetNamespace(), c.GetName(), c.GetLabels()[naming.LabelAgent]))
		}
		t.Errorf("local copies left after the kcp object is gone: %v", names)
	}
}

// TestUninstalledEdgeIsCleanedUpWithOneCommand: an edge uninstalled for
// good leaves its finalizer on every object it synced; ferry-broker
// release-finalizers removes it in every bound workspace, after which the
// objects can be deleted. The service cluster is not touched.
func TestUninstalledEdgeIsCleanedUpWithOneCommand(t *testing.T) {
	e := newSyncEnv(t, "uninstall.example.com", "Glider", "gliders", nil)
	names := []string{"g1", "g2", "g3"}
	for _, n := range names {
		e.syncedRemote(t, n)
	}
	// Uninstalled for good: the edge and its broker stop.
	stopChecked(t, e.edge)
	stopChecked(t, e.broker.Process)
	for _, n := range names {
		e.waitFinalizer(t, "default", n, true)
	}
	args := []string{"release-finalizers", "--kcp-kubeconfig", env.kcp.StableKubeconfig,
		"--apiexport", e.export.String(), "--edge", "edge"}
	dry, err := exec.Command(env.bins.Broker, append(args, "--dry-run")...).CombinedOutput()
	if err != nil || !strings.Contains(string(dry), "would release finalizer ferry.dev/edge on 3 objects") {
		t.Fatalf("dry run: %v\n%s", err, dry)
	}
	for _, n := range names {
		e.waitFinalizer(t, "default", n, true) // the dry run changed nothing
	}
	out, err := exec.Command(env.bins.Broker, args...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "released finalizer ferry.dev/edge on 3 objects") {
		t.Fatalf("release-finalizers: %v\n%s", err, out)
	}
	for _, n := range names {
		e.deleteRemoteAndWaitGone(t, "default", n)
	}
	if copies := e.localCopies(t, ""); len(copies) != len(names) {
		t.Errorf("the service cluster was touched: %d local copies, want %d", len(copies), len(names))
	}
	// A wrong export is a clear error, not a silent no-op.
	out, err = exec.Command(env.bins.Broker, "release-finalizers", "--kcp-kubeconfig", env.kcp.StableKubeconfig,
		"--apiexport", "nonsense", "--edge", "edge").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--apiexport \"nonsense\": want WORKSPACE/NAME") {
		t.Errorf("a malformed --apiexport: %v\n%s", err, out)
	}
}

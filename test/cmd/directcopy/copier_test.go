package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// The copier's decisions, against fake clients that record what it asks of
// kcp and of the service cluster.

const testCluster = "2abc"

var (
	testRemote = schema.GroupVersionResource{Group: "x.dev", Version: "v1", Resource: "things"}
	testLocal  = schema.GroupVersionResource{Group: "l.dev", Version: "v1", Resource: "things"}
)

// recorder lists the requests a fake client got, as "VERB resource
// namespace/name" (plus the patch, for patches).
type recorder struct {
	mu   sync.Mutex
	seen []string
}

func (r *recorder) react(a clienttesting.Action) (bool, runtime.Object, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := fmt.Sprintf("%s %s %s", strings.ToUpper(a.GetVerb()), a.GetResource().Resource, a.GetNamespace())
	switch a := a.(type) {
	case clienttesting.PatchAction:
		s += fmt.Sprintf("/%s %s %s", a.GetName(), a.GetPatchType(), a.GetPatch())
	case clienttesting.DeleteAction:
		s += "/" + a.GetName()
	}
	r.seen = append(r.seen, s)
	return true, nil, nil
}

func (r *recorder) requests() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seen)
}

type testCopier struct {
	*copier
	kcp, local *recorder
	kcpStore   cache.Indexer
	localStore cache.Store
}

// newTestCopier is a copier with finalizer ("" for none) whose clients are
// fakes and whose caches are filled by the test.
func newTestCopier(t *testing.T, finalizer string) *testCopier {
	t.Helper()
	tc := &testCopier{kcp: &recorder{}, local: &recorder{}}
	o := &options{resource: testRemote, localResource: testLocal, localKind: "Thing", workers: 1, finalizer: finalizer}
	c := &copier{o: o, log: slog.New(slog.DiscardHandler)}
	kcp := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())
	kcp.PrependReactor("*", "*", tc.kcp.react)
	c.clients.Store(testCluster, kcp)
	local := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())
	local.PrependReactor("*", "*", tc.local.react)
	c.local, c.kube = local, kubefake.NewClientset()
	newQueue := func() workqueue.TypedRateLimitingInterface[string] {
		return workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())
	}
	c.kcpQueue, c.statusQueue = newQueue(), newQueue()
	t.Cleanup(func() { c.kcpQueue.ShutDown(); c.statusQueue.ShutDown() })
	c.kcpStore = cache.NewIndexer(clusterKey, cache.Indexers{})
	// Never run: the test fills its store.
	c.localInformer = cache.NewSharedIndexInformer(&cache.ListWatch{}, &unstructured.Unstructured{}, 0, cache.Indexers{})
	tc.copier, tc.kcpStore, tc.localStore = c, c.kcpStore, c.localInformer.GetStore()
	return tc
}

func kcpObject(name string, finalizers ...string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"a": "1"}}}
	u.SetName(name)
	u.SetNamespace("default")
	u.SetResourceVersion("7")
	u.SetAnnotations(map[string]string{"kcp.io/cluster": testCluster})
	u.SetFinalizers(finalizers)
	return u
}

func localCopyOf(name, kcpNamespace string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetName(name)
	u.SetNamespace(testCluster)
	u.SetLabels(map[string]string{clusterLabel: testCluster, namespaceLabel: kcpNamespace})
	return u
}

func (tc *testCopier) reconcile(t *testing.T, name string) {
	t.Helper()
	if err := tc.copier.reconcile(context.Background(), kcpKey(testCluster, "default", name)); err != nil {
		t.Fatal(err)
	}
}

func wantRequests(t *testing.T, side string, got []string, want ...string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s requests %q, want %d starting %q", side, got, len(want), want)
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("%s request %d: %q, want %q...", side, i, got[i], want[i])
		}
	}
}

func TestNewObjectWithFinalizer(t *testing.T) {
	tc := newTestCopier(t, "directcopy.ferry.dev/copy")
	if err := tc.kcpStore.Add(kcpObject("a")); err != nil {
		t.Fatal(err)
	}
	tc.reconcile(t, "a")
	// The finalizer first, guarded by the resourceVersion; the copy once
	// the watch shows it.
	wantRequests(t, "kcp", tc.kcp.requests(),
		`PATCH things default/a application/merge-patch+json {"metadata":{"finalizers":["directcopy.ferry.dev/copy"],"resourceVersion":"7"}}`)
	wantRequests(t, "local", tc.local.requests())
}

func TestNewObjectWithoutFinalizer(t *testing.T) {
	tc := newTestCopier(t, "")
	if err := tc.kcpStore.Add(kcpObject("a")); err != nil {
		t.Fatal(err)
	}
	tc.reconcile(t, "a")
	wantRequests(t, "kcp", tc.kcp.requests())
	wantRequests(t, "local", tc.local.requests(), "PATCH things 2abc/a application/apply-patch+yaml")
	if _, pending := tc.pending.Load(testCluster + "/a"); !pending {
		t.Error("the applied copy is not pending until the local watch sees it")
	}
	// Applied and unchanged: nothing more.
	copyA := localCopyOf("a", "default")
	hash, _ := specHash(map[string]any{"a": "1"})
	copyA.SetAnnotations(map[string]string{hashAnnotation: hash})
	if err := tc.localStore.Add(copyA); err != nil {
		t.Fatal(err)
	}
	tc.reconcile(t, "a")
	wantRequests(t, "local", tc.local.requests(), "PATCH things 2abc/a")
}

func TestDeletedObjectWithoutFinalizer(t *testing.T) {
	tc := newTestCopier(t, "")
	// The watch's delete event: the object is gone from the cache, its
	// copy is not.
	for _, u := range []*unstructured.Unstructured{localCopyOf("a", "default"), localCopyOf("b", "other")} {
		if err := tc.localStore.Add(u); err != nil {
			t.Fatal(err)
		}
	}
	tc.reconcile(t, "a")
	tc.reconcile(t, "b") // its copy belongs to other/b: left alone
	tc.reconcile(t, "c") // no copy: nothing to do
	wantRequests(t, "kcp", tc.kcp.requests())
	wantRequests(t, "local", tc.local.requests(), "DELETE things 2abc/a")
}

func TestQuickCreateDeleteWithoutFinalizer(t *testing.T) {
	tc := newTestCopier(t, "")
	if err := tc.kcpStore.Add(kcpObject("a")); err != nil {
		t.Fatal(err)
	}
	tc.reconcile(t, "a")
	// Deleted in kcp before the local watch saw the copy.
	if err := tc.kcpStore.Delete(kcpObject("a")); err != nil {
		t.Fatal(err)
	}
	tc.reconcile(t, "a")
	wantRequests(t, "local", tc.local.requests(), "PATCH things 2abc/a", "DELETE things 2abc/a")
}

func TestTerminatingObjectWithoutFinalizer(t *testing.T) {
	tc := newTestCopier(t, "")
	obj := kcpObject("a", "someone.else/keeps-it")
	now := metav1.Now()
	obj.SetDeletionTimestamp(&now)
	if err := tc.kcpStore.Add(obj); err != nil {
		t.Fatal(err)
	}
	if err := tc.localStore.Add(localCopyOf("a", "default")); err != nil {
		t.Fatal(err)
	}
	tc.reconcile(t, "a")
	// The copy goes at once; the other finalizer is not ours to touch.
	wantRequests(t, "local", tc.local.requests(), "DELETE things 2abc/a")
	wantRequests(t, "kcp", tc.kcp.requests())
}

func TestDeletedObjectWithFinalizer(t *testing.T) {
	tc := newTestCopier(t, "directcopy.ferry.dev/copy")
	if err := tc.localStore.Add(localCopyOf("a", "default")); err != nil {
		t.Fatal(err)
	}
	// Gone from the cache with a finalizer means released by us, after the
	// copy was deleted: the cache's copy is stale.
	tc.reconcile(t, "a")
	wantRequests(t, "local", tc.local.requests())
	// Terminating and ours: delete the copy, and release once it is gone.
	obj := kcpObject("b", "directcopy.ferry.dev/copy", "someone.else/keeps-it")
	now := metav1.Now()
	obj.SetDeletionTimestamp(&now)
	if err := tc.kcpStore.Add(obj); err != nil {
		t.Fatal(err)
	}
	tc.reconcile(t, "b")
	wantRequests(t, "kcp", tc.kcp.requests(),
		`PATCH things default/b application/merge-patch+json {"metadata":{"finalizers":["someone.else/keeps-it"],"resourceVersion":"7"}}`)
}

func TestSweepEnqueuesEveryCopy(t *testing.T) {
	tc := newTestCopier(t, "")
	for _, u := range []*unstructured.Unstructured{localCopyOf("a", "default"), localCopyOf("b", "other")} {
		if err := tc.localStore.Add(u); err != nil {
			t.Fatal(err)
		}
	}
	tc.sweep()
	var keys []string
	for tc.kcpQueue.Len() > 0 {
		k, _ := tc.kcpQueue.Get()
		keys = append(keys, k)
		tc.kcpQueue.Done(k)
	}
	slices.Sort(keys)
	if want := []string{"2abc|default/a", "2abc|other/b"}; !slices.Equal(keys, want) {
		t.Errorf("swept %q, want %q", keys, want)
	}
}

func TestSplitKCPKey(t *testing.T) {
	c, ns, n, err := splitKCPKey(kcpKey("2abc", "default", "a"))
	if err != nil || c != "2abc" || ns != "default" || n != "a" {
		t.Errorf("got %q %q %q %v", c, ns, n, err)
	}
	if _, _, n, err := splitKCPKey("2abc|/a"); err != nil || n != "a" {
		t.Errorf("cluster-scoped: %q %v", n, err)
	}
	for _, bad := range []string{"", "2abc", "|ns/a", "2abc|ns/", "2abc|a"} {
		if _, _, _, err := splitKCPKey(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

package replication

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kcp-dev/logicalcluster/v3"
)

// Test managers are built only through NewManager and the manager's
// methods: their kcp is client-go's fake dynamic client (its object
// tracker, watches included) behind Options.NewClient, so objects reach
// the manager's caches through its real informers, and events are kcp
// writes. The tests run the workers' loop themselves (drain), so every
// step is deterministic.

var secretsGVR = schema.GroupVersionResource{Version: "v1", Resource: "secrets"}

// testListKinds are the list kinds the fake kcp serves.
var testListKinds = map[schema.GroupVersionResource]string{
	thingsGVR: "ThingList", secretsGVR: "SecretList", eventsGVR: "EventList", namespacesGVR: "NamespaceList",
}

// testVirtualWorkspace is the fake kcp's virtual workspace URL.
const testVirtualWorkspace = "https://kcp.invalid/vw"

// fakeKCP is the kcp behind a test manager's virtual workspace: one fake
// client serving every logical cluster (and "*", the watches), unless a
// cluster has a client of its own (serve).
type fakeKCP struct {
	*dynamicfake.FakeDynamicClient
	// reqs counts the requests the default client serves (lists and
	// watches left out).
	reqs *kcpRequests

	mu       sync.Mutex
	clusters map[string]*dynamicfake.FakeDynamicClient
}

// newFakeClient returns a fake kcp client holding copies of objs.
func newFakeClient(objs ...*unstructured.Unstructured) *dynamicfake.FakeDynamicClient {
	var ros []runtime.Object
	for _, o := range objs {
		ros = append(ros, o.DeepCopy())
	}
	return dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), testListKinds, ros...)
}

func newFakeKCP(objs ...*unstructured.Unstructured) *fakeKCP {
	k := &fakeKCP{FakeDynamicClient: newFakeClient(objs...), reqs: &kcpRequests{n: map[string]int{}}, clusters: map[string]*dynamicfake.FakeDynamicClient{}}
	k.PrependReactor("*", "*", k.reqs.count)
	return k
}

// serve makes the requests for one logical cluster go to client; the
// watches ("*") still list the default client.
func (k *fakeKCP) serve(cluster string, client *dynamicfake.FakeDynamicClient) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.clusters[cluster] = client
}

// newClient is the manager's Options.NewClient.
func (k *fakeKCP) newClient(cfg *rest.Config) (dynamic.Interface, error) {
	_, cluster, _ := strings.Cut(cfg.Host, "/clusters/")
	k.mu.Lock()
	defer k.mu.Unlock()
	if c, ok := k.clusters[cluster]; ok {
		return c, nil
	}
	return k.FakeDynamicClient, nil
}

// failCalls makes every list and watch of resource ("*": all) k serves
// fail with err (a shard that cannot be reached) until the returned
// function is called. Watches already open stay open.
func (k *fakeKCP) failCalls(resource string, err error) (recover func()) {
	var failing atomic.Bool
	failing.Store(true)
	k.PrependReactor("list", resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		return failing.Load(), nil, err
	})
	k.PrependWatchReactor(resource, func(k8stesting.Action) (bool, watch.Interface, error) {
		return failing.Load(), nil, err
	})
	return func() { failing.Store(false) }
}

// fakeShards is a sharded kcp: one fakeKCP per virtual workspace endpoint
// URL, each serving the workspaces of its shard. Its newClient routes a
// client by its endpoint URL, so a request reaches only that shard.
type fakeShards map[string]*fakeKCP

// newClient is the manager's Options.NewClient.
func (s fakeShards) newClient(cfg *rest.Config) (dynamic.Interface, error) {
	url, _, _ := strings.Cut(cfg.Host, "/clusters/")
	k, ok := s[url]
	if !ok {
		return nil, fmt.Errorf("no shard serves %s", url)
	}
	return k.newClient(cfg)
}

// holdLists makes the lists of gvr wait until the returned function is
// called (at the latest when the test ends).
func (k *fakeKCP) holdLists(t *testing.T, gvr schema.GroupVersionResource) (release func()) {
	ch := make(chan struct{})
	var once sync.Once
	release = func() { once.Do(func() { close(ch) }) }
	t.Cleanup(release)
	k.PrependReactor("list", gvr.Resource, func(k8stesting.Action) (bool, runtime.Object, error) {
		<-ch
		return false, nil, nil
	})
	return release
}

// env is a manager under test with its outbox and its kcp.
type env struct {
	t       *testing.T
	m       *Manager
	intents *Intents
	kcp     *fakeKCP
	// res is what the manager was last given to sync (ensure).
	res Resource
}

// thingsResource is the published resource "pr" the tests sync.
func thingsResource() Resource {
	return Resource{PublishedResource: "pr", GVR: thingsGVR, Selector: labels.Everything()}
}

// testManager returns a manager syncing thingsResource from a kcp holding
// objs, listed, with every object queued (not processed), and its outbox.
func testManager(t *testing.T, objs ...*unstructured.Unstructured) (*Manager, *Intents) {
	t.Helper()
	e := newEnv(t, thingsResource(), objs...)
	return e.m, e.intents
}

// newEnv is testManager for res, with the fake kcp.
func newEnv(t *testing.T, res Resource, objs ...*unstructured.Unstructured) *env {
	t.Helper()
	e := startEnv(t, newFakeKCP(objs...), res)
	e.waitListed()
	return e
}

// startEnv starts a manager syncing res from k's virtual workspace
// (opts adjust its options); it does not wait for the watches.
func startEnv(t *testing.T, k *fakeKCP, res Resource, opts ...func(*Options)) *env {
	t.Helper()
	intents := NewIntents(1, 100, nil)
	o := Options{KCP: &rest.Config{Host: "https://kcp.invalid"}, EdgeName: "nora", Outbox: intents, Log: logr.Discard(), NewClient: k.newClient}
	for _, f := range opts {
		f(&o)
	}
	m := NewManager(o)
	m.Ensure(res)
	m.SetVirtualWorkspace([]string{testVirtualWorkspace})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	m.start(ctx)
	return &env{t: t, m: m, intents: intents, kcp: k, res: res}
}

// waitListed waits until every published resource's watch has listed
// what kcp holds of its resource, and queued it, and every related watch
// has listed.
func (e *env) waitListed() {
	e.t.Helper()
	e.waitWatches(true, true)
}

// waitWatches is waitListed; queued tells whether to wait until the
// listed objects are queued too (a watch that did not restart queues
// nothing), related whether to wait for the related watches.
func (e *env) waitWatches(queued, related bool) {
	e.t.Helper()
	eventually(e.t, "the watches have listed", func() bool {
		objects := 0
		for _, s := range e.m.ResourceStats() {
			list, err := e.kcp.Resource(s.GVR).List(context.Background(), metav1.ListOptions{})
			if err != nil {
				e.t.Fatal(err)
			}
			if !s.Listed || s.Objects != len(list.Items) {
				return false
			}
			objects += s.Objects
		}
		for _, r := range e.res.Related {
			if related && !e.m.relatedListed(r.Resource) {
				return false
			}
		}
		return !queued || e.m.queue.Len() >= objects
	})
}

// ensure gives the manager res to sync (Ensure) and waits until a
// restarted watch has listed.
func (e *env) ensure(res Resource) {
	e.t.Helper()
	e.res = res
	e.m.Ensure(res)
	e.waitWatches(false, true)
}

// changed writes obj into kcp (created when it is not there) and waits
// until the manager's cache holds it and it is queued, as a watch event
// does. The queue must be drained before.
func (e *env) changed(obj *unstructured.Unstructured) {
	e.t.Helper()
	e.write(thingsGVR, obj)
	e.waitQueued("the cache holds "+obj.GetName()+"@"+obj.GetResourceVersion(), func(v ObjectView) bool {
		return v.Cached && v.Key.GetUid() == string(obj.GetUID()) && v.ResourceVersion == obj.GetResourceVersion()
	}, obj)
}

// write writes obj, an object of gvr, into kcp (created when it is not
// there).
func (e *env) write(gvr schema.GroupVersionResource, obj *unstructured.Unstructured) {
	e.t.Helper()
	ctx := context.Background()
	ri := e.kcp.Resource(gvr).Namespace(obj.GetNamespace())
	if _, err := ri.Update(ctx, obj.DeepCopy(), metav1.UpdateOptions{}); apierrors.IsNotFound(err) {
		_, err = ri.Create(ctx, obj.DeepCopy(), metav1.CreateOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
	} else if err != nil {
		e.t.Fatal(err)
	}
}

// relatedChanged writes obj, an object of the related kind gvr, into kcp
// (created when it is not there) and waits until the related watch holds
// it and has queued the references pointing at it (there must be one).
// The queue must be drained before.
func (e *env) relatedChanged(gvr schema.GroupVersionResource, obj *unstructured.Unstructured) {
	e.t.Helper()
	e.write(gvr, obj)
	eventually(e.t, "the related watch saw "+obj.GetName()+" change", func() bool { return e.m.queue.Len() > 0 })
}

// relatedGone deletes obj, an object of the related kind gvr, from kcp
// and waits like relatedChanged.
func (e *env) relatedGone(gvr schema.GroupVersionResource, obj *unstructured.Unstructured) {
	e.t.Helper()
	if err := e.kcp.Resource(gvr).Namespace(obj.GetNamespace()).Delete(context.Background(), obj.GetName(), metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
	eventually(e.t, "the related watch saw "+obj.GetName()+" go", func() bool { return e.m.queue.Len() > 0 })
}

// touch writes name again in kcp with a new resourceVersion and nothing
// else changed (like a write to a field that is not synced), and waits
// for the event (changed).
func (e *env) touch(name string) {
	e.t.Helper()
	obj, err := e.kcp.Resource(thingsGVR).Namespace("ns").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	rv, _ := strconv.Atoi(obj.GetResourceVersion())
	obj.SetResourceVersion(strconv.Itoa(rv + 100))
	e.changed(obj)
}

// gone deletes obj from kcp (no deletionTimestamp seen: the object
// vanishes) and waits until the manager's cache lost it and it is queued.
func (e *env) gone(obj *unstructured.Unstructured) {
	e.t.Helper()
	if err := e.kcp.Resource(thingsGVR).Namespace(obj.GetNamespace()).Delete(context.Background(), obj.GetName(), metav1.DeleteOptions{}); err != nil {
		e.t.Fatal(err)
	}
	e.waitQueued(obj.GetName()+" left the cache", func(v ObjectView) bool { return !v.Cached }, obj)
}

func (e *env) waitQueued(what string, cond func(ObjectView) bool, obj *unstructured.Unstructured) {
	e.t.Helper()
	eventually(e.t, what, func() bool {
		v, _ := e.m.Lookup("pr", logicalcluster.From(obj).String(), obj.GetNamespace(), obj.GetName())
		return cond(v) && e.m.queue.Len() > 0
	})
}

// drain processes the queue like the workers do, failing on a requeue loop.
func drain(t *testing.T, m *Manager) {
	t.Helper()
	for rounds := 0; m.queue.Len() > 0; rounds++ {
		if rounds > 10 {
			t.Fatal("requeue loop: the queue does not drain")
		}
		it, _ := m.queue.Get()
		if err := m.process(context.Background(), it); err != nil {
			t.Fatalf("process %v: %v", it, err)
		}
		m.queue.Done(it)
	}
}

// drainFinalizers writes the queued finalizers like the finalizer
// workers do, failing on a requeue loop.
func drainFinalizers(t *testing.T, m *Manager) {
	t.Helper()
	for rounds := 0; m.finalizers.Len() > 0; rounds++ {
		if rounds > 10 {
			t.Fatal("requeue loop: the finalizer queue does not drain")
		}
		m.processNextFinalizer(context.Background())
	}
}

// eventually waits until cond holds (at most 5 s).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

package replication

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// Issue 18, build item 7: nothing on the way to the edge waits for kcp.
// The intent of a new object goes to the edge without waiting for the
// finalizer write, delete intents never wait behind finalizer writes, and
// each object costs kcp only its necessary writes.

// kcpRequests counts the requests a fake kcp serves, by verb (and
// subresource), list and watch left out (the informers' own).
type kcpRequests struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *kcpRequests) count(a k8stesting.Action) (bool, runtime.Object, error) {
	verb := a.GetVerb()
	if verb == "list" || verb == "watch" {
		return false, nil, nil
	}
	if s := a.GetSubresource(); s != "" {
		verb += "/" + s
	}
	r.mu.Lock()
	r.n[verb]++
	r.mu.Unlock()
	return false, nil, nil
}

// take returns the counts so far and starts again.
func (r *kcpRequests) take() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.n
	r.n = map[string]int{}
	return out
}

// countingKCP serves objs as the fake kcp behind m's virtual workspace and
// counts its requests.
func countingKCP(m *Manager, objs ...*unstructured.Unstructured) (*dynamicfake.FakeDynamicClient, *kcpRequests) {
	var ros []runtime.Object
	for _, o := range objs {
		ros = append(ros, o.DeepCopy())
	}
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{thingsGVR: "ThingList"}, ros...)
	reqs := &kcpRequests{n: map[string]int{}}
	client.PrependReactor("*", "*", reqs.count)
	m.vwURL, m.vwKnown = "https://kcp.invalid/vw", true
	m.clients["c"], m.clients["*"] = client, client
	return client, reqs
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

// TestIntentGoesBeforeTheFinalizer: a new object's upsert is queued for
// the edge at once, not after its finalizer write in kcp (and the watch
// event of that write) came back; the finalizer write happens off that
// path. The copy sent before the finalizer landed is still never
// stranded: an object that vanishes (kubernetes#77988: deleted while the
// finalizer write was in flight), is deleted or leaves the filters before
// the finalizer lands gets a delete intent for exactly its UID. Before,
// process wrote the finalizer and sent nothing until the next event.
func TestIntentGoesBeforeTheFinalizer(t *testing.T) {
	spec := map[string]any{"size": int64(1)}
	team := map[string]string{"team": "a"}
	newObj := func() *unstructured.Unstructured { return withLabels(withoutFinalizer(thing("1", spec, nil)), team) }
	for _, tc := range []struct {
		name string
		// then happens after the upsert was queued, the finalizer write
		// not done; it returns the intent the edge is to get next (nil:
		// none).
		then       func(t *testing.T, m *Manager, intents *Intents) *ferryv1.SyncIntent
		wantDelete bool
	}{
		{name: "vanishes without a deletionTimestamp (finalizer write lost)", wantDelete: true,
			then: func(t *testing.T, m *Manager, intents *Intents) *ferryv1.SyncIntent {
				kcpGone(t, m, newObj())
				if err := m.clients["c"].Resource(thingsGVR).Namespace("ns").Delete(context.Background(), "a", metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
				drain(t, m)
				drainFinalizers(t, m) // nothing left to finalize
				return intents.Next()
			}},
		{name: "deleted in kcp (another finalizer holds it) before ours landed", wantDelete: true,
			then: func(t *testing.T, m *Manager, intents *Intents) *ferryv1.SyncIntent {
				obj := deleting(newObj())
				obj.SetFinalizers([]string{"someone.else/x"})
				obj.SetResourceVersion("2")
				kcpChanged(t, m, obj)
				drain(t, m)
				drainFinalizers(t, m) // never on an object being deleted
				return intents.Next()
			}},
		{name: "leaves the filter before ours landed", wantDelete: true,
			then: func(t *testing.T, m *Manager, intents *Intents) *ferryv1.SyncIntent {
				obj := withoutFinalizer(thing("2", spec, nil))
				kcpChanged(t, m, obj)
				drain(t, m)
				drainFinalizers(t, m)
				return intents.Next()
			}},
		{name: "the finalizer lands: nothing more is sent",
			then: func(t *testing.T, m *Manager, intents *Intents) *ferryv1.SyncIntent {
				drainFinalizers(t, m)
				kcpChanged(t, m, withLabels(thing("2", spec, nil), team))
				drain(t, m)
				return intents.Next()
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, intents := testManager(t, newObj())
			res := m.desired["pr"]
			res.Selector, res.HasStatus = labels.SelectorFromSet(team), true
			m.desired["pr"], m.running["pr"].res = res, res
			client, reqs := countingKCP(m, newObj())

			m.queue.Add(item{pr: "pr", key: "c|ns/a"})
			drain(t, m)
			up := intents.Next()
			if up.GetUpsert() == nil || up.GetKey().GetUid() != "u-a" {
				t.Fatalf("want the upsert of u-a before any finalizer write, got %v", up)
			}
			if got := reqs.take(); len(got) != 0 {
				t.Fatalf("kcp requests on the way to the edge: %v, want none", got)
			}
			// The edge applies it and reports a status before the
			// finalizer landed: the broker sent it, so it is written.
			edgeAcks(t, m, intents, up)
			written, err := m.WriteStatus(context.Background(), "pr", thingKey(), []byte(`{"ready":true}`))
			if err != nil || !written {
				t.Fatalf("status before the finalizer landed: written %v, %v", written, err)
			}

			next := tc.then(t, m, intents)
			if got := next.GetDelete() != nil; got != tc.wantDelete {
				t.Fatalf("delete intent = %v, want %v (next intent %v)", got, tc.wantDelete, next)
			}
			if !tc.wantDelete {
				if next != nil {
					t.Fatalf("unexpected intent %v", next)
				}
				if f := finalizersInKCP(t, client, "a"); !slices.Contains(f, "ferry.dev/nora") {
					t.Fatalf("finalizers in kcp %v: ours never landed", f)
				}
				return
			}
			if next.GetKey().GetUid() != "u-a" {
				t.Fatalf("delete intent for %v, want uid u-a", next.GetKey())
			}
			reqs.take()
			// The edge confirms: accepted, nothing to release in kcp
			// (ours never landed), and nothing is asked again.
			edgeAcks(t, m, intents, next)
			if err := m.Release(context.Background(), "pr", next.GetKey()); err != nil {
				t.Fatalf("confirmation refused: %v", err)
			}
			if got := reqs.take(); got["patch"] != 0 || got["get"] != 0 {
				t.Fatalf("kcp requests for a release with no finalizer: %v", got)
			}
			m.queue.Add(item{pr: "pr", key: "c|ns/a"})
			drain(t, m)
			if in := intents.Next(); in != nil {
				t.Fatalf("after the confirmation: %v", in)
			}
		})
	}
}

// blockingPatches makes client's patches wait until release is closed and
// returns a channel that gets one value per patch started.
func blockingPatches(client *dynamicfake.FakeDynamicClient, release <-chan struct{}) <-chan string {
	started := make(chan string, 100)
	client.PrependReactor("patch", "*", func(a k8stesting.Action) (bool, runtime.Object, error) {
		started <- a.(k8stesting.PatchAction).GetName()
		<-release
		return false, nil, nil
	})
	return started
}

// TestDeleteIntentsDoNotWaitForFinalizerWrites: while kcp is slow to take
// finalizer writes (new objects' finalizers, and the release of a deleted
// object the edge confirmed), the delete intent of another object deleted
// in kcp still goes to the edge at once. Before, a worker wrote each new
// object's finalizer itself: with the workers stuck in kcp, the delete
// waited behind them.
func TestDeleteIntentsDoNotWaitForFinalizerWrites(t *testing.T) {
	spec := map[string]any{"size": int64(1)}
	var objs []*unstructured.Unstructured
	for i := range 4 {
		objs = append(objs, withoutFinalizer(namedThing(fmt.Sprintf("new%d", i), spec)))
	}
	victim := namedThing("victim", spec)
	objs = append(objs, victim)
	// In a workspace of its own: the fake client serves one request at a
	// time.
	confirmed := deleting(namedThing("confirmed", spec))
	confirmed.SetAnnotations(map[string]string{"kcp.io/cluster": "d"})
	m, intents := testManager(t, append(objs, confirmed)...)
	client, _ := countingKCP(m, objs...)
	other, _ := countingKCP(m, confirmed)
	m.clients["c"] = client
	m.clients["d"] = other
	release := make(chan struct{})
	started := blockingPatches(client, release)
	otherStarted := blockingPatches(other, release)
	defer close(release)

	// The edge confirmed confirmed's deletion: its release is stuck in kcp.
	m.queue.Add(item{pr: "pr", key: "d|ns/confirmed"})
	drain(t, m)
	if in := intents.Next(); in.GetDelete() == nil {
		t.Fatalf("want confirmed's delete, got %v", in)
	}
	go func() { _ = m.Release(context.Background(), "pr", objectKey(confirmed, thingsGVR)) }()
	<-otherStarted

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.Run(ctx, 1)
	for i := range 4 {
		m.queue.Add(item{pr: "pr", key: fmt.Sprintf("c|ns/new%d", i)})
	}
	// Let the new objects' finalizer writes start (and hang).
	select {
	case <-started:
	case <-time.After(3 * time.Second):
		t.Fatal("no finalizer write started")
	}
	deleted := deleting(victim.DeepCopy())
	deleted.SetResourceVersion("2")
	if err := m.running["pr"].store.Update(deleted); err != nil {
		t.Fatal(err)
	}
	m.queue.Add(item{pr: "pr", key: "c|ns/victim"})

	deadline := time.Now().Add(3 * time.Second)
	for {
		in := intents.Next()
		if in.GetDelete() != nil && in.GetKey().GetName() == "victim" {
			return
		}
		if in == nil {
			if time.Now().After(deadline) {
				t.Fatal("the delete intent of victim waits behind finalizer writes")
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestKCPRequestsPerObject: what each step of an object's life costs kcp,
// by verb. Only necessary writes remain: the finalizer on create, one
// status patch when the status differs, the finalizer's release on
// delete. Nothing is read live: decisions use the cache, and writes carry
// preconditions (resourceVersion and UID) where safety needs them. Before,
// a report about an object no longer in the cache read it from kcp first.
func TestKCPRequestsPerObject(t *testing.T) {
	spec := map[string]any{"size": int64(1)}
	status := []byte(`{"ready":true}`)
	for _, tc := range []struct {
		name string
		// cached is the object in the broker's cache and in kcp (nil:
		// none).
		cached *unstructured.Unstructured
		step   func(t *testing.T, m *Manager, intents *Intents) error
		want   map[string]int
	}{
		{name: "create", cached: withoutFinalizer(thing("1", spec, nil)),
			step: func(t *testing.T, m *Manager, intents *Intents) error {
				m.queue.Add(item{pr: "pr", key: "c|ns/a"})
				drain(t, m)
				drainFinalizers(t, m)
				if in := intents.Next(); in.GetUpsert() == nil {
					return fmt.Errorf("no upsert: %v", in)
				}
				return nil
			},
			want: map[string]int{"patch": 1}},
		{name: "finalizer landed (our own write's event)", cached: thing("2", spec, nil),
			step: func(t *testing.T, m *Manager, intents *Intents) error {
				m.queue.Add(item{pr: "pr", key: "c|ns/a"})
				drain(t, m)
				drainFinalizers(t, m)
				return nil
			},
			want: map[string]int{}},
		{name: "status changed", cached: thing("2", spec, nil),
			step: func(t *testing.T, m *Manager, intents *Intents) error {
				_, err := m.WriteStatus(context.Background(), "pr", thingKey(), status)
				return err
			},
			want: map[string]int{"patch/status": 1}},
		{name: "status unchanged", cached: thing("3", spec, map[string]any{"ready": true}),
			step: func(t *testing.T, m *Manager, intents *Intents) error {
				_, err := m.WriteStatus(context.Background(), "pr", thingKey(), status)
				return err
			},
			want: map[string]int{}},
		{name: "deleted in kcp: delete intent", cached: deleting(thing("4", spec, nil)),
			step: func(t *testing.T, m *Manager, intents *Intents) error {
				m.queue.Add(item{pr: "pr", key: "c|ns/a"})
				drain(t, m)
				drainFinalizers(t, m)
				if in := intents.Next(); in.GetDelete() == nil {
					return fmt.Errorf("no delete: %v", in)
				}
				return nil
			},
			want: map[string]int{}},
		{name: "deletion confirmed: release", cached: deleting(thing("4", spec, nil)),
			step: func(t *testing.T, m *Manager, intents *Intents) error {
				return m.Release(context.Background(), "pr", thingKey())
			},
			want: map[string]int{"patch": 1}},
		{name: "deletion confirmed after the object left kcp",
			step: func(t *testing.T, m *Manager, intents *Intents) error {
				return m.Release(context.Background(), "pr", thingKey())
			},
			want: map[string]int{}},
		{name: "status report after the object left kcp",
			step: func(t *testing.T, m *Manager, intents *Intents) error {
				if _, err := m.WriteStatus(context.Background(), "pr", thingKey(), status); !errors.Is(err, ErrGone) {
					return fmt.Errorf("want gone, got %v", err)
				}
				return nil
			},
			want: map[string]int{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var cached []*unstructured.Unstructured
			if tc.cached != nil {
				cached = append(cached, tc.cached)
			}
			m, intents := testManager(t, cached...)
			res := m.desired["pr"]
			res.HasStatus = true
			m.desired["pr"], m.running["pr"].res = res, res
			_, reqs := countingKCP(m, cached...)
			if err := tc.step(t, m, intents); err != nil {
				t.Fatal(err)
			}
			if got := reqs.take(); !maps.Equal(got, tc.want) {
				t.Fatalf("kcp requests %v, want %v", got, tc.want)
			}
		})
	}
}

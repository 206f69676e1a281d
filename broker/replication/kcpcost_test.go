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
		then       func(t *testing.T, e *env) *ferryv1.SyncIntent
		wantDelete bool
	}{
		{name: "vanishes without a deletionTimestamp (finalizer write lost)", wantDelete: true,
			then: func(t *testing.T, e *env) *ferryv1.SyncIntent {
				m, intents := e.m, e.intents
				e.gone(newObj())
				drain(t, m)
				drainFinalizers(t, m) // nothing left to finalize
				return intents.Next()
			}},
		{name: "deleted in kcp (another finalizer holds it) before ours landed", wantDelete: true,
			then: func(t *testing.T, e *env) *ferryv1.SyncIntent {
				m, intents := e.m, e.intents
				obj := deleting(newObj())
				obj.SetFinalizers([]string{"someone.else/x"})
				obj.SetResourceVersion("2")
				e.changed(obj)
				drain(t, m)
				drainFinalizers(t, m) // never on an object being deleted
				return intents.Next()
			}},
		{name: "leaves the filter before ours landed", wantDelete: true,
			then: func(t *testing.T, e *env) *ferryv1.SyncIntent {
				m, intents := e.m, e.intents
				obj := withoutFinalizer(thing("2", spec, nil))
				e.changed(obj)
				drain(t, m)
				drainFinalizers(t, m)
				return intents.Next()
			}},
		{name: "the finalizer lands: nothing more is sent",
			then: func(t *testing.T, e *env) *ferryv1.SyncIntent {
				m, intents := e.m, e.intents
				drainFinalizers(t, m)
				e.changed(withLabels(thing("2", spec, nil), team))
				drain(t, m)
				return intents.Next()
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := thingsResource()
			res.Selector, res.HasStatus = labels.SelectorFromSet(team), true
			e := newEnv(t, res, newObj())
			m, intents, client, reqs := e.m, e.intents, e.kcp.FakeDynamicClient, e.kcp.reqs

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

			next := tc.then(t, e)
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
			if v, _ := m.Lookup("pr", "c", "ns", "a"); v.Cached {
				e.touch("a") // another event for the object
			}
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
	// The watches list and watch the default client; the writes into
	// workspace c (finalizers) and d (the release) go to clients of their
	// own, whose patches hang (a fake client serves one request at a
	// time).
	k := newFakeKCP(append(objs, confirmed)...)
	client, other := newFakeClient(objs...), newFakeClient(confirmed)
	k.serve("c", client)
	k.serve("d", other)
	release := make(chan struct{})
	started := blockingPatches(client, release)
	otherStarted := blockingPatches(other, release)
	defer close(release)
	e := startEnv(t, k, thingsResource())
	e.waitListed()
	m, intents := e.m, e.intents

	// Every listed object is processed: the new objects' upserts go out
	// (the edge applies them) and their finalizers are queued, and
	// confirmed's delete goes out.
	drain(t, m)
	var confirmedDelete *ferryv1.SyncIntent
	for _, in := range queued(intents) {
		if in.GetDelete() != nil && in.GetKey().GetName() == "confirmed" {
			confirmedDelete = in
			continue
		}
		edgeAcks(t, m, intents, in)
	}
	if confirmedDelete == nil {
		t.Fatal("want confirmed's delete")
	}
	// The edge confirmed confirmed's deletion: its release is stuck in kcp.
	go func() { _ = m.Release(context.Background(), "pr", objectKey(confirmed, thingsGVR)) }()
	select {
	case <-otherStarted:
	case <-time.After(3 * time.Second):
		t.Fatal("the release did not start")
	}

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go m.Run(ctx, 1, 1)
	// Let the new objects' finalizer writes start (and hang).
	select {
	case <-started:
	case <-time.After(3 * time.Second):
		t.Fatal("no finalizer write started")
	}
	deleted := deleting(victim.DeepCopy())
	deleted.SetResourceVersion("2")
	if _, err := k.Resource(thingsGVR).Namespace("ns").Update(context.Background(), deleted, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	eventually(t, "the delete intent of victim (not behind finalizer writes)", func() bool {
		in := intents.Next()
		return in.GetDelete() != nil && in.GetKey().GetName() == "victim"
	})
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
			res := thingsResource()
			res.HasStatus = true
			e := newEnv(t, res, cached...)
			m, intents, reqs := e.m, e.intents, e.kcp.reqs
			if err := tc.step(t, m, intents); err != nil {
				t.Fatal(err)
			}
			if got := reqs.take(); !maps.Equal(got, tc.want) {
				t.Fatalf("kcp requests %v, want %v", got, tc.want)
			}
		})
	}
}

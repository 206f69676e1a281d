package replication

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/kcp-dev/logicalcluster/v3"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/related"
)

// A sharded kcp (issue 19, item 3): the APIExportEndpointSlice lists one
// virtual workspace endpoint per shard, each serving the workspaces on its
// shard. The broker watches every one; writes go where the workspace
// lives; a shard drained or unreachable never makes its objects look
// deleted, and the other shards keep syncing.

const (
	shardA = "https://shard-a.invalid/services/apiexport/root/export"
	shardB = "https://shard-b.invalid/services/apiexport/root/export"
)

// thingIn is a Thing named name in workspace cluster, without the broker's
// finalizer (names are unique across clusters: one fake serves a shard's
// workspaces without telling them apart).
func thingIn(cluster, name string) *unstructured.Unstructured {
	u := withoutFinalizer(namedThing(name, map[string]any{"size": int64(1)}))
	u.SetAnnotations(map[string]string{"kcp.io/cluster": cluster})
	u.SetUID(types.UID("u-" + cluster + "-" + name))
	return u
}

// shardedEnv is a manager syncing thingsResource (with status) from a
// sharded kcp.
type shardedEnv struct {
	t       *testing.T
	m       *Manager
	intents *Intents
	shards  fakeShards
}

// startSharded starts a manager syncing thingsResource (with status)
// whose APIExportEndpointSlice lists urls, served by shards; it does not
// wait for the watches.
func startSharded(t *testing.T, shards fakeShards, urls ...string) *shardedEnv {
	t.Helper()
	res := thingsResource()
	res.HasStatus = true
	return startShardedWith(t, res, shards, urls...)
}

// startShardedWith is startSharded syncing res.
func startShardedWith(t *testing.T, res Resource, shards fakeShards, urls ...string) *shardedEnv {
	t.Helper()
	intents := NewIntents(1, 100, nil)
	m := NewManager(Options{KCP: &rest.Config{Host: "https://kcp.invalid"}, EdgeName: "nora", Outbox: intents, Log: logr.Discard(), NewClient: shards.newClient})
	m.Ensure(res)
	m.SetVirtualWorkspace(urls)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	m.start(ctx)
	return &shardedEnv{t: t, m: m, intents: intents, shards: shards}
}

// waitCached waits until the manager's cache holds exactly objs of the
// published resource.
func (e *shardedEnv) waitCached(objs ...*unstructured.Unstructured) {
	e.t.Helper()
	eventually(e.t, "the cache holds exactly "+names(objs), func() bool {
		for _, o := range objs {
			if v, _ := e.m.Lookup("pr", logicalcluster.From(o).String(), o.GetNamespace(), o.GetName()); !v.Cached {
				return false
			}
		}
		return e.m.Objects() == len(objs)
	})
}

// waitListed waits until the watch of the published resource has listed
// at every endpoint (listed) or not.
func (e *shardedEnv) waitListed(listed bool) {
	e.t.Helper()
	eventually(e.t, "the published resource is listed at every endpoint", func() bool {
		return e.m.ResourceStats()[0].Listed == listed
	})
}

// waitListedAt waits until the watch of the published resource at url has
// listed.
func (e *shardedEnv) waitListedAt(url string) {
	e.t.Helper()
	eventually(e.t, "the published resource is listed at "+url, func() bool {
		e.m.mu.Lock()
		w := e.m.running["pr"]
		e.m.mu.Unlock()
		return w != nil && w.store.listedAt(url)
	})
}

// relatedListedAt tells whether the related watch of gvr at url has
// listed.
func (e *shardedEnv) relatedListedAt(gvr schema.GroupVersionResource, url string) bool {
	e.m.mu.Lock()
	rw := e.m.relWatchers[gvr]
	e.m.mu.Unlock()
	return rw != nil && rw.store.listedAt(url)
}

// waitFinalized waits until the cache holds each of objs with the
// broker's finalizer (its write came back).
func (e *shardedEnv) waitFinalized(objs ...*unstructured.Unstructured) {
	e.t.Helper()
	eventually(e.t, "the cache holds "+names(objs)+" with the finalizer", func() bool {
		for _, o := range objs {
			if v, _ := e.m.Lookup("pr", logicalcluster.From(o).String(), o.GetNamespace(), o.GetName()); !v.Finalizer {
				return false
			}
		}
		return true
	})
}

// endpoint returns the manager's state of endpoint url.
func (e *shardedEnv) endpoint(url string) EndpointState {
	e.t.Helper()
	for _, s := range e.m.Endpoints() {
		if s.URL == url {
			return s
		}
	}
	e.t.Fatalf("endpoint %s is not in %v", url, e.m.Endpoints())
	return EndpointState{}
}

// writes returns the writes (not lists or watches) each shard served since
// the last call.
func (e *shardedEnv) writes() map[string]map[string]int {
	out := map[string]map[string]int{}
	for url, k := range e.shards {
		if n := k.reqs.take(); len(n) > 0 {
			out[url] = n
		}
	}
	return out
}

// inventory tells the manager, on a new stream, that the edge holds a copy
// of each obj in the state the broker sends.
func (e *shardedEnv) inventory(objs ...*unstructured.Unstructured) {
	e.t.Helper()
	e.m.Attach()
	inv := &ferryv1.Inventory{PublishedResource: "pr", Complete: true}
	for _, o := range objs {
		inv.Entries = append(inv.Entries, &ferryv1.InventoryEntry{Key: objectKey(o, thingsGVR), AppliedHash: hashOf(e.t, o)})
	}
	e.m.Inventory(inv)
}

func names(objs []*unstructured.Unstructured) string {
	var out []string
	for _, o := range objs {
		out = append(out, logicalcluster.From(o).String()+"/"+o.GetName())
	}
	return "[" + strings.Join(out, " ") + "]"
}

// intentsNow drains the queue and returns what the edge is sent,
// described ("upsert name@uid", "delete name@uid"), sorted; the edge
// acknowledges each.
func (e *shardedEnv) intentsNow() []string {
	e.t.Helper()
	drain(e.t, e.m)
	sent := queued(e.intents)
	for _, in := range sent {
		edgeAcks(e.t, e.m, e.intents, in)
	}
	out := describe(sent)
	slices.Sort(out)
	return out
}

// TestEveryEndpointIsSynced: objects in workspaces on either shard are
// synced, and every write for a workspace (finalizer, status) goes to its
// own shard only. Before, only the first endpoint was watched: the second
// shard's workspaces were never synced.
func TestEveryEndpointIsSynced(t *testing.T) {
	one, two := thingIn("ws-a", "one"), thingIn("ws-b", "two")
	e := startSharded(t, fakeShards{shardA: newFakeKCP(one), shardB: newFakeKCP(two)}, shardA, shardB)
	e.waitCached(one, two)
	e.waitListed(true)

	if got, want := e.intentsNow(), []string{"upsert one@u-ws-a-one", "upsert two@u-ws-b-two"}; !slices.Equal(got, want) {
		t.Fatalf("intents %q, want %q", got, want)
	}
	drainFinalizers(t, e.m)
	wantWrites := map[string]map[string]int{shardA: {"patch": 1}, shardB: {"patch": 1}}
	if got := e.writes(); !equalWrites(got, wantWrites) {
		t.Fatalf("finalizer writes by shard %v, want %v", got, wantWrites)
	}
	if f := finalizersInKCP(t, e.shards[shardB].FakeDynamicClient, "two"); !slices.Contains(f, "ferry.dev/nora") {
		t.Fatalf("finalizers of two on its shard: %v", f)
	}
	e.writes() // the test's own read

	// The status of two, once its finalizer is cached, is written on
	// shard B only.
	e.waitFinalized(two)
	if written, err := e.m.WriteStatus(context.Background(), "pr", objectKey(two, thingsGVR), []byte(`{"ready":true}`)); err != nil || !written {
		t.Fatalf("WriteStatus: written %v, %v", written, err)
	}
	wantWrites = map[string]map[string]int{shardB: {"patch/status": 1}}
	if got := e.writes(); !equalWrites(got, wantWrites) {
		t.Fatalf("status writes by shard %v, want %v", got, wantWrites)
	}
}

func equalWrites(a, b map[string]map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for url, n := range a {
		m, ok := b[url]
		if !ok || len(n) != len(m) {
			return false
		}
		for verb, c := range n {
			if m[verb] != c {
				return false
			}
		}
	}
	return true
}

// TestEndpointRemovedDeletesNothing: a shard drained from the slice stops
// its watches; its objects leave the cache but are not taken as deleted —
// not when they leave, not at the next inventory — and nothing is released
// or written on it. When the endpoint comes back, nothing is sent again.
func TestEndpointRemovedDeletesNothing(t *testing.T) {
	one, two := thingIn("ws-a", "one"), thingIn("ws-b", "two")
	e := startSharded(t, fakeShards{shardA: newFakeKCP(one), shardB: newFakeKCP(two)}, shardA, shardB)
	e.waitCached(one, two)
	e.waitListed(true)
	e.inventory(one, two) // the edge holds both copies
	if got := e.intentsNow(); len(got) != 0 {
		t.Fatalf("intents %q, want none (both copies applied)", got)
	}
	drainFinalizers(t, e.m)
	e.waitFinalized(one, two)
	e.writes()

	e.m.SetVirtualWorkspace([]string{shardA})
	e.waitCached(one)
	if got := e.intentsNow(); len(got) != 0 {
		t.Fatalf("after shard B was drained: intents %q, want none", got)
	}
	// A reconnect compares the edge's copies with the caches: two's is not
	// gone, its shard cannot tell.
	e.inventory(one, two)
	if got := e.intentsNow(); len(got) != 0 {
		t.Fatalf("after shard B was drained and the edge reconnected: intents %q, want none", got)
	}
	// Reports about two are not applied anywhere (not on shard A by
	// guess): they wait.
	if _, err := e.m.WriteStatus(context.Background(), "pr", objectKey(two, thingsGVR), []byte(`{"ready":true}`)); err == nil || errors.Is(err, ErrGone) || errors.Is(err, ErrRefused) {
		t.Fatalf("WriteStatus for a drained shard's object: %v, want a transient error", err)
	}
	if err := e.m.Release(context.Background(), "pr", objectKey(two, thingsGVR)); err == nil || errors.Is(err, ErrRefused) {
		t.Fatalf("Release of a drained shard's object: %v, want a transient error", err)
	}
	drainFinalizers(t, e.m)
	if got := e.writes(); len(got) != 0 {
		t.Fatalf("writes %v, want none", got)
	}

	// Back: its object is cached again, and the copy the edge holds is
	// current.
	e.m.SetVirtualWorkspace([]string{shardA, shardB})
	e.waitCached(one, two)
	e.waitListed(true)
	if got := e.intentsNow(); len(got) != 0 {
		t.Fatalf("after shard B came back: intents %q, want none", got)
	}
}

// TestUnreachableEndpoint: while shard B's lists fail, shard A keeps
// syncing (creates and deletions of its objects included), B is reported
// unreachable with its error, and no copy is taken as gone on the word of
// an incomplete list: the inventory comparison waits until B has listed.
func TestUnreachableEndpoint(t *testing.T) {
	one, two, three := thingIn("ws-a", "one"), thingIn("ws-b", "two"), thingIn("ws-c", "three")
	a, b := newFakeKCP(one), newFakeKCP(two)
	recoverB := b.failCalls("*", errors.New("dial tcp 10.0.0.2:6443: connect: connection refused"))
	e := startSharded(t, fakeShards{shardA: a, shardB: b}, shardA, shardB)
	e.waitCached(one)
	eventually(t, "shard B is reported unreachable", func() bool { return !e.endpoint(shardB).Reachable })
	if st := e.endpoint(shardB); !strings.Contains(st.LastError, "connection refused") || st.Since.IsZero() {
		t.Fatalf("shard B's state %+v: want its error and since when", st)
	}
	if !e.endpoint(shardA).Reachable {
		t.Fatalf("shard A reported unreachable: %+v", e.endpoint(shardA))
	}
	e.waitListed(false)
	e.waitListedAt(shardA)
	if got, want := e.intentsNow(), []string{"upsert one@u-ws-a-one"}; !slices.Equal(got, want) {
		t.Fatalf("intents %q, want %q (shard A syncs)", got, want)
	}

	// The edge holds one, two (shard B's) and three (a workspace no watch
	// has seen; gone from kcp).
	e.inventory(one, two, three)
	if got := e.intentsNow(); len(got) != 0 {
		t.Fatalf("intents %q while shard B is unreachable, want none (nothing gone yet)", got)
	}

	// Shard A keeps syncing: a new object, and a deleted one.
	four := thingIn("ws-a", "four")
	env := &env{t: t, m: e.m, kcp: a}
	env.changed(four)
	if got, want := e.intentsNow(), []string{"upsert four@u-ws-a-four"}; !slices.Equal(got, want) {
		t.Fatalf("intents %q, want %q", got, want)
	}
	env.gone(one)
	if got, want := e.intentsNow(), []string{"delete one@u-ws-a-one"}; !slices.Equal(got, want) {
		t.Fatalf("intents %q, want %q", got, want)
	}

	// B recovers: it lists, and only now is three known gone; two is
	// current.
	recoverB()
	e.waitListed(true)
	eventually(t, "shard B is reported reachable", func() bool { return e.endpoint(shardB).Reachable })
	if got, want := e.intentsNow(), []string{"delete three@u-ws-c-three"}; !slices.Equal(got, want) {
		t.Fatalf("after shard B recovered: intents %q, want %q", got, want)
	}
}

// TestEndpointAddedLater: a shard added to the slice is watched, and its
// workspaces' objects sync.
func TestEndpointAddedLater(t *testing.T) {
	one, two := thingIn("ws-a", "one"), thingIn("ws-b", "two")
	e := startSharded(t, fakeShards{shardA: newFakeKCP(one), shardB: newFakeKCP(two)}, shardA)
	e.waitCached(one)
	e.waitListed(true)
	if got, want := e.intentsNow(), []string{"upsert one@u-ws-a-one"}; !slices.Equal(got, want) {
		t.Fatalf("intents %q, want %q", got, want)
	}

	e.m.SetVirtualWorkspace([]string{shardA, shardB})
	e.waitCached(one, two)
	e.waitListed(true)
	if got, want := e.intentsNow(), []string{"upsert two@u-ws-b-two"}; !slices.Equal(got, want) {
		t.Fatalf("after shard B was added: intents %q, want %q", got, want)
	}
}

// TestEndpointRouting: a workspace's client is at the endpoint whose
// watch saw it; with one endpoint, every workspace is there; with several,
// an unknown workspace is not guessed.
func TestEndpointRouting(t *testing.T) {
	tests := []struct {
		name    string
		urls    []string
		homes   map[string]string // cluster → endpoint seen at
		cluster string
		want    string // the client's host; "" for an error
		wantErr error
	}{
		{name: "no endpoint", cluster: "ws", wantErr: ErrVirtualWorkspaceNotServed},
		{name: "one endpoint, unknown workspace", urls: []string{shardA}, cluster: "ws", want: shardA + "/clusters/ws"},
		{name: "one endpoint, workspace seen there", urls: []string{shardA}, homes: map[string]string{"ws": shardA}, cluster: "ws", want: shardA + "/clusters/ws"},
		{name: "two endpoints, workspace on the second", urls: []string{shardA, shardB}, homes: map[string]string{"ws": shardB}, cluster: "ws", want: shardB + "/clusters/ws"},
		{name: "two endpoints, unknown workspace", urls: []string{shardA, shardB}, homes: map[string]string{"other": shardB}, cluster: "ws", wantErr: ErrWorkspaceNotLocated},
		{name: "workspace on a drained shard", urls: []string{shardA}, homes: map[string]string{"ws": shardB}, cluster: "ws", wantErr: ErrWorkspaceNotLocated},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newEndpointSet(logr.Discard(), &rest.Config{Host: "https://kcp.invalid"}, func(cfg *rest.Config) (dynamic.Interface, error) {
				return hostClient{host: cfg.Host}, nil
			}, nil)
			s.set(tt.urls)
			for cluster, url := range tt.homes {
				s.observed(cluster, url)
			}
			c, err := s.client(tt.cluster)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("client: %v, want %v", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := c.(hostClient).host; got != tt.want {
				t.Fatalf("client at %s, want %s", got, tt.want)
			}
		})
	}
}

// hostClient is a client that only tells where it points.
type hostClient struct {
	dynamic.Interface
	host string
}

// TestEndpointReachability: an endpoint is unreachable while any of its
// watches' last call failed, and changed is told of each turn only.
func TestEndpointReachability(t *testing.T) {
	turns := 0
	s := newEndpointSet(logr.Discard(), &rest.Config{}, nil, func() { turns++ })
	s.set([]string{shardA, shardB})
	ctx := context.Background()
	refused := errors.New("connection refused")
	steps := []struct {
		name          string
		call          func()
		wantReachable bool
		wantTurns     int
	}{
		{name: "first list at B fails", call: func() { s.called(ctx, shardB, 1, refused) }, wantReachable: false, wantTurns: 1},
		{name: "a second watch at B fails", call: func() { s.called(ctx, shardB, 2, refused) }, wantReachable: false, wantTurns: 1},
		{name: "the first watch recovers, the second still fails", call: func() { s.called(ctx, shardB, 1, nil) }, wantReachable: false, wantTurns: 1},
		{name: "the second watch stops", call: func() { s.forget(shardB, 2) }, wantReachable: true, wantTurns: 2},
		{name: "a call cancelled with its watch tells nothing", call: func() {
			cancelled, cancel := context.WithCancel(ctx)
			cancel()
			s.called(cancelled, shardB, 1, context.Canceled)
		}, wantReachable: true, wantTurns: 2},
		{name: "no client can be built for B", call: func() { s.unusable(shardB, refused) }, wantReachable: false, wantTurns: 3},
		{name: "an endpoint no longer listed tells nothing", call: func() { s.called(ctx, "https://drained.invalid/vw", 9, refused) }, wantReachable: false, wantTurns: 3},
	}
	for _, st := range steps {
		st.call()
		states := s.states()
		if len(states) != 2 || states[0].URL != shardA || !states[0].Reachable {
			t.Fatalf("%s: states %+v: want A reachable, first", st.name, states)
		}
		b := states[1]
		if b.Reachable != st.wantReachable || turns != st.wantTurns {
			t.Fatalf("%s: B %+v, %d turns; want reachable %v, %d turns", st.name, b, turns, st.wantReachable, st.wantTurns)
		}
		if !b.Reachable && b.LastError != refused.Error() {
			t.Fatalf("%s: B's last error %q", st.name, b.LastError)
		}
	}
}

// TestRelatedObjectsOnAHealthyShardSync: while shard B cannot be reached,
// a kcp-origin related object in a workspace on shard A is sent once A's
// related watch has listed: it does not wait for every endpoint.
func TestRelatedObjectsOnAHealthyShardSync(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "creds", Origin: ferryv1alpha1.OriginKCP, Kind: "Secret",
		Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	primary := thingIn("ws-a", "one")
	primary.Object["spec"] = map[string]any{"secretName": "creds"}
	secret := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret",
		"metadata": map[string]any{"name": "creds", "namespace": "ns", "uid": "u-s", "resourceVersion": "7",
			"annotations": map[string]any{"kcp.io/cluster": "ws-a"}},
		"data": map[string]any{"password": "aHVudGVyMg=="}}}
	a, b := newFakeKCP(primary, secret), newFakeKCP()
	b.failCalls("*", errors.New("connection refused"))
	releaseSecrets := a.failCalls("secrets", errors.New("etcd is slow"))
	res := thingsResource()
	res.Related = refs
	e := startShardedWith(t, res, fakeShards{shardA: a, shardB: b}, shardA, shardB)
	e.waitCached(primary)
	e.waitListedAt(shardA)

	// The primary is sent and applied; its related object waits for the
	// secrets watch at A.
	drain(t, e.m)
	edgeAcks(t, e.m, e.intents, edgeTakes(t, e.intents))
	drain(t, e.m)
	if got := queued(e.intents); len(got) != 0 {
		t.Fatalf("intents %v before the secrets were listed, want none", describe(got))
	}

	releaseSecrets()
	// The reflector retries within its backoff (at most 4 s).
	deadline := time.Now().Add(10 * time.Second)
	// Nothing else queues the reference: the listing at A must.
	for !e.relatedListedAt(secretsGVR, shardA) || e.m.queue.Len() == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("shard A's secrets listed %v, queued %d: want listed and the reference queued", e.relatedListedAt(secretsGVR, shardA), e.m.queue.Len())
		}
		time.Sleep(10 * time.Millisecond)
	}
	drain(t, e.m)
	got := queued(e.intents)
	if len(got) != 1 || got[0].GetRelatedTo().GetIdentifier() != "creds" || got[0].GetUpsert() == nil || got[0].GetKey().GetCluster() != "ws-a" {
		t.Fatalf("intents %v, want the related upsert of creds in ws-a", got)
	}
}

package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/ferry-dev/ferry/pkg/logging"
)

// The endpoint set: the APIExport's virtual workspace endpoints (one per
// kcp shard that serves bound workspaces), their clients, whether each can
// be reached, and on which endpoint each workspace lives. Objects are keyed
// by logical cluster everywhere else; only writes into kcp need to know the
// shard, and they learn it from the watches: no request per object.

// ErrVirtualWorkspaceNotServed: kcp lists no endpoint for the APIExport yet
// (it needs at least one APIBinding). Transient.
var ErrVirtualWorkspaceNotServed = errors.New("the APIExport's virtual workspace is not served yet")

// ErrWorkspaceNotLocated: the virtual workspace has several endpoints (a
// sharded kcp) and no watch has seen the workspace on a current one yet,
// so it is not known which shard to write to. Transient: retried once a
// watch has listed the workspace's shard.
var ErrWorkspaceNotLocated = errors.New("the workspace's shard is not known yet (no watch at a current virtual workspace endpoint has seen it)")

// EndpointState is what the broker knows about one virtual workspace
// endpoint.
type EndpointState struct {
	// URL is the endpoint as the broker reaches it.
	URL string
	// Reachable is false while a list or watch at the endpoint fails.
	Reachable bool
	// LastError is the last list or watch error while unreachable.
	LastError string
	// Since is when the endpoint became reachable or unreachable (or was
	// first listed).
	Since time.Time
}

// endpointSet is safe for concurrent use. Its lock is a leaf: nothing is
// called under it but client construction.
type endpointSet struct {
	log       logr.Logger
	kcp       *rest.Config
	newClient func(*rest.Config) (dynamic.Interface, error)
	// changed, when set, is called (without locks) when an endpoint's
	// reachability changes.
	changed func()
	// ids numbers the watches that report their calls (observeCalls).
	ids atomic.Uint64

	mu sync.Mutex
	// known: the endpoint list was observed at least once (empty included).
	known bool
	urls  []string // sorted
	byURL map[string]*endpoint
	// homes maps a logical cluster to the URL of the endpoint whose watch
	// last saw one of its objects. An entry whose endpoint was removed is
	// kept: that workspace's shard is not reachable, and nothing about its
	// objects is concluded until a current endpoint shows it again.
	homes map[string]string
}

type endpoint struct {
	clients map[string]dynamic.Interface // by logical cluster; "*" for all
	// failing holds, per watch (observeCalls id), the error of its last
	// list or watch call, while that call failed.
	failing map[uint64]error
	lastErr error
	since   time.Time
}

func newEndpointSet(log logr.Logger, kcp *rest.Config, newClient func(*rest.Config) (dynamic.Interface, error), changed func()) *endpointSet {
	if newClient == nil {
		newClient = func(cfg *rest.Config) (dynamic.Interface, error) { return dynamic.NewForConfig(cfg) }
	}
	return &endpointSet{log: log, kcp: kcp, newClient: newClient, changed: changed, byURL: map[string]*endpoint{}, homes: map[string]string{}}
}

// set makes urls (sorted, without duplicates) the current endpoints;
// false when they were already. Removed endpoints lose their clients and
// state; their workspaces keep their home (see homes).
func (s *endpointSet) set(urls []string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.known && slices.Equal(urls, s.urls) {
		return false
	}
	s.known, s.urls = true, slices.Clone(urls)
	for url := range s.byURL {
		if !slices.Contains(urls, url) {
			delete(s.byURL, url)
		}
	}
	for _, url := range urls {
		if _, ok := s.byURL[url]; !ok {
			s.byURL[url] = &endpoint{clients: map[string]dynamic.Interface{}, failing: map[uint64]error{}, since: time.Now()}
		}
	}
	return true
}

// current returns the current endpoint URLs and whether they were
// observed at all.
func (s *endpointSet) current() ([]string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.urls), s.known
}

// observed records that a watch at url saw an object of cluster.
func (s *endpointSet) observed(cluster, url string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.homes[cluster] != url {
		s.homes[cluster] = url
	}
}

// home is the URL of the endpoint cluster was last seen at.
func (s *endpointSet) home(cluster string) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	url, ok := s.homes[cluster]
	return url, ok
}

// client returns a client for cluster at the endpoint serving it: its
// home when that is a current endpoint; for a workspace no watch has seen,
// the only endpoint when there is one. It does not guess otherwise (a
// write to the wrong shard fails as not found, which reads as "gone"):
// with several endpoints, or when the workspace's endpoint was removed,
// ErrWorkspaceNotLocated.
func (s *endpointSet) client(cluster string) (dynamic.Interface, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.urls) == 0 {
		return nil, ErrVirtualWorkspaceNotServed
	}
	url, seen := s.homes[cluster]
	_, current := s.byURL[url]
	switch {
	case seen && current:
	case !seen && len(s.urls) == 1 && cluster != "*":
		url = s.urls[0]
	default:
		return nil, fmt.Errorf("%w: workspace %s", ErrWorkspaceNotLocated, cluster)
	}
	return s.clientAtLocked(url, cluster)
}

// clientAt returns a client for cluster ("*" for all) at endpoint url.
func (s *endpointSet) clientAt(url, cluster string) (dynamic.Interface, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.clientAtLocked(url, cluster)
}

func (s *endpointSet) clientAtLocked(url, cluster string) (dynamic.Interface, error) {
	e, ok := s.byURL[url]
	if !ok {
		return nil, fmt.Errorf("%s is no longer an endpoint of the APIExport's virtual workspace", url)
	}
	if c, ok := e.clients[cluster]; ok {
		return c, nil
	}
	cfg := rest.CopyConfig(s.kcp)
	cfg.Host = url + "/clusters/" + cluster
	c, err := s.newClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("cannot build a client for virtual workspace endpoint %s: %w", url, err)
	}
	e.clients[cluster] = c
	return c, nil
}

// observeCalls makes lw, a watch at endpoint url, report the outcome of
// each list and watch call to the endpoint's reachability: the reflector
// retries a failed call with backoff, so each retry tells again (no
// polling). It returns the watch's id for forget.
func (s *endpointSet) observeCalls(url string, lw *cache.ListWatch) (*cache.ListWatch, uint64) {
	id := s.ids.Add(1)
	list, watchFn := lw.ListWithContextFunc, lw.WatchFuncWithContext
	lw.ListWithContextFunc = func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
		obj, err := list(ctx, o)
		s.called(ctx, url, id, err)
		return obj, err
	}
	lw.WatchFuncWithContext = func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
		w, err := watchFn(ctx, o)
		s.called(ctx, url, id, err)
		return w, err
	}
	return lw, id
}

// called records the outcome of one call of watch id at url; a call that
// failed because its watch was stopped tells nothing.
func (s *endpointSet) called(ctx context.Context, url string, id uint64, err error) {
	if err != nil && ctx.Err() != nil {
		return
	}
	s.update(url, func(e *endpoint) {
		if err != nil {
			e.failing[id] = err
			e.lastErr = err
		} else {
			delete(e.failing, id)
		}
	})
}

// unusable records that no watch can run at url (err): it is unreachable
// for as long as it is listed.
func (s *endpointSet) unusable(url string, err error) {
	id := s.ids.Add(1)
	s.update(url, func(e *endpoint) {
		e.failing[id] = err
		e.lastErr = err
	})
}

// forget drops what watch id reported: it stopped.
func (s *endpointSet) forget(url string, id uint64) {
	s.update(url, func(e *endpoint) { delete(e.failing, id) })
}

// update applies f to url's endpoint (if it is current) and tells changed
// when that turned its reachability.
func (s *endpointSet) update(url string, f func(*endpoint)) {
	s.mu.Lock()
	e, ok := s.byURL[url]
	if !ok {
		s.mu.Unlock()
		return
	}
	was := len(e.failing) == 0
	f(e)
	now := len(e.failing) == 0
	if was != now {
		e.since = time.Now()
		if now {
			s.log.Info("virtual workspace endpoint reachable again", logging.KeyEndpoint, url)
		} else {
			s.log.Error(e.lastErr, "virtual workspace endpoint unreachable; its workspaces wait, the other endpoints' keep syncing", logging.KeyEndpoint, url)
		}
	}
	s.mu.Unlock()
	if was != now && s.changed != nil {
		s.changed()
	}
}

// states returns every current endpoint's state, by URL.
func (s *endpointSet) states() []EndpointState {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]EndpointState, 0, len(s.urls))
	for _, url := range s.urls {
		e := s.byURL[url]
		st := EndpointState{URL: url, Reachable: len(e.failing) == 0, Since: e.since}
		if !st.Reachable && e.lastErr != nil {
			st.LastError = e.lastErr.Error()
		}
		out = append(out, st)
	}
	return out
}

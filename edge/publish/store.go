package publish

import (
	"fmt"
	"sort"
	"sync"

	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

// Store is what the publish controller and the broker stream share: the
// Publish each PublishedResource wants sent, the broker's latest result for
// each, and the connection state. The controller writes desired state; the
// stream sends it whenever it changes and again after every reconnect, so
// nothing is lost across connection drops. Safe for concurrent use.
type Store struct {
	brokerAddress string

	mu      sync.Mutex
	desired map[string]*ferryv1.Publish
	dirty   map[string]struct{} // to send: a Publish, or an Unpublish when not desired
	results map[string]*ferryv1.PublishResult
	// releasing holds the Unpublish (with a release policy) of each
	// PublishedResource being deleted, re-sent on every stream until the
	// broker answers it; released records those it answered.
	releasing map[string]*ferryv1.Unpublish
	released  map[string]*ferryv1.PublishResult
	connected bool
	export    *ferryv1.ExportStatus
	queue     workqueue.TypedRateLimitingInterface[reconcile.Request]
	wake      func()
}

// NewStore returns an empty store; brokerAddress is only used in messages;
// wake is called (it must not block) when Outgoing has something to send.
func NewStore(brokerAddress string, wake func()) *Store {
	return &Store{
		brokerAddress: brokerAddress,
		desired:       map[string]*ferryv1.Publish{},
		dirty:         map[string]struct{}{},
		results:       map[string]*ferryv1.PublishResult{},
		releasing:     map[string]*ferryv1.Unpublish{},
		released:      map[string]*ferryv1.PublishResult{},
		wake:          wake,
	}
}

// Set makes msg the Publish of its PublishedResource; an identical one is
// not sent again.
func (s *Store) Set(msg *ferryv1.Publish) {
	s.mu.Lock()
	defer s.mu.Unlock()
	name := msg.GetPublishedResource()
	// Recreated after a deletion: nothing to release any more.
	delete(s.releasing, name)
	delete(s.released, name)
	if old, ok := s.desired[name]; ok && proto.Equal(old, msg) {
		return
	}
	s.desired[name] = msg
	s.markDirty(name)
}

// Remove withdraws a PublishedResource (sends Unpublish if it was sent).
func (s *Store) Remove(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.desired[name]; !ok {
		return
	}
	delete(s.desired, name)
	delete(s.results, name)
	s.markDirty(name)
}

// Release asks the broker to release every object of a deleted
// PublishedResource (u carries the policy and the served resource) and
// returns the broker's answer once it came (nil before). The request is
// re-sent on every stream until answered.
func (s *Store) Release(u *ferryv1.Unpublish) *ferryv1.PublishResult {
	s.mu.Lock()
	defer s.mu.Unlock()
	name := u.GetPublishedResource()
	if r, ok := s.released[name]; ok {
		return r
	}
	delete(s.desired, name)
	delete(s.results, name)
	if old, ok := s.releasing[name]; !ok || !proto.Equal(old, u) {
		s.releasing[name] = u
		s.markDirty(name)
	}
	return nil
}

// Forget drops what the store knows of a PublishedResource that is gone.
func (s *Store) Forget(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.releasing, name)
	delete(s.released, name)
}

func (s *Store) markDirty(name string) {
	s.dirty[name] = struct{}{}
	if s.connected {
		s.wake()
	}
}

// Status is what the controller needs to write a PublishedResource's status.
type Status struct {
	// Result is the broker's latest answer for the PublishedResource, if any.
	Result *ferryv1.PublishResult
	// Connected tells whether a stream to the broker is open.
	Connected bool
	// ExportName is the APIExport's name (the API group in kcp), once known.
	ExportName string
	// Export is the broker's latest report on the APIExport (its virtual
	// workspace), nil before the first.
	Export *ferryv1.ExportStatus
	// ExportWorkspace is the APIExport's workspace path, once known.
	ExportWorkspace string
	// BrokerAddress is where the edge connects to.
	BrokerAddress string
}

// Status returns the state for the PublishedResource name.
func (s *Store) Status(name string) Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Status{
		Result:          s.results[name],
		Connected:       s.connected,
		ExportName:      s.export.GetExport().GetName(),
		Export:          s.export,
		ExportWorkspace: s.export.GetExport().GetWorkspacePath(),
		BrokerAddress:   s.brokerAddress,
	}
}

// Start hands the controller's queue to the store (a source.Func), so that
// broker answers and connection changes requeue PublishedResources.
func (s *Store) Start(queue workqueue.TypedRateLimitingInterface[reconcile.Request]) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.queue = queue
}

// requeue asks the controller to look at names again. Called with s.mu held.
func (s *Store) requeue(names ...string) {
	if s.queue == nil {
		return
	}
	for _, n := range names {
		s.queue.Add(reconcile.Request{NamespacedName: types.NamespacedName{Name: n}})
	}
}

// Attach is called by the stream after each accepted handshake: every
// desired Publish is sent again (the broker keeps no per-edge state across
// streams) and every PublishedResource is reconciled.
func (s *Store) Attach(hello *ferryv1.BrokerHello) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.connected = true
	s.export = hello.GetExport()
	for name := range s.desired {
		s.dirty[name] = struct{}{}
	}
	for name := range s.releasing {
		s.dirty[name] = struct{}{}
	}
	s.wake()
	// The export name may be new to the controller (projection needs it).
	s.requeue(s.namesLocked()...)
}

// Detach is called by the stream when it ends.
func (s *Store) Detach() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.connected = false
	s.requeue(s.namesLocked()...)
}

func (s *Store) namesLocked() []string {
	names := make([]string, 0, len(s.desired)+len(s.releasing))
	for n := range s.desired {
		names = append(names, n)
	}
	for n := range s.releasing {
		names = append(names, n)
	}
	return names
}

// Outgoing returns the messages to send now, in name order, and considers
// them sent: if the stream fails, Attach re-sends everything.
func (s *Store) Outgoing() []*ferryv1.ConnectRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.connected {
		return nil
	}
	names := make([]string, 0, len(s.dirty))
	for n := range s.dirty {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]*ferryv1.ConnectRequest, 0, len(names))
	for _, n := range names {
		if msg, ok := s.desired[n]; ok {
			out = append(out, &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_Publish{Publish: msg}})
		} else if u, ok := s.releasing[n]; ok {
			if _, done := s.released[n]; !done {
				out = append(out, &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_Unpublish{Unpublish: u}})
			}
		} else {
			out = append(out, &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_Unpublish{
				Unpublish: &ferryv1.Unpublish{PublishedResource: n},
			}})
		}
	}
	clear(s.dirty)
	return out
}

// TooLarge records a Publish that exceeds the broker's message limit as a
// failed result, so the PublishedResource's status says so.
func (s *Store) TooLarge(msg *ferryv1.ConnectRequest, size, limit int) {
	p := msg.GetPublish()
	if p == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.desired[p.GetPublishedResource()]; !ok || cur.GetRevision() != p.GetRevision() {
		return
	}
	s.results[p.GetPublishedResource()] = &ferryv1.PublishResult{
		PublishedResource: p.GetPublishedResource(), Generation: p.GetGeneration(), Revision: p.GetRevision(),
		State:   ferryv1.PublishState_PUBLISH_STATE_FAILED,
		Reason:  ferryv1alpha1.ReasonTooLarge,
		Message: fmt.Sprintf("the CRD's published versions need %d bytes, more than the broker accepts (%d); publish fewer versions or raise --max-message-bytes at the broker", size, limit),
	}
	s.requeue(p.GetPublishedResource())
}

// Handle takes the broker messages that concern publishing.
func (s *Store) Handle(msg *ferryv1.ConnectResponse) error {
	switch m := msg.GetMessage().(type) {
	case *ferryv1.ConnectResponse_PublishResult:
		r := m.PublishResult
		s.mu.Lock()
		defer s.mu.Unlock()
		if _, ok := s.releasing[r.GetPublishedResource()]; ok {
			if st := r.GetState(); st == ferryv1.PublishState_PUBLISH_STATE_WITHDRAWN || st == ferryv1.PublishState_PUBLISH_STATE_FAILED {
				s.released[r.GetPublishedResource()] = r
				s.requeue(r.GetPublishedResource())
			}
			return nil
		}
		if _, ok := s.desired[r.GetPublishedResource()]; !ok {
			return nil // withdrawn meanwhile
		}
		s.results[r.GetPublishedResource()] = r
		s.requeue(r.GetPublishedResource())
		return nil
	case *ferryv1.ConnectResponse_ExportStatus:
		s.mu.Lock()
		defer s.mu.Unlock()
		changed := !proto.Equal(s.export, m.ExportStatus)
		s.export = m.ExportStatus
		if changed {
			// Every PublishedResource's VirtualWorkspaceReady condition
			// follows the export's state.
			s.requeue(s.namesLocked()...)
		}
		return nil
	default:
		return fmt.Errorf("protocol error: the publish store does not handle %T", m)
	}
}

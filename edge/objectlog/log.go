// Package objectlog keeps the edge admin API's record of what the sync
// engine did with each object, and builds its object views
// (EdgeAdminService.GetObjectState). The engine keeps no admin bookkeeping:
// Log learns the intents it handled as its Observer
// (edge/replication.Observer) and ObjectState reads the engine's copies
// through Source.
package objectlog

import (
	"sync"
	"sync/atomic"
	"time"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// Log records, per kcp object, the last intent the engine handled and its
// answer, and counts the answers. It implements the engine's Observer. Safe
// for concurrent use.
type Log struct {
	// now is the clock of the records' times.
	now             func() time.Time
	applied, failed atomic.Uint64

	mu sync.Mutex
	// handled holds, per kcp object (without UID: the latest object of the
	// name wins), the last intent handled and its answer. An entry goes when
	// a delete succeeded, so the records are bounded by the objects synced.
	handled map[objectID]handledIntent
}

// New returns an empty log timed by now (nil: time.Now).
func New(now func() time.Time) *Log {
	if now == nil {
		now = time.Now
	}
	return &Log{now: now, handled: map[objectID]handledIntent{}}
}

// handledIntent is what the log keeps of an intent the engine answered:
// its key, version, content hash and answer — not the object's content,
// which the view never shows.
type handledIntent struct {
	key           *ferryv1.ObjectKey
	version       *ferryv1.ObjectVersion
	hash          string
	workspacePath string
	upsert        bool
	err           *ferryv1.ApplyError
	at            time.Time
}

// objectID identifies a kcp object without its UID (the admin view shows
// the latest object of a name).
type objectID struct {
	cluster, group, resource, namespace, name string
}

func keyID(k *ferryv1.ObjectKey) objectID {
	return objectID{k.GetCluster(), k.GetResource().GetGroup(), k.GetResource().GetResource(), k.GetNamespace(), k.GetName()}
}

// IntentDone records the answer res to the intent in: every answer is
// counted, a primary object's is kept until a delete of it succeeds.
func (l *Log) IntentDone(in *ferryv1.SyncIntent, res *ferryv1.IntentResult) {
	if res.GetError() != nil {
		l.failed.Add(1)
	} else {
		l.applied.Add(1)
	}
	if in.GetRelatedTo() != nil {
		return
	}
	id := keyID(in.GetKey())
	l.mu.Lock()
	defer l.mu.Unlock()
	if in.GetDelete() != nil && res.GetError() == nil {
		delete(l.handled, id)
		return
	}
	l.handled[id] = handledIntent{key: in.GetKey(), version: in.GetVersion(), hash: in.GetUpsert().GetContentHash(),
		workspacePath: in.GetUpsert().GetWorkspacePath(), upsert: in.GetUpsert() != nil, err: res.GetError(), at: l.now()}
}

// IntentReceived is not recorded: IntentDone records the outcome.
func (*Log) IntentReceived(*ferryv1.SyncIntent) {}

// ReportQueued is not recorded (the engine counts its pending reports).
func (*Log) ReportQueued(*ferryv1.ConnectRequest) {}

// ReportAnswered is not recorded.
func (*Log) ReportAnswered(*ferryv1.ReportResult, time.Time) {}

// Counts returns how many intents were answered without and with an error.
func (l *Log) Counts() (applied, failed uint64) {
	return l.applied.Load(), l.failed.Load()
}

// last returns the last intent handled for id.
func (l *Log) last(id objectID) (handledIntent, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.handled[id]
	return h, ok
}

// lastByPath returns the last intent handled for the object namespace/name
// of group/resource whose intent carried workspace path.
func (l *Log) lastByPath(path, group, resource, namespace, name string) (handledIntent, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, h := range l.handled {
		k := h.key
		if h.workspacePath == path && k.GetResource().GetGroup() == group &&
			k.GetResource().GetResource() == resource && k.GetNamespace() == namespace && k.GetName() == name {
			return h, true
		}
	}
	return handledIntent{}, false
}

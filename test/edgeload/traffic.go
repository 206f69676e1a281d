package edgeload

import (
	"cmp"
	"crypto/rand"
	"encoding/binary"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/protobuf/proto"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/edge/stream"
)

// traffic is the part of a simulated edge that publishes its widget CRD
// and answers the broker's intents as ferry-edge does after applying them:
// an IntentResult on the control lane, then (a new state applied) a status
// report or (deleted) a deletion confirmation through a report outbox the
// broker answers by epoch and id. It holds no objects: per object only its
// key and the content hash applied, which its inventory tells the broker
// after every handshake so that a reconnect re-sends nothing.
type traffic struct {
	publish *ferryv1.Publish
	wake    func()
	// epoch is the report outbox's, chosen once (edge/replication's
	// meaning): an answer of another epoch is not for these reports.
	epoch uint64
	// published is closed at the first PUBLISHED result for publish.
	published chan struct{}

	mu   sync.Mutex
	sink stream.Sink // nil between streams
	// result is the latest PublishResult for publish.
	result *ferryv1.PublishResult
	// inventorySent tells whether this stream had the inventory.
	inventorySent bool
	// pre are the messages to send first on this stream: the Publish,
	// then the inventory.
	pre []*ferryv1.ConnectRequest
	// applied is, per object (cluster, namespace, name), what was applied.
	applied map[string]appliedCopy
	// reports are the unanswered reports, the latest per key; order the
	// keys to send (again) on this stream, oldest first; sent the ids
	// sent on this stream.
	reports map[reportKey]*pendingReport
	order   []reportKey
	sent    map[uint64]reportKey
	lastID  uint64
	// roundTrips are the intent round trips since the last take.
	roundTrips []time.Duration

	counts trafficCounters
}

type appliedCopy struct {
	key  *ferryv1.ObjectKey
	hash string
}

// reportKey is a report's key: deletion or status, and the object.
type reportKey struct {
	deletion bool
	object   string
}

type pendingReport struct {
	msg *ferryv1.ConnectRequest // without id and epoch
	id  uint64                  // 0: not sent on this stream
}

type trafficCounters struct {
	intents, nacks, intentResults, reports, reportResults, reportErrors atomic.Int64
}

func newTraffic(publish *ferryv1.Publish, wake func()) *traffic {
	var b [8]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
	return &traffic{
		publish: publish, wake: wake, epoch: binary.BigEndian.Uint64(b[:]) | 1, published: make(chan struct{}),
		applied: map[string]appliedCopy{}, reports: map[reportKey]*pendingReport{}, sent: map[uint64]reportKey{},
	}
}

// attach starts a stream: the Publish goes first (the broker keeps no
// publish across streams), the inventory with it once the resource was
// published (ferry-edge's local watch of the copies exists from then on),
// and every unanswered report again, with a new id.
func (t *traffic) attach(sink stream.Sink) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sink = sink
	t.pre = []*ferryv1.ConnectRequest{{Message: &ferryv1.ConnectRequest_Publish{Publish: t.publish}}}
	t.inventorySent = false
	if t.isPublishedLocked() {
		t.queueInventoryLocked()
	}
	clear(t.sent)
	t.order = t.order[:0]
	for k, r := range t.reports {
		r.id = 0
		t.order = append(t.order, k)
	}
	slices.SortFunc(t.order, func(a, b reportKey) int { return cmp.Compare(a.object, b.object) })
	t.wake()
}

func (t *traffic) detach() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.sink, t.pre = nil, nil
}

func (t *traffic) isPublishedLocked() bool {
	return t.result.GetState() == ferryv1.PublishState_PUBLISH_STATE_PUBLISHED
}

// queueInventoryLocked queues the complete inventory of the widgets: one
// message, the objects are few.
func (t *traffic) queueInventoryLocked() {
	inv := &ferryv1.Inventory{PublishedResource: t.publish.GetPublishedResource(), Complete: true}
	ids := make([]string, 0, len(t.applied))
	for id := range t.applied {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		c := t.applied[id]
		inv.Entries = append(inv.Entries, &ferryv1.InventoryEntry{
			Key: c.key, AppliedHash: c.hash, PublishedResource: t.publish.GetPublishedResource(),
			LocalNamespace: c.key.GetNamespace(), LocalName: c.key.GetName(),
		})
	}
	t.pre = append(t.pre, &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_Inventory{Inventory: inv}})
	t.inventorySent = true
}

// next is the next bulk message: the stream's first messages, then the
// reports not sent on this stream.
func (t *traffic) next() (*ferryv1.ConnectRequest, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.pre) > 0 {
		m := t.pre[0]
		t.pre = t.pre[1:]
		return m, true
	}
	for len(t.order) > 0 {
		k := t.order[0]
		t.order = t.order[1:]
		r, ok := t.reports[k]
		if !ok || r.id != 0 {
			continue // answered, or queued twice
		}
		t.lastID++
		r.id = t.lastID
		t.sent[r.id] = k
		t.counts.reports.Add(1)
		return withReportID(r.msg, t.epoch, r.id), true
	}
	return nil, false
}

// withReportID is a copy of report m carrying epoch and id.
func withReportID(m *ferryv1.ConnectRequest, epoch, id uint64) *ferryv1.ConnectRequest {
	c := proto.CloneOf(m)
	switch r := c.GetMessage().(type) {
	case *ferryv1.ConnectRequest_StatusReport:
		r.StatusReport.ReportId, r.StatusReport.ReportEpoch = id, epoch
	case *ferryv1.ConnectRequest_DeletionConfirmation:
		r.DeletionConfirmation.ReportId, r.DeletionConfirmation.ReportEpoch = id, epoch
	}
	return c
}

// report queues m as the latest report for k.
func (t *traffic) reportLocked(k reportKey, m *ferryv1.ConnectRequest) {
	t.reports[k] = &pendingReport{msg: m}
	t.order = append(t.order, k)
}

func (t *traffic) publishResult(r *ferryv1.PublishResult) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if r.GetPublishedResource() != t.publish.GetPublishedResource() || r.GetRevision() != t.publish.GetRevision() {
		return
	}
	t.result = r
	if !t.isPublishedLocked() {
		return
	}
	select {
	case <-t.published:
	default:
		close(t.published)
	}
	if t.sink != nil && !t.inventorySent {
		t.queueInventoryLocked()
		t.wake()
	}
}

// latestResult is the broker's latest answer to the Publish (nil before
// the first).
func (t *traffic) latestResult() *ferryv1.PublishResult {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.result
}

// inventoryRequest sends the inventory again (an operator's resync).
func (t *traffic) inventoryRequest(r *ferryv1.InventoryRequest) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sink == nil || !t.isPublishedLocked() {
		return
	}
	if prs := r.GetPublishedResources(); len(prs) > 0 && !slices.Contains(prs, t.publish.GetPublishedResource()) {
		return
	}
	t.queueInventoryLocked()
	t.wake()
}

// intent "applies" in as ferry-edge would and answers it: an ack with the
// local copy's name (the same as in kcp), and for a new state a status
// report, for a deletion a deletion confirmation. An intent for another
// PublishedResource, or for a related object, is refused as not
// published.
func (t *traffic) intent(in *ferryv1.SyncIntent) {
	now := time.Now()
	t.counts.intents.Add(1)
	key := in.GetKey()
	res := &ferryv1.IntentResult{Key: key, Version: in.GetVersion(), RelatedTo: in.GetRelatedTo()}
	id := key.GetCluster() + "/" + key.GetNamespace() + "/" + key.GetName()

	t.mu.Lock()
	switch {
	case in.GetRelatedTo() != nil || in.GetPublishedResource() != t.publish.GetPublishedResource():
		res.Error = &ferryv1.ApplyError{Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_PUBLISHED,
			Message: "the simulated edge publishes only " + t.publish.GetPublishedResource()}
	case in.GetDelete() != nil:
		delete(t.applied, id)
		delete(t.reports, reportKey{object: id})
		t.reportLocked(reportKey{deletion: true, object: id}, &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_DeletionConfirmation{
			DeletionConfirmation: &ferryv1.DeletionConfirmation{Key: key, Version: in.GetVersion()},
		}})
	case in.GetUpsert() != nil:
		hash := in.GetUpsert().GetContentHash()
		res.LocalNamespace, res.LocalName = key.GetNamespace(), key.GetName()
		if c, ok := t.applied[id]; ok && c.hash == hash && c.key.GetUid() == key.GetUid() {
			break // applied before: nothing changes, no new status
		}
		t.applied[id] = appliedCopy{key: key, hash: hash}
		revision, at, ok := widgetWritten(in.GetUpsert().GetObject())
		if ok {
			t.roundTrips = append(t.roundTrips, max(now.Sub(at), 0))
		}
		t.reportLocked(reportKey{object: id}, &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_StatusReport{
			StatusReport: &ferryv1.StatusReport{Key: key, Status: widgetStatus(revision)},
		}})
	default:
		res.Error = &ferryv1.ApplyError{Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_INVALID, Message: "the intent has no operation"}
	}
	sink := t.sink
	t.mu.Unlock()

	t.wake()
	if res.Error != nil {
		t.counts.nacks.Add(1)
	}
	if sink == nil {
		return // the broker sends the intent again on the next stream
	}
	if err := sink.Control(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_IntentResult{IntentResult: res}}); err == nil {
		t.counts.intentResults.Add(1)
	}
}

// reportResult takes the broker's answer to a report of this outbox; a
// report replaced meanwhile by a newer one stays queued.
func (t *traffic) reportResult(r *ferryv1.ReportResult) {
	t.counts.reportResults.Add(1)
	if r.GetError() != nil {
		t.counts.reportErrors.Add(1)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if epoch := r.GetReportEpoch(); epoch != 0 && epoch != t.epoch {
		return
	}
	k, ok := t.sent[r.GetReportId()]
	if !ok {
		return
	}
	delete(t.sent, r.GetReportId())
	if p, ok := t.reports[k]; ok && p.id == r.GetReportId() {
		delete(t.reports, k)
	}
}

// takeRoundTrips returns the round trips measured since the last take.
func (t *traffic) takeRoundTrips() []time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := t.roundTrips
	t.roundTrips = nil
	return out
}

// pendingReports counts the reports not answered yet.
func (t *traffic) pendingReports() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.reports)
}

// TrafficCounts are a traffic edge's intent and report counts so far.
type TrafficCounts struct {
	// Intents received; Nacks of them refused; IntentResults sent.
	Intents       int64 `json:"intents"`
	Nacks         int64 `json:"nacks"`
	IntentResults int64 `json:"intentResults"`
	// Reports sent (status reports, deletion confirmations; again after a
	// reconnect); ReportResults received, ReportErrors of them final
	// failures.
	Reports       int64 `json:"reports"`
	ReportResults int64 `json:"reportResults"`
	ReportErrors  int64 `json:"reportErrors"`
}

func (c TrafficCounts) add(o TrafficCounts) TrafficCounts {
	return TrafficCounts{
		Intents: c.Intents + o.Intents, Nacks: c.Nacks + o.Nacks, IntentResults: c.IntentResults + o.IntentResults,
		Reports: c.Reports + o.Reports, ReportResults: c.ReportResults + o.ReportResults, ReportErrors: c.ReportErrors + o.ReportErrors,
	}
}

func (c TrafficCounts) sub(o TrafficCounts) TrafficCounts {
	return TrafficCounts{
		Intents: c.Intents - o.Intents, Nacks: c.Nacks - o.Nacks, IntentResults: c.IntentResults - o.IntentResults,
		Reports: c.Reports - o.Reports, ReportResults: c.ReportResults - o.ReportResults, ReportErrors: c.ReportErrors - o.ReportErrors,
	}
}

func (t *traffic) countsNow() TrafficCounts {
	return TrafficCounts{
		Intents: t.counts.intents.Load(), Nacks: t.counts.nacks.Load(), IntentResults: t.counts.intentResults.Load(),
		Reports: t.counts.reports.Load(), ReportResults: t.counts.reportResults.Load(), ReportErrors: t.counts.reportErrors.Load(),
	}
}

package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/replication"
	"github.com/ferry-dev/ferry/pkg/protocol"
)

// The engine's part of the admin API: per-object history the edge reported
// (answers, inventories, refused reports), object views and resyncs.

// Error sources of ObjectError.source.
const (
	errorSourceIntent   = "intent"
	errorSourceTooLarge = "too_large"
	errorSourceReport   = "report"
)

// Applied state sources of AppliedState.source.
const (
	appliedFromAck       = "ack"
	appliedFromInventory = "inventory"
)

// adminState is the engine's bookkeeping for the admin API.
type adminState struct {
	records *objectRecords

	mu sync.Mutex
	// resyncSession is the session the last resync was asked on.
	resyncSession string
}

// objectRecords keeps, per primary object (keyed with its UID), what the
// edge last reported about it. An entry goes when the edge confirms the
// copy's deletion. Safe for concurrent use; the zero value is ready.
type objectRecords struct {
	mu  sync.Mutex
	now func() time.Time // time.Now when nil
	// known tells whether the broker syncs key's object (nil: every key): a
	// refused report makes a record only for those, so keys an edge makes
	// up cannot grow the records. (Inventory entries make records: a copy
	// of an object the broker does not hold is shown, and its record goes
	// with the deletion the broker then asks for.)
	known func(key *ferryv1.ObjectKey) bool
	byID  map[string]*objectRecord
}

// newObjectRecords returns empty records of the objects known tells (see
// objectRecords.known).
func newObjectRecords(known func(key *ferryv1.ObjectKey) bool) *objectRecords {
	return &objectRecords{known: known, byID: map[string]*objectRecord{}}
}

func (r *objectRecords) isKnown(key *ferryv1.ObjectKey) bool {
	return r.known == nil || r.known(key)
}

// objectRecord is what the edge last reported about one object.
type objectRecord struct {
	// operation and contentHash describe the last answered intent (not the
	// intent itself: its object would be held for every synced object),
	// version is its version as sent, answeredAt the time of the answer.
	// operation is empty before the first answer.
	operation, contentHash string
	version                *ferryv1.ObjectVersion
	answeredAt             time.Time
	// lastErr is the error of the latest answer or report; nil after a
	// success.
	lastErr *ferryv1.ObjectError
	// applied is what the edge holds, from an ack or its inventory.
	applied *ferryv1.AppliedState
	// local is where the copy is; nil when the edge reported none.
	local *ferryv1.LocalCopy
}

func (r *objectRecords) clock() time.Time {
	if r.now != nil {
		return r.now()
	}
	return time.Now()
}

func (r *objectRecords) recordLocked(key *ferryv1.ObjectKey) *objectRecord {
	if r.byID == nil {
		r.byID = map[string]*objectRecord{}
	}
	id := protocol.ObjectKeyString(key)
	rec, ok := r.byID[id]
	if !ok {
		rec = &objectRecord{}
		r.byID[id] = rec
	}
	return rec
}

// answered records the edge's answer res to the primary intent in.
func (r *objectRecords) answered(in *ferryv1.SyncIntent, res *ferryv1.IntentResult) {
	if r == nil || in.GetRelatedTo() != nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.clock()
	rec := r.recordLocked(in.GetKey())
	rec.operation, rec.contentHash = operationName(in), in.GetUpsert().GetContentHash()
	rec.version, rec.answeredAt = res.GetVersion(), now
	if ae := res.GetError(); ae != nil {
		rec.lastErr = &ferryv1.ObjectError{Source: errorSourceIntent, Error: ae, At: timestamppb.New(now)}
		return
	}
	rec.lastErr = nil
	if in.GetDelete() != nil {
		rec.local, rec.applied = nil, nil
		return
	}
	rec.applied = &ferryv1.AppliedState{
		ContentHash: in.GetUpsert().GetContentHash(), ResourceVersion: res.GetVersion().GetResourceVersion(),
		Source: appliedFromAck, ReportedAt: timestamppb.New(now),
	}
	if res.GetLocalName() != "" {
		rec.local = &ferryv1.LocalCopy{Namespace: res.GetLocalNamespace(), Name: res.GetLocalName(), ReportedAt: timestamppb.New(now)}
	}
}

// failed records an error about key that is not an answer of the edge
// (source errorSourceTooLarge or errorSourceReport).
func (r *objectRecords) failed(key *ferryv1.ObjectKey, source string, ae *ferryv1.ApplyError) {
	if r == nil || key == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recordLocked(key).lastErr = &ferryv1.ObjectError{Source: source, Error: ae, At: timestamppb.New(r.clock())}
}

// reported records the broker's answer to a report of the edge about key:
// a refusal is the object's last error; a success clears a report error.
func (r *objectRecords) reported(key *ferryv1.ObjectKey, deletion bool, res *ferryv1.ReportResult) {
	if r == nil || key == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	id := protocol.ObjectKeyString(key)
	switch rec, ok := r.byID[id]; {
	case res.GetError() != nil && !ok && !r.isKnown(key):
		// Refused a report about an object it does not sync: no record.
	case res.GetError() != nil:
		r.recordLocked(key).lastErr = &ferryv1.ObjectError{Source: errorSourceReport, Error: res.GetError(), At: timestamppb.New(r.clock())}
	case deletion:
		delete(r.byID, id) // the copy is gone and the finalizer released
	case ok && rec.lastErr.GetSource() == errorSourceReport:
		rec.lastErr = nil
	}
}

// inventory records a chunk of the edge's inventory.
func (r *objectRecords) inventory(inv *ferryv1.Inventory) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	now := timestamppb.New(r.clock())
	for _, e := range inv.GetEntries() {
		if e.GetKey() == nil {
			continue
		}
		rec := r.recordLocked(e.GetKey())
		rec.applied = &ferryv1.AppliedState{
			ContentHash: e.GetAppliedHash(), ResourceVersion: e.GetAppliedResourceVersion(),
			Source: appliedFromInventory, ReportedAt: now,
		}
		if e.GetLocalName() != "" {
			rec.local = &ferryv1.LocalCopy{Namespace: e.GetLocalNamespace(), Name: e.GetLocalName(), ReportedAt: now}
		}
	}
}

// get returns a copy of key's record, false when there is none.
func (r *objectRecords) get(key *ferryv1.ObjectKey) (objectRecord, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.byID[protocol.ObjectKeyString(key)]
	if !ok {
		return objectRecord{}, false
	}
	return *rec, true
}

// MatchResources returns the engine's published resources served as
// resource (plural) in group (any group when empty).
func (e *Engine) MatchResources(group, resource string) []replication.ResourceRef {
	return e.mgr.MatchResources(group, resource)
}

// WorkspaceCluster returns the logical cluster of a workspace path the
// engine resolved before.
func (e *Engine) WorkspaceCluster(path string) (string, bool) { return e.mgr.WorkspaceCluster(path) }

// Attached tells whether an edge stream is attached.
func (e *Engine) Attached() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sink != nil
}

// ObjectState explains pr's object cluster/namespace/name; false when the
// engine knows nothing of it.
func (e *Engine) ObjectState(pr, cluster, namespace, name string) (*ferryv1.GetObjectStateResponse, bool) {
	v, ok := e.mgr.Lookup(pr, cluster, namespace, name)
	if !ok {
		return nil, false
	}
	out := &ferryv1.GetObjectStateResponse{
		Export:            exportRef(e.opts.Export.Workspace, e.opts.Export.Name),
		PublishedResource: pr,
		Key:               v.Key,
		EdgeConnected:     e.Attached(),
	}
	if v.Cached {
		out.Kcp = &ferryv1.KCPObjectState{
			Uid: v.Key.GetUid(), ResourceVersion: v.ResourceVersion, Generation: v.Generation,
			ContentHash: v.DesiredHash, Finalizer: v.Finalizer, InScope: v.InScope,
		}
		if v.DeletionTimestamp != nil {
			out.Kcp.DeletionTimestamp = timestamppb.New(v.DeletionTimestamp.Time)
		}
	}
	rec, _ := e.admin.records.get(v.Key)
	out.Intent = e.intentState(v, rec)
	out.LastError = rec.lastErr
	out.LocalCopy = rec.local
	switch {
	case rec.applied != nil:
		out.Applied = rec.applied
	case v.AppliedHash != "":
		out.Applied = &ferryv1.AppliedState{ContentHash: v.AppliedHash}
	}
	if out.Applied != nil {
		out.Applied.Current = v.DesiredHash != "" && out.Applied.GetContentHash() == v.DesiredHash
	}
	out.Summary = summarize(v, out)
	return out, true
}

// intentState finds the latest intent for v: in flight or pending in the
// outbox, else the last answered one.
func (e *Engine) intentState(v replication.ObjectView, rec objectRecord) *ferryv1.IntentState {
	st := &ferryv1.IntentState{Held: v.Held, AwaitingInventory: v.AwaitingInventory}
	pending, inFlight := e.intents.Lookup(v.Key)
	var entry *replication.IntentEntry
	switch {
	case pending != nil:
		st.Phase, entry = ferryv1.IntentPhase_INTENT_PHASE_PENDING, pending
	case inFlight != nil:
		st.Phase, entry = ferryv1.IntentPhase_INTENT_PHASE_IN_FLIGHT, inFlight
	}
	if entry != nil {
		st.Operation, st.ContentHash = operationName(entry.Intent), entry.Intent.GetUpsert().GetContentHash()
		st.Version = &ferryv1.ObjectVersion{
			BrokerEpoch: e.intents.Epoch(), Sequence: entry.Seq,
			ResourceVersion: entry.Intent.GetVersion().GetResourceVersion(), Generation: entry.Intent.GetVersion().GetGeneration(),
		}
		st.QueuedAt = timestamppb.New(entry.Queued)
		return st
	}
	if rec.operation == "" {
		st.Phase = ferryv1.IntentPhase_INTENT_PHASE_NONE
		return st
	}
	st.Phase = ferryv1.IntentPhase_INTENT_PHASE_ACKED
	if rec.lastErr.GetSource() == errorSourceIntent {
		st.Phase = ferryv1.IntentPhase_INTENT_PHASE_NACKED
	}
	st.Operation, st.ContentHash = rec.operation, rec.contentHash
	st.Version = rec.version
	st.AnsweredAt = timestamppb.New(rec.answeredAt)
	return st
}

// summarize says in one sentence where the object stands.
func summarize(v replication.ObjectView, s *ferryv1.GetObjectStateResponse) string {
	var parts []string
	if !s.GetEdgeConnected() {
		parts = append(parts, "the edge is not connected")
	}
	in := s.GetIntent()
	switch {
	case !v.Cached:
		parts = append(parts, "the object is gone from kcp; the edge may still hold a copy, which it is asked to delete")
	case !v.InScope:
		parts = append(parts, "the object is outside the PublishedResource's filters: not synced (the edge deletes its copy)")
	case v.DeletionTimestamp != nil:
		parts = append(parts, "the object is being deleted in kcp; its finalizer is released once the edge confirms the copy is gone")
	case !v.Finalizer:
		parts = append(parts, "waiting for the broker to add its finalizer in kcp; nothing is synced before")
	}
	if e := s.GetLastError(); e != nil {
		msg := fmt.Sprintf("last %s error: %s: %s", strings.ReplaceAll(e.GetSource(), "_", " "),
			protocol.ReasonName(e.GetError().GetReason()), e.GetError().GetMessage())
		switch {
		case in.GetHeld():
			msg += " (final: not sent again until the object or its PublishedResource changes)"
		case e.GetError().GetRetryable() || e.GetError().GetReason() == ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_READY:
			msg += " (retried with backoff)"
		}
		parts = append(parts, msg)
	}
	switch in.GetPhase() {
	case ferryv1.IntentPhase_INTENT_PHASE_PENDING:
		parts = append(parts, fmt.Sprintf("%s intent %d queued", in.GetOperation(), in.GetVersion().GetSequence()))
	case ferryv1.IntentPhase_INTENT_PHASE_IN_FLIGHT:
		parts = append(parts, fmt.Sprintf("%s intent %d sent, awaiting the edge's answer", in.GetOperation(), in.GetVersion().GetSequence()))
	}
	if in.GetAwaitingInventory() {
		parts = append(parts, "waiting for the edge's inventory")
	}
	if a := s.GetApplied(); a.GetCurrent() {
		where := ""
		if lc := s.GetLocalCopy(); lc != nil {
			where = " as " + nsName(lc.GetNamespace(), lc.GetName())
		}
		parts = append(parts, "synced: the edge applied the current state"+where)
	} else if a != nil && v.DesiredHash != "" && len(parts) == 0 {
		parts = append(parts, "the edge holds an older state")
	}
	if len(parts) == 0 {
		return "nothing to do"
	}
	return strings.Join(parts, "; ")
}

func nsName(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

func exportRef(workspace, name string) *ferryv1.APIExportReference {
	return &ferryv1.APIExportReference{WorkspacePath: workspace, Name: name}
}

// Resync asks the attached edge for a fresh inventory of prs (all when
// empty) and waits up to wait for the comparison to complete; a resync
// already running is joined. The caller checked that the edge supports
// InventoryRequest.
func (e *Engine) Resync(ctx context.Context, session string, prs []string, wait time.Duration) (*ferryv1.ResyncStatus, error) {
	e.mu.Lock()
	sink := e.sink
	e.mu.Unlock()
	if sink == nil {
		return nil, ErrNotAttached
	}
	r, started, err := e.mgr.StartResync(prs, func(st replication.ResyncStatus) {
		if st.Err != nil {
			return
		}
		e.control(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_ResyncComplete{ResyncComplete: &ferryv1.ResyncComplete{
			QueuedIntents: uint32(st.QueuedIntents),
		}}})
	})
	if err != nil {
		return nil, err
	}
	if started {
		e.admin.mu.Lock()
		e.admin.resyncSession = session
		e.admin.mu.Unlock()
		st := e.mgr.ResyncStatus(r)
		e.opts.Log.Info("asking the edge for its inventory (admin resync)", "publishedResources", st.PublishedResources)
		if err := sink.Control(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_InventoryRequest{InventoryRequest: &ferryv1.InventoryRequest{
			PublishedResources: prs,
		}}}); err != nil {
			return nil, fmt.Errorf("cannot queue the inventory request: %w", err)
		}
	}
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-r.Done:
		case <-t.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return e.resyncStatus(e.mgr.ResyncStatus(r)), nil
}

// ErrNotAttached is returned by Resync without an edge stream.
var ErrNotAttached = errors.New("the edge is not connected")

func (e *Engine) resyncStatus(st replication.ResyncStatus) *ferryv1.ResyncStatus {
	e.admin.mu.Lock()
	session := e.admin.resyncSession
	e.admin.mu.Unlock()
	out := &ferryv1.ResyncStatus{
		SessionId:          session,
		PublishedResources: st.PublishedResources,
		RequestedAt:        timestamppb.New(st.Requested),
		InventoryEntries:   uint32(st.InventoryEntries),
		QueuedIntents:      uint32(st.QueuedIntents),
	}
	if !st.Completed.IsZero() {
		out.CompletedAt = timestamppb.New(st.Completed)
	}
	if st.Err != nil {
		out.Error = st.Err.Error()
	}
	return out
}

// adminStatus adds the admin API's figures to s.
func (e *Engine) adminStatus(s *ferryv1.EngineStatus) {
	if oldest := e.intents.Stats().OldestInFlight; !oldest.IsZero() {
		s.OldestUnacknowledgedAge = durationpb.New(time.Since(oldest))
	}
	for _, r := range e.mgr.ResourceStats() {
		s.Resources = append(s.Resources, &ferryv1.ResourceObjects{
			PublishedResource: r.PublishedResource,
			Resource:          &ferryv1.GroupVersionResource{Group: r.GVR.Group, Version: r.GVR.Version, Resource: r.GVR.Resource},
			Objects:           uint32(r.Objects),
			Applied:           uint32(r.Applied),
			Listed:            r.Listed,
			AwaitingInventory: r.AwaitingInventory,
		})
	}
	if st, ok := e.mgr.LastResync(); ok {
		s.LastResync = e.resyncStatus(st)
	}
}

// recordTooLarge records that a primary intent was not sent for its size.
func (e *Engine) recordTooLarge(in *ferryv1.SyncIntent, size, limit int) {
	if in.GetRelatedTo() != nil {
		return
	}
	e.admin.records.failed(in.GetKey(), errorSourceTooLarge, &ferryv1.ApplyError{
		Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_TOO_LARGE, Message: tooLargeMessage(size, limit),
	})
}

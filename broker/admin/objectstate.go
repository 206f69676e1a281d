package admin

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/types/known/timestamppb"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/replication"
	"github.com/ferry-dev/ferry/pkg/protocol"
)

// Source is the sync engine's state an object view reads. Implemented by
// *broker/engine.Engine.
type Source interface {
	// Export is the APIExport the engine serves.
	Export() config.APIExportRef
	// Attached tells whether an edge stream is attached.
	Attached() bool
	// Object is what the engine knows of pr's object
	// cluster/namespace/name; false when it knows nothing of it.
	Object(pr, cluster, namespace, name string) (replication.ObjectView, bool)
	// Intent returns the pending and the in-flight intent of a primary
	// object (either may be nil).
	Intent(key *ferryv1.ObjectKey) (pending, inFlight *replication.IntentEntry)
	// Epoch is the broker epoch stamped on intent versions.
	Epoch() uint64
}

// ObjectState explains pr's object cluster/namespace/name from the engine's
// state and the records; false when the engine knows nothing of it.
func (o *Objects) ObjectState(src Source, pr, cluster, namespace, name string) (*ferryv1.GetObjectStateResponse, bool) {
	v, ok := src.Object(pr, cluster, namespace, name)
	if !ok {
		return nil, false
	}
	export := src.Export()
	out := &ferryv1.GetObjectStateResponse{
		Export:            &ferryv1.APIExportReference{WorkspacePath: export.Workspace, Name: export.Name},
		PublishedResource: pr,
		Key:               v.Key,
		EdgeConnected:     src.Attached(),
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
	rec, _ := o.get(v.Key)
	out.Intent = intentState(src, v, rec)
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
func intentState(src Source, v replication.ObjectView, rec objectRecord) *ferryv1.IntentState {
	st := &ferryv1.IntentState{Held: v.Held, AwaitingInventory: v.AwaitingInventory}
	pending, inFlight := src.Intent(v.Key)
	var entry *replication.IntentEntry
	switch {
	case pending != nil:
		st.Phase, entry = ferryv1.IntentPhase_INTENT_PHASE_PENDING, pending
	case inFlight != nil:
		st.Phase, entry = ferryv1.IntentPhase_INTENT_PHASE_IN_FLIGHT, inFlight
	}
	if entry != nil {
		st.Operation, st.ContentHash = protocol.OperationName(entry.Intent), entry.Intent.GetUpsert().GetContentHash()
		st.Version = &ferryv1.ObjectVersion{
			BrokerEpoch: src.Epoch(), Sequence: entry.Seq,
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

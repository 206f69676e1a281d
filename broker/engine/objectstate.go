package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/replication"
)

// The engine's read side for the admin API (broker/admin): its state,
// read under its locks, and resyncs. The admin API's per-object records are
// not here: broker/admin.Objects learns them as the engine's Observer.

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

// Export is the APIExport the engine serves.
func (e *Engine) Export() config.APIExportRef { return e.opts.Export }

// Object is what the engine knows of pr's object cluster/namespace/name;
// false when it knows nothing of it.
func (e *Engine) Object(pr, cluster, namespace, name string) (replication.ObjectView, bool) {
	return e.mgr.Lookup(pr, cluster, namespace, name)
}

// Intent returns the pending and the in-flight intent of a primary object
// (either may be nil).
func (e *Engine) Intent(key *ferryv1.ObjectKey) (pending, inFlight *replication.IntentEntry) {
	return e.intents.Lookup(key)
}

// Epoch is the broker epoch the engine stamps on intent versions.
func (e *Engine) Epoch() uint64 { return e.intents.Epoch() }

// Syncs tells whether key is an object the engine syncs (its resource is
// published and its cache holds the object with key's UID).
func (e *Engine) Syncs(key *ferryv1.ObjectKey) bool { return e.mgr.Syncs(key) }

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
		e.mu.Lock()
		e.resyncSession = session
		e.mu.Unlock()
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
	e.mu.Lock()
	session := e.resyncSession
	e.mu.Unlock()
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

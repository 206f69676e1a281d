package replication

import (
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/protocol"
)

// MessageLimiter is implemented by a Sink that knows the largest message
// the broker accepts; inventories are cut to fit it. Without it, the
// protocol's default applies.
type MessageLimiter interface {
	MaxMessageBytes() int
}

// LimitedSink is a stream's control lane with the largest message the
// broker accepts (max_receive_message_bytes of its hello; 0: the default).
type LimitedSink struct {
	Sink
	Limit int
}

// MaxMessageBytes implements MessageLimiter.
func (s LimitedSink) MaxMessageBytes() int { return s.Limit }

// messageLimit is the largest message sink's broker accepts.
func messageLimit(sink Sink) int {
	if l, ok := sink.(MessageLimiter); ok && l.MaxMessageBytes() > 0 {
		return l.MaxMessageBytes()
	}
	return protocol.DefaultMaxMessageBytes
}

// sendInventoryLocked tells the broker which kcp states this agent's local
// copies of w's kcp resource were applied from, so it re-sends only what
// differs. Sent once the local watch is synced, on every stream.
func (e *Engine) sendInventoryLocked(w *localWatch) {
	if e.sink == nil || !w.synced {
		return
	}
	var entries []*ferryv1.InventoryEntry
	for _, o := range w.store.List() {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		remote, ok := naming.RemoteFrom(u.GetLabels(), u.GetAnnotations())
		if !ok || u.GetLabels()[naming.LabelRemoteResource] != w.pub.resourceLabel() {
			// Only copies of w's kcp resource (the watch selects them):
			// the broker deletes a listed copy whose object it lacks.
			continue
		}
		applied := u.GetAnnotations()[naming.AnnotationContentHash]
		if u.GetAnnotations()[naming.AnnotationShape] != w.pub.Shape || !labelledFor(u, w.pub) {
			// Applied under other settings of the PublishedResource, or
			// by another PublishedResource of the same kcp resource (one
			// deleted with Orphan): the broker re-sends it (through its
			// window), and it is applied again under the current ones,
			// and relabelled.
			applied = ""
		}
		entries = append(entries, &ferryv1.InventoryEntry{
			Key:                    remoteKey(w.pub, remote),
			AppliedResourceVersion: u.GetAnnotations()[naming.AnnotationResourceVersion],
			AppliedHash:            applied,
			PublishedResource:      w.pub.Name,
			LocalNamespace:         u.GetNamespace(),
			LocalName:              u.GetName(),
			AdoptedFrom:            adoptedFrom(u.GetAnnotations()),
		})
	}
	related, relatedComplete := e.relatedInventoryLocked(w)
	e.pre = append(e.pre, inventoryMessages(&ferryv1.Inventory{PublishedResource: w.pub.Name, Entries: entries,
		RelatedEntries: related, RelatedComplete: relatedComplete}, messageLimit(e.sink))...)
	e.opts.Wake()
}

// inventoryMessages cuts one PublishedResource's inventory (all its
// entries and related entries) into messages of at most limit bytes each
// (proto.Size of the ConnectRequest): the broker refuses larger ones. Each
// message holds at least one entry, so an entry too large on its own still
// goes out alone (the stream reports it as too large) instead of stalling
// the rest. The last message is complete (and carries related_complete); no
// entries make one empty, complete message.
func inventoryMessages(all *ferryv1.Inventory, limit int) []*ferryv1.ConnectRequest {
	message := func(inv *ferryv1.Inventory) *ferryv1.ConnectRequest {
		inv.PublishedResource = all.GetPublishedResource()
		return &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_Inventory{Inventory: inv}}
	}
	// An empty complete message, with room for the Inventory's length
	// prefix to grow to what a message of limit bytes needs.
	base := proto.Size(message(&ferryv1.Inventory{Complete: true, RelatedComplete: true})) + protowire.SizeVarint(uint64(max(limit, 0)))
	const entriesField, relatedField = 1, 4 // Inventory.entries, Inventory.related_entries
	var out []*ferryv1.ConnectRequest
	chunk := &ferryv1.Inventory{}
	size, n := base, 0
	add := func(field protowire.Number, entry proto.Message, put func()) {
		m := protowire.SizeTag(field) + protowire.SizeBytes(proto.Size(entry))
		if n > 0 && size+m > limit {
			out = append(out, message(chunk))
			chunk, size, n = &ferryv1.Inventory{}, base, 0
		}
		put()
		size += m
		n++
	}
	for _, entry := range all.GetEntries() {
		add(entriesField, entry, func() { chunk.Entries = append(chunk.Entries, entry) })
	}
	for _, entry := range all.GetRelatedEntries() {
		add(relatedField, entry, func() { chunk.RelatedEntries = append(chunk.RelatedEntries, entry) })
	}
	chunk.Complete, chunk.RelatedComplete = true, all.GetRelatedComplete()
	return append(out, message(chunk))
}

// relatedInventoryLocked lists the copies of kcp-origin related objects
// this agent holds for w's copies, with the hash of the content applied
// (none for a copy edited locally, or for a reference with more than one
// copy: the broker sends those again), and tells whether the list is
// complete (the caches of the related kinds have listed).
func (e *Engine) relatedInventoryLocked(w *localWatch) ([]*ferryv1.RelatedInventoryEntry, bool) {
	complete := true
	var out []*ferryv1.RelatedInventoryEntry
	for i := range w.pub.Related {
		ref := &w.pub.Related[i]
		if ref.Origin != ferryv1alpha1.OriginKCP {
			continue
		}
		rw := e.relWatches[ref.Local]
		if rw == nil || !rw.allSynced() {
			complete = false
		}
		if rw == nil {
			continue
		}
		for _, o := range w.store.List() {
			primary, ok := o.(*unstructured.Unstructured)
			if !ok || primary.GetLabels()[naming.LabelRemoteResource] != w.pub.resourceLabel() {
				continue
			}
			remote, ok := naming.RemoteFrom(primary.GetLabels(), primary.GetAnnotations())
			if !ok || remote.UID == "" {
				continue
			}
			copies := rw.owned(relatedOwnerKey(remote.UID, ref.Identifier))
			if len(copies) == 0 {
				continue
			}
			c := copies[0].(*unstructured.Unstructured)
			if c.GetLabels()[naming.LabelAgent] != e.opts.Agent {
				continue
			}
			ann := c.GetAnnotations()
			hash := ann[naming.AnnotationContentHash]
			if len(copies) > 1 || relatedDrifted(c) {
				hash = ""
			}
			// The kcp object is in the primary's workspace.
			out = append(out, &ferryv1.RelatedInventoryEntry{
				RelatedTo:   &ferryv1.RelatedTo{Primary: remoteKey(w.pub, remote), Identifier: ref.Identifier},
				Key:         &ferryv1.ObjectKey{Cluster: remote.ClusterName, Namespace: ann[naming.AnnotationNamespace], Name: ann[naming.AnnotationName], Uid: ann[naming.AnnotationUID]},
				AppliedHash: hash,
			})
		}
	}
	return out, complete
}

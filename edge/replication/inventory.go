package replication

import (
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
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
		})
	}
	e.pre = append(e.pre, inventoryMessages(w.pub.Name, entries, messageLimit(e.sink))...)
	e.opts.Wake()
}

// inventoryMessages cuts one PublishedResource's inventory into messages of
// at most limit bytes each (proto.Size of the ConnectRequest): the broker
// refuses larger ones. Each message holds at least one entry, so an entry
// too large on its own still goes out alone (the stream reports it as too
// large) instead of stalling the rest. The last message is complete; no
// entries make one empty, complete message.
func inventoryMessages(pub string, entries []*ferryv1.InventoryEntry, limit int) []*ferryv1.ConnectRequest {
	message := func(chunk []*ferryv1.InventoryEntry, complete bool) *ferryv1.ConnectRequest {
		return &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_Inventory{Inventory: &ferryv1.Inventory{
			PublishedResource: pub, Entries: chunk, Complete: complete,
		}}}
	}
	// An empty complete message, with room for the Inventory's length
	// prefix to grow to what a message of limit bytes needs.
	base := proto.Size(message(nil, true)) + protowire.SizeVarint(uint64(max(limit, 0)))
	const entriesField = 1 // Inventory.entries
	var out []*ferryv1.ConnectRequest
	var chunk []*ferryv1.InventoryEntry
	size := base
	for _, entry := range entries {
		n := protowire.SizeTag(entriesField) + protowire.SizeBytes(proto.Size(entry))
		if len(chunk) > 0 && size+n > limit {
			out = append(out, message(chunk, false))
			chunk, size = nil, base
		}
		chunk = append(chunk, entry)
		size += n
	}
	return append(out, message(chunk, true))
}

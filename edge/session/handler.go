// Package session composes what the edge does behind its broker stream:
// publishing (publish.Store) and object sync (replication.Engine). It implements
// stream.Handler by routing broker messages to the part they concern and
// merging what both parts have to send.
package session

import (
	"fmt"
	"sync"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/edge/publish"
	"github.com/ferry-dev/ferry/edge/replication"
	"github.com/ferry-dev/ferry/edge/stream"
)

// Handler routes between the stream and the edge's parts.
type Handler struct {
	Publish *publish.Store
	Replica *replication.Engine
	pending <-chan struct{}

	mu sync.Mutex
	// publishes holds the publish store's messages not sent yet.
	publishes []*ferryv1.ConnectRequest

	// link is the broker link's state for the admin view (status.go).
	link linkState
}

var _ stream.Handler = (*Handler)(nil)

// NewHandler joins the parts; pending must be the channel from link.NewWake
// whose wake function the parts were built with.
func NewHandler(p *publish.Store, r *replication.Engine, pending <-chan struct{}) *Handler {
	return &Handler{Publish: p, Replica: r, pending: pending}
}

// Attach implements stream.Handler.
func (h *Handler) Attach(hello *ferryv1.BrokerHello, control stream.Sink) {
	h.mu.Lock()
	h.publishes = nil
	h.mu.Unlock()
	h.Replica.Attach(replication.LimitedSink{Sink: control, Limit: int(hello.GetMaxReceiveMessageBytes())})
	h.Publish.Attach(hello)
	h.link.connected(hello)
}

// Detach implements stream.Handler.
func (h *Handler) Detach() {
	h.Publish.Detach()
	h.Replica.Detach()
	h.link.disconnected()
}

// Ready implements stream.Handler.
func (h *Handler) Ready() <-chan struct{} { return h.pending }

// Next implements stream.Handler: publishes first (the broker needs them
// before it can sync objects), then inventories and reports.
func (h *Handler) Next() (*ferryv1.ConnectRequest, bool) {
	h.mu.Lock()
	if len(h.publishes) == 0 {
		h.publishes = h.Publish.Outgoing()
	}
	if len(h.publishes) > 0 {
		m := h.publishes[0]
		h.publishes = h.publishes[1:]
		h.mu.Unlock()
		return m, true
	}
	h.mu.Unlock()
	return h.Replica.Next()
}

// Handle implements stream.Handler.
func (h *Handler) Handle(msg *ferryv1.ConnectResponse) error {
	switch m := msg.GetMessage().(type) {
	case *ferryv1.ConnectResponse_PublishResult:
		return h.Publish.Handle(msg)
	case *ferryv1.ConnectResponse_ExportStatus:
		h.link.exportChanged(m.ExportStatus)
		return h.Publish.Handle(msg)
	case *ferryv1.ConnectResponse_InventoryRequest:
		h.Replica.RequestInventory(m.InventoryRequest.GetPublishedResources())
		return nil
	case *ferryv1.ConnectResponse_Intent:
		h.Replica.Handle(m.Intent)
		return nil
	case *ferryv1.ConnectResponse_ReportResult:
		h.Replica.ReportResult(m.ReportResult)
		return nil
	case *ferryv1.ConnectResponse_ResyncComplete:
		return nil
	default:
		return fmt.Errorf("protocol error: this edge does not handle %T", m)
	}
}

// TooLarge implements stream.Handler.
func (h *Handler) TooLarge(msg *ferryv1.ConnectRequest, size, limit int) {
	if msg.GetPublish() != nil {
		h.Publish.TooLarge(msg, size, limit)
		return
	}
	h.Replica.TooLarge(msg, size, limit)
}

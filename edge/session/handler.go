// Package session composes what the edge does behind its broker stream:
// publishing (publish.Store) and object sync (replica.Engine). It implements
// stream.Handler by routing broker messages to the part they concern and
// merging what both parts have to send.
package session

import (
	"fmt"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/edge/publish"
	"github.com/ferry-dev/ferry/edge/replica"
	"github.com/ferry-dev/ferry/edge/stream"
)

// Handler routes between the stream and the edge's parts.
type Handler struct {
	Publish *publish.Store
	Replica *replica.Engine
	pending <-chan struct{}
}

var _ stream.Handler = (*Handler)(nil)

// NewHandler joins the parts; pending must be the channel from link.NewWake
// whose wake function the parts were built with.
func NewHandler(p *publish.Store, r *replica.Engine, pending <-chan struct{}) *Handler {
	return &Handler{Publish: p, Replica: r, pending: pending}
}

// Connected implements stream.Handler.
func (h *Handler) Connected(hello *ferryv1.BrokerHello) {
	h.Replica.Connected()
	h.Publish.Connected(hello)
}

// Disconnected implements stream.Handler.
func (h *Handler) Disconnected() {
	h.Publish.Disconnected()
	h.Replica.Disconnected()
}

// Pending implements stream.Handler.
func (h *Handler) Pending() <-chan struct{} { return h.pending }

// Outgoing implements stream.Handler: publishes first, then sync reports.
func (h *Handler) Outgoing() []*ferryv1.ConnectRequest {
	return append(h.Publish.Outgoing(), h.Replica.Outgoing()...)
}

// Handle implements stream.Handler.
func (h *Handler) Handle(msg *ferryv1.ConnectResponse) error {
	switch m := msg.GetMessage().(type) {
	case *ferryv1.ConnectResponse_PublishResult, *ferryv1.ConnectResponse_ExportStatus:
		return h.Publish.Handle(msg)
	case *ferryv1.ConnectResponse_Intent:
		h.Replica.Handle(m.Intent)
		return nil
	case *ferryv1.ConnectResponse_ReportResult:
		return nil // the broker retries failed writes itself; nothing to redo here
	case *ferryv1.ConnectResponse_ResyncComplete:
		return nil
	default:
		return fmt.Errorf("protocol error: this edge does not handle %T", m)
	}
}

// TooLarge implements stream.Handler.
func (h *Handler) TooLarge(msg *ferryv1.ConnectRequest, size, limit int) {
	h.Publish.TooLarge(msg, size, limit)
}

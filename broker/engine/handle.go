package engine

import (
	"fmt"
	"google.golang.org/protobuf/proto"

	"github.com/ferry-dev/ferry/pkg/logging"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/replication"
)

// Handle processes one message from the attached edge. It never blocks on
// the network: kcp work is queued for the engine's workers. An error is a
// protocol violation that ends the stream (a gRPC status).
func (e *Engine) Handle(msg *ferryv1.ConnectRequest) error {
	switch m := msg.GetMessage().(type) {
	case *ferryv1.ConnectRequest_Heartbeat:
		return nil
	case *ferryv1.ConnectRequest_Publish:
		// The export is the engine's own: an edge can only publish into the
		// APIExport its identity is configured for.
		name := m.Publish.GetPublishedResource()
		if name == "" || len(m.Publish.GetSpec()) == 0 || len(m.Publish.GetCustomResourceDefinition()) == 0 {
			return status.Error(codes.InvalidArgument, "Publish needs published_resource, spec and custom_resource_definition")
		}
		e.publisher.enqueue(name, msg)
		return nil
	case *ferryv1.ConnectRequest_Unpublish:
		name := m.Unpublish.GetPublishedResource()
		if name == "" {
			return status.Error(codes.InvalidArgument, "Unpublish needs published_resource")
		}
		e.publisher.enqueue(name, msg)
		return nil
	case *ferryv1.ConnectRequest_IntentResult:
		e.intentResult(m.IntentResult)
		return nil
	case *ferryv1.ConnectRequest_StatusReport:
		if m.StatusReport.GetKey() == nil {
			return status.Error(codes.InvalidArgument, "StatusReport needs key")
		}
		e.reports.add(reportTask{id: m.StatusReport.GetReportId(), epoch: m.StatusReport.GetReportEpoch(), attachment: e.attachment(), key: m.StatusReport.GetKey(), status: m.StatusReport})
		return nil
	case *ferryv1.ConnectRequest_RelatedObjectReport:
		r := m.RelatedObjectReport
		if r.GetRelatedTo().GetPrimary() == nil {
			return status.Error(codes.InvalidArgument, "related object report without related_to.primary")
		}
		e.reports.add(reportTask{id: r.GetReportId(), epoch: r.GetReportEpoch(), attachment: e.attachment(), key: r.GetRelatedTo().GetPrimary(), related: r})
		return nil
	case *ferryv1.ConnectRequest_DeletionConfirmation:
		if m.DeletionConfirmation.GetKey() == nil {
			return status.Error(codes.InvalidArgument, "DeletionConfirmation needs key")
		}
		e.reports.add(reportTask{id: m.DeletionConfirmation.GetReportId(), epoch: m.DeletionConfirmation.GetReportEpoch(), attachment: e.attachment(), key: m.DeletionConfirmation.GetKey(), deletion: true})
		return nil
	case *ferryv1.ConnectRequest_ResendRequest:
		if m.ResendRequest.GetKey() == nil {
			return status.Error(codes.InvalidArgument, "ResendRequest needs key")
		}
		if rt := m.ResendRequest.GetRelatedTo(); rt != nil && (rt.GetIdentifier() == "" || !proto.Equal(rt.GetPrimary(), m.ResendRequest.GetKey())) {
			return status.Error(codes.InvalidArgument, "ResendRequest.related_to needs an identifier and key as its primary")
		}
		e.reports.add(reportTask{id: m.ResendRequest.GetReportId(), epoch: m.ResendRequest.GetReportEpoch(), attachment: e.attachment(), key: m.ResendRequest.GetKey(), resend: m.ResendRequest})
		return nil
	case *ferryv1.ConnectRequest_Inventory:
		if m.Inventory.GetPublishedResource() == "" {
			return status.Error(codes.InvalidArgument, "Inventory needs published_resource")
		}
		e.observer.InventoryReceived(m.Inventory)
		e.mgr.Inventory(m.Inventory)
		return nil
	case *ferryv1.ConnectRequest_Hello:
		return status.Error(codes.InvalidArgument, "EdgeHello may only be sent once per stream")
	case nil:
		return status.Error(codes.InvalidArgument, "message without payload")
	default:
		return status.Errorf(codes.Unimplemented, "this broker does not handle %T yet", m)
	}
}

// intentResult takes the edge's ack or nack.
func (e *Engine) intentResult(r *ferryv1.IntentResult) {
	in, queued := e.intents.Answer(r.GetKey(), r.GetRelatedTo(), r.GetVersion())
	if log := e.opts.Log.V(4); log.Enabled() {
		log.Info("intent answered", logging.KeyObject, replication.KeyString(r.GetKey()), "sequence", r.GetVersion().GetSequence(),
			"stale", in == nil, "error", r.GetError().GetMessage())
	}
	if in == nil {
		return // stale: answered already, or another stream's
	}
	e.observer.IntentAnswered(in, r, queued)
	if r.GetError() != nil {
		e.nacks.add(r.GetError())
	}
	pr := in.GetPublishedResource()
	log := e.opts.Log
	if rt := in.GetRelatedTo(); rt != nil {
		e.relatedResult(pr, rt, r.GetError())
		return
	}
	if r.GetError() == nil {
		if in.GetUpsert() != nil {
			e.mgr.Applied(pr, in)
			// The copy was another agent's: its finalizer on the kcp
			// object (the broker's own intent's, UID included) is
			// replaced with the broker's.
			e.mgr.Adopted(pr, in, r.GetAdoptedFrom())
		}
		return
	}
	ae := r.GetError()
	if ae.GetReason() != ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_READY {
		// Not ready is the edge's state, not the object's: no Event.
		e.reports.add(reportTask{pr: pr, key: r.GetKey(), failure: ae})
	}
	if ae.GetRetryable() || ae.GetReason() == ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_READY {
		delay := e.mgr.Retry(pr, r.GetKey())
		log.V(1).Info("edge could not apply an object; retrying", logging.KeyObject, replication.KeyString(r.GetKey()),
			"reason", ae.GetReason().String(), "message", ae.GetMessage(), "retryIn", delay.String())
		return
	}
	e.mgr.Rejected(pr, r.GetKey(), "")
	log.Info("edge rejected an object; waiting for it or its PublishedResource to change", logging.KeyObject, replication.KeyString(r.GetKey()),
		"reason", ae.GetReason().String(), "message", ae.GetMessage())
}

// relatedResult takes the edge's ack or nack of a related object: a nack is
// recorded as an Event on the primary and retried when retryable.
func (e *Engine) relatedResult(pr string, rt *ferryv1.RelatedTo, ae *ferryv1.ApplyError) {
	if ae == nil {
		e.mgr.AppliedRelated(pr, rt)
		return
	}
	if ae.GetReason() != ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_READY {
		e.reports.add(reportTask{pr: pr, key: rt.GetPrimary(), failure: ae, relatedFailure: true})
	}
	if ae.GetRetryable() || ae.GetReason() == ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_READY {
		delay := e.mgr.RetryRelated(pr, rt)
		e.opts.Log.V(1).Info("edge could not apply a related object; retrying", "primary", replication.KeyString(rt.GetPrimary()),
			"related", rt.GetIdentifier(), "reason", ae.GetReason().String(), "message", ae.GetMessage(), "retryIn", delay.String())
		return
	}
	e.mgr.Rejected(pr, rt.GetPrimary(), rt.GetIdentifier())
	e.opts.Log.Info("edge rejected a related object; waiting for a change in kcp or of the PublishedResource", "primary", replication.KeyString(rt.GetPrimary()),
		"related", rt.GetIdentifier(), "reason", ae.GetReason().String(), "message", ae.GetMessage())
}

func tooLargeMessage(size, limit int) string {
	return fmt.Sprintf("the message is %d bytes, more than the peer accepts (%d); raise --max-message-bytes or make the object smaller", size, limit)
}

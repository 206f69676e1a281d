package server

import (
	"errors"

	"github.com/go-logr/logr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/replicate"
)

// streamState is what one edge stream's loop works with besides the
// stream itself. Only the loop's goroutine calls its methods.
type streamState struct {
	outbox    *replicate.Outbox
	mgr       *replicate.Manager
	reports   *reportWorker
	publisher *publishWorker
	maxSend   int
	log       logr.Logger
}

// sendIntents sends what the outbox's window allows. An intent larger than
// the edge accepts is not sent (it would end the stream) and counts as
// failed for its object.
func (st *streamState) sendIntents(stream ferryv1.SyncService_ConnectServer) error {
	for in := st.outbox.Next(); in != nil; in = st.outbox.Next() {
		msg := &ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Intent{Intent: in}}
		if size := proto.Size(msg); st.maxSend > 0 && size > st.maxSend {
			st.outbox.Done(in.GetKey(), in.GetRelatedTo(), in.GetVersion())
			st.log.Error(errors.New("intent too large"), "object not synced: larger than the edge accepts",
				"object", replicate.KeyString(in.GetKey()), "bytes", size, "limit", st.maxSend)
			continue
		}
		if err := stream.Send(msg); err != nil {
			return err
		}
	}
	return nil
}

// intentResult takes the edge's ack or nack.
func (st *streamState) intentResult(r *ferryv1.IntentResult) {
	in := st.outbox.Done(r.GetKey(), r.GetRelatedTo(), r.GetVersion())
	if in == nil {
		return // stale: a newer intent is on its way
	}
	pr := in.GetPublishedResource()
	if rt := in.GetRelatedTo(); rt != nil {
		st.relatedResult(pr, rt, r.GetError())
		return
	}
	if r.GetError() == nil {
		st.mgr.Applied(pr, r.GetKey())
		return
	}
	e := r.GetError()
	st.reports.add(reportTask{pr: pr, key: r.GetKey(), failure: e})
	if e.GetRetryable() {
		delay := st.mgr.Retry(pr, r.GetKey())
		st.log.Info("edge could not apply an object; retrying", "object", replicate.KeyString(r.GetKey()),
			"reason", e.GetReason().String(), "message", e.GetMessage(), "retryIn", delay.String())
		return
	}
	st.log.Info("edge rejected an object; waiting for it to change in kcp", "object", replicate.KeyString(r.GetKey()),
		"reason", e.GetReason().String(), "message", e.GetMessage())
}

// Reports name objects, not PublishedResources; the report worker finds the
// PublishedResource when it applies them, because right after a (re)connect
// the edge reports before the broker has processed its Publish messages.

func (st *streamState) statusReport(r *ferryv1.StatusReport) error {
	st.reports.add(reportTask{id: r.GetReportId(), key: r.GetKey(), status: r.GetStatus()})
	return nil
}

func (st *streamState) deletionConfirmation(d *ferryv1.DeletionConfirmation) error {
	st.outbox.Forget(d.GetKey())
	st.reports.add(reportTask{id: d.GetReportId(), key: d.GetKey(), deletion: true})
	return nil
}

// relatedResult takes the edge's ack or nack of a related object: a nack is
// recorded as an Event on the primary and retried when retryable.
func (st *streamState) relatedResult(pr string, rt *ferryv1.RelatedTo, e *ferryv1.ApplyError) {
	if e == nil {
		st.mgr.AppliedRelated(pr, rt)
		return
	}
	st.reports.add(reportTask{pr: pr, key: rt.GetPrimary(), failure: e})
	if e.GetRetryable() {
		delay := st.mgr.RetryRelated(pr, rt)
		st.log.Info("edge could not apply a related object; retrying", "primary", replicate.KeyString(rt.GetPrimary()),
			"related", rt.GetIdentifier(), "reason", e.GetReason().String(), "message", e.GetMessage(), "retryIn", delay.String())
		return
	}
	st.log.Info("edge rejected a related object; waiting for a change in kcp", "primary", replicate.KeyString(rt.GetPrimary()),
		"related", rt.GetIdentifier(), "reason", e.GetReason().String(), "message", e.GetMessage())
}

func (st *streamState) relatedObjectReport(r *ferryv1.RelatedObjectReport) error {
	if r.GetRelatedTo().GetPrimary() == nil {
		return status.Error(codes.InvalidArgument, "related object report without related_to.primary")
	}
	st.reports.add(reportTask{id: r.GetReportId(), key: r.GetRelatedTo().GetPrimary(), related: r})
	return nil
}

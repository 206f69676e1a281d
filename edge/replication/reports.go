package replication

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/ferry-dev/ferry/pkg/logging"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/mutation"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/protocol"
)

// Reports to the broker (status, related objects, deletion confirmations,
// resend requests) through one outbox, answered by epoch and id.
//
// The epoch belongs to the outbox, that is to the engine (one per edge
// process or incarnation), not to a stream: report ids are unique within an
// outbox and an unanswered report is re-sent on the next stream with its
// id, so an answer the broker computed for it on an earlier stream still
// answers that very report. What must never match is the same id of another
// outbox — an earlier process or incarnation, whose ids started at 1 too —
// and the epoch tells those apart. (The broker also answers a report only on
// the stream it came on.)

// reportKind is what a report says; with the object it is about, its key in
// the outbox (the latest report per key is sent).
type reportKind uint8

const (
	reportStatus reportKind = iota + 1
	reportDeleted
	reportResend
	reportResendRelated
	reportRelated
)

// reportKey is a report's key in the outbox: its kind and the object it is
// about (object for primaries, with identifier for a resend of a related
// entry; related for a related object's report).
type reportKey struct {
	kind       reportKind
	object     ledgerKey
	identifier string
	related    relKey
}

// String is k as logs show it.
func (k reportKey) String() string {
	switch k.kind {
	case reportStatus:
		return "status " + k.object.String()
	case reportDeleted:
		return "deleted " + k.object.String()
	case reportResend:
		return "resend " + k.object.String()
	case reportResendRelated:
		return "resend " + k.object.String() + " related " + k.identifier
	case reportRelated:
		return "related " + k.related.primary.pr + " " + k.related.primary.String() + " " + k.related.id
	}
	return "unknown report"
}

// newReportEpoch returns a random, non-zero report epoch.
func newReportEpoch() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:]) // never fails (crypto/rand, Go 1.24+)
		if epoch := binary.BigEndian.Uint64(b[:]); epoch != 0 {
			return epoch
		}
	}
}

// Next returns the next bulk message for the broker: inventory chunks
// first, then reports within the report window.
func (e *Engine) Next() (*ferryv1.ConnectRequest, bool) {
	e.mu.Lock()
	if len(e.pre) > 0 {
		m := e.pre[0]
		e.pre = e.pre[1:]
		e.mu.Unlock()
		return m, true
	}
	e.mu.Unlock()
	r, ok := e.reports.Next()
	if !ok {
		return nil, false
	}
	return withReportID(r.Value, e.reportEpoch, r.Seq), true
}

// withReportID returns a shallow copy of a report carrying epoch and id: the
// stored message is shared with the outbox.
func withReportID(m *ferryv1.ConnectRequest, epoch, id uint64) *ferryv1.ConnectRequest {
	switch r := m.GetMessage().(type) {
	case *ferryv1.ConnectRequest_StatusReport:
		o := r.StatusReport
		return &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_StatusReport{StatusReport: &ferryv1.StatusReport{
			ReportId: id, ReportEpoch: epoch, Key: o.GetKey(), Status: o.GetStatus(), LocalResourceVersion: o.GetLocalResourceVersion(), Error: o.GetError(),
		}}}
	case *ferryv1.ConnectRequest_RelatedObjectReport:
		o := r.RelatedObjectReport
		c := &ferryv1.RelatedObjectReport{
			ReportId: id, ReportEpoch: epoch, RelatedTo: o.GetRelatedTo(), Resource: o.GetResource(),
			LocalNamespace: o.GetLocalNamespace(), LocalName: o.GetLocalName(),
		}
		// Every state, whatever its kind (the oneof's value is immutable
		// once stored).
		c.State = o.State
		return &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_RelatedObjectReport{RelatedObjectReport: c}}
	case *ferryv1.ConnectRequest_DeletionConfirmation:
		o := r.DeletionConfirmation
		return &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_DeletionConfirmation{DeletionConfirmation: &ferryv1.DeletionConfirmation{
			ReportId: id, ReportEpoch: epoch, Key: o.GetKey(), Version: o.GetVersion(),
		}}}
	case *ferryv1.ConnectRequest_ResendRequest:
		o := r.ResendRequest
		return &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_ResendRequest{ResendRequest: &ferryv1.ResendRequest{
			ReportId: id, ReportEpoch: epoch, Key: o.GetKey(), Reason: o.GetReason(), RelatedTo: o.GetRelatedTo(),
		}}}
	}
	return m
}

// ReportResult takes the broker's answer to a report. An answer for another
// epoch (a report of an earlier engine with the same id) is dropped; one
// without an epoch comes from a broker that predates them and is matched by
// id alone.
func (e *Engine) ReportResult(r *ferryv1.ReportResult) {
	if epoch := r.GetReportEpoch(); epoch != 0 && epoch != e.reportEpoch {
		e.opts.Log.V(4).Info("answer to a report of an earlier edge engine dropped", "reportId", r.GetReportId(), "epoch", epoch)
		return
	}
	entry, ok := e.reports.AckSeq(r.GetReportId())
	if ok {
		e.observer().ReportAnswered(r, entry.Queued())
	}
	if ok && r.GetError() != nil {
		e.opts.Log.Info("broker could not apply a report (final)", "report", entry.Key.String(), "message", r.GetError().GetMessage())
	}
}

// TooLarge replaces a report the broker would refuse for its size by a
// small one that says so; the broker records it as a Warning Event on the
// kcp object.
func (e *Engine) TooLarge(m *ferryv1.ConnectRequest, size, limit int) {
	ae := &ferryv1.ApplyError{Reason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_TOO_LARGE,
		Message: fmt.Sprintf("the report is %d bytes, more than the broker accepts (%d); raise --max-message-bytes at the broker", size, limit)}
	switch r := m.GetMessage().(type) {
	case *ferryv1.ConnectRequest_StatusReport:
		entry, ok := e.reports.AckSeq(r.StatusReport.GetReportId())
		if !ok {
			return
		}
		e.opts.Log.Info("status too large for the broker; reporting the failure instead", logging.KeyObject, protocol.ObjectKeyString(r.StatusReport.GetKey()), "bytes", size, "limit", limit)
		e.reports.Put(entry.Key, &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_StatusReport{StatusReport: &ferryv1.StatusReport{
			Key: r.StatusReport.GetKey(), LocalResourceVersion: r.StatusReport.GetLocalResourceVersion(), Error: ae,
		}}})
	case *ferryv1.ConnectRequest_RelatedObjectReport:
		entry, ok := e.reports.AckSeq(r.RelatedObjectReport.GetReportId())
		if !ok {
			return
		}
		rr := r.RelatedObjectReport
		e.reports.Put(entry.Key, &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_RelatedObjectReport{RelatedObjectReport: &ferryv1.RelatedObjectReport{
			RelatedTo: rr.GetRelatedTo(), Resource: rr.GetResource(), LocalNamespace: rr.GetLocalNamespace(), LocalName: rr.GetLocalName(),
			State: &ferryv1.RelatedObjectReport_Error{Error: ae},
		}}})
	}
}

// report queues a report as the latest for its key.
func (e *Engine) report(key reportKey, m *ferryv1.ConnectRequest) {
	e.observer().ReportQueued(m)
	e.reports.Put(key, m)
}

func (e *Engine) reportStatusLocked(w *localWatch, obj any) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok || !w.pub.HasStatus {
		return
	}
	remote, ok := naming.RemoteFrom(u.GetLabels(), u.GetAnnotations())
	if !ok {
		return
	}
	if !w.pub.StatusMutator.Empty() {
		mutated := u.DeepCopy()
		if err := w.pub.StatusMutator.Apply(mutated.Object, mutation.Objects{Local: u.Object}); err != nil {
			e.opts.Log.Error(err, "status mutation failed; status not reported", logging.KeyObject, u.GetNamespace()+"/"+u.GetName())
			return
		}
		u = mutated
	}
	status, found := u.Object["status"]
	if !found {
		return
	}
	data, err := json.Marshal(status)
	if err != nil {
		return
	}
	key := remoteKey(w.pub, remote)
	k := keyFor(w.pub.Name, key)
	if !e.ledger.statusSeen(k, sha256.Sum256(data)) {
		return
	}
	e.report(reportKey{kind: reportStatus, object: k}, &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_StatusReport{StatusReport: &ferryv1.StatusReport{
		Key: key, Status: data, LocalResourceVersion: u.GetResourceVersion(),
	}}})
}

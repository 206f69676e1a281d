package replication

import (
	"testing"

	"github.com/go-logr/logr"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

func statusReport(name string) *ferryv1.ConnectRequest {
	return &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_StatusReport{StatusReport: &ferryv1.StatusReport{
		Key: &ferryv1.ObjectKey{Cluster: "c", Namespace: "ns", Name: name, Uid: "u-" + name}, Status: []byte(`{}`),
	}}}
}

// answerTo is the broker's answer to a report as sent (report_id and
// report_epoch echoed).
func answerTo(m *ferryv1.ConnectRequest) *ferryv1.ReportResult {
	r := m.GetStatusReport()
	return &ferryv1.ReportResult{ReportId: r.GetReportId(), ReportEpoch: r.GetReportEpoch()}
}

// TestReportAnswerOfAnotherEpochIsDropped: report ids restart with every
// edge engine; the broker's answer to report 1 of an earlier engine (sent
// before a restart, answered after it) must not ack this engine's report 1,
// which was not written (issue 18, item 6).
func TestReportAnswerOfAnotherEpochIsDropped(t *testing.T) {
	earlier := NewEngine(Options{Log: logr.Discard()})
	earlier.report(reportKey{kind: reportStatus, object: ledgerKeyOf("pr", "a", "u-a")}, statusReport("a"))
	old, ok := earlier.Next()
	if !ok {
		t.Fatal("the earlier engine sent no report")
	}

	e := NewEngine(Options{Log: logr.Discard()})
	b := reportKey{kind: reportStatus, object: ledgerKeyOf("pr", "b", "u-b")}
	e.report(b, statusReport("b"))
	sent, ok := e.Next()
	if !ok {
		t.Fatal("no report sent")
	}
	if sent.GetStatusReport().GetReportId() != old.GetStatusReport().GetReportId() {
		t.Fatalf("the test needs equal report ids, got %d and %d", old.GetStatusReport().GetReportId(), sent.GetStatusReport().GetReportId())
	}

	e.ReportResult(answerTo(old))
	if _, inFlight := e.reports.InFlight(b); !inFlight {
		t.Fatal("an answer to the earlier engine's report 1 acked this engine's report 1")
	}
	if sent.GetStatusReport().GetReportEpoch() == 0 {
		t.Fatal("a report without an epoch")
	}
	e.ReportResult(answerTo(sent))
	if _, inFlight := e.reports.InFlight(b); inFlight {
		t.Fatal("the answer to the report was not taken")
	}
}

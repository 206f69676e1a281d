package edgeload

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/projection"
)

// recordSink is a stream's control lane that keeps what it was given.
type recordSink struct {
	mu   sync.Mutex
	msgs []*ferryv1.ConnectRequest
}

func (s *recordSink) Control(m *ferryv1.ConnectRequest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.msgs = append(s.msgs, m)
	return nil
}

// take returns the messages since the last take.
func (s *recordSink) take() []*ferryv1.ConnectRequest {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.msgs
	s.msgs = nil
	return out
}

const testGroup = "load-00000.edgeload.ferry.dev"

var testResource = schema.GroupVersionResource{Group: testGroup, Version: "v1", Resource: "widgets"}

func testPublish(t *testing.T) *ferryv1.Publish {
	t.Helper()
	p, err := WidgetPublish(testGroup)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// drain returns every bulk message the handler has now.
func drain(h *handler) []*ferryv1.ConnectRequest {
	var out []*ferryv1.ConnectRequest
	for {
		m, ok := h.Next()
		if !ok {
			return out
		}
		out = append(out, m)
	}
}

func published(p *ferryv1.Publish) *ferryv1.ConnectResponse {
	return &ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_PublishResult{PublishResult: &ferryv1.PublishResult{
		PublishedResource: p.GetPublishedResource(), Generation: p.GetGeneration(), Revision: p.GetRevision(),
		State: ferryv1.PublishState_PUBLISH_STATE_PUBLISHED, ServedResource: &ferryv1.GroupVersionResource{
			Group: testResource.Group, Version: testResource.Version, Resource: testResource.Resource,
		}, ProjectedKind: "Widget",
	}}}
}

func widgetKey(name, uid string) *ferryv1.ObjectKey {
	return &ferryv1.ObjectKey{Cluster: "c1", Namespace: "default", Name: name, Uid: uid, Resource: &ferryv1.GroupVersionResource{
		Group: testResource.Group, Version: testResource.Version, Resource: testResource.Resource,
	}}
}

func upsert(t *testing.T, key *ferryv1.ObjectKey, seq uint64, revision int64, writtenAt time.Time, hash string) *ferryv1.ConnectResponse {
	t.Helper()
	obj, err := json.Marshal(Widget(testResource, "Widget", key.GetNamespace(), key.GetName(), revision, writtenAt).Object)
	if err != nil {
		t.Fatal(err)
	}
	return &ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Intent{Intent: &ferryv1.SyncIntent{
		Key: key, Version: &ferryv1.ObjectVersion{BrokerEpoch: 1, Sequence: seq}, PublishedResource: WidgetPublishedResource,
		Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{Object: obj, ContentHash: hash}},
	}}}
}

func handle(t *testing.T, h *handler, msgs ...*ferryv1.ConnectResponse) {
	t.Helper()
	for _, m := range msgs {
		if err := h.Handle(m); err != nil {
			t.Fatal(err)
		}
	}
}

// TestWidgetPublishProjects checks that the broker's projection takes the
// widget CRD as published: served in the export's group, with a status
// subresource (every applied widget gets a status report).
func TestWidgetPublishProjects(t *testing.T) {
	p := testPublish(t)
	var spec ferryv1alpha1.PublishedResourceSpec
	if err := json.Unmarshal(p.GetSpec(), &spec); err != nil {
		t.Fatal(err)
	}
	var crd apiextensionsv1.CustomResourceDefinition
	if err := json.Unmarshal(p.GetCustomResourceDefinition(), &crd); err != nil {
		t.Fatal(err)
	}
	res, err := projection.Project(&spec, &crd, testGroup)
	if err != nil {
		t.Fatal(err)
	}
	if res.Resource != testResource || res.Kind != "Widget" || res.Schema.Spec.Scope != apiextensionsv1.NamespaceScoped {
		t.Errorf("projected %v %s %s; want %v Widget, namespaced", res.Resource, res.Kind, res.Schema.Spec.Scope, testResource)
	}
	if v := res.Schema.Spec.Versions; len(v) != 1 || v[0].Subresources.Status == nil {
		t.Errorf("projected versions %+v; want one with a status subresource", v)
	}
	if again := testPublish(t); again.GetRevision() != p.GetRevision() || p.GetRevision() == "" {
		t.Errorf("revisions %q and %q; want one stable revision", p.GetRevision(), again.GetRevision())
	}
}

// TestWidgetWritten reads back what the generator writes.
func TestWidgetWritten(t *testing.T) {
	at := time.Unix(1700000000, 123456789)
	obj, err := json.Marshal(Widget(testResource, "Widget", "default", "w-0", 7, at).Object)
	if err != nil {
		t.Fatal(err)
	}
	rev, got, ok := widgetWritten(obj)
	if !ok || rev != 7 || !got.Equal(at) {
		t.Errorf("widgetWritten = %d %v %v; want 7 %v", rev, got, ok, at)
	}
	var patch map[string]map[string]any
	if err := json.Unmarshal(WidgetPatch(8, at), &patch); err != nil || patch["spec"]["revision"] != float64(8) {
		t.Errorf("patch %v (%v); want spec.revision 8", patch, err)
	}
	if _, _, ok := widgetWritten([]byte(`{"spec":{}}`)); ok {
		t.Error("a widget without writtenAt was read")
	}
}

// TestTrafficHandler runs a traffic edge's handler against the broker's
// messages of two streams: the Publish first, the inventory once
// published, an ack and one status report per new state, answers that
// empty the outbox, and after a reconnect an inventory that lists what
// was applied.
func TestTrafficHandler(t *testing.T) {
	p := testPublish(t)
	h := newHandler(p)
	sink := &recordSink{}
	h.Attach(&ferryv1.BrokerHello{}, sink)

	out := drain(h)
	if len(out) != 1 || out[0].GetPublish().GetRevision() != p.GetRevision() {
		t.Fatalf("first stream sends %v; want the Publish alone until it is published", out)
	}
	select {
	case <-h.traffic.published:
		t.Fatal("published before the broker said so")
	default:
	}
	handle(t, h, published(p))
	<-h.traffic.published
	out = drain(h)
	if len(out) != 1 || !out[0].GetInventory().GetComplete() || len(out[0].GetInventory().GetEntries()) != 0 ||
		out[0].GetInventory().GetPublishedResource() != WidgetPublishedResource {
		t.Fatalf("after the PublishResult: %v; want one empty, complete inventory of widgets", out)
	}

	key := widgetKey("w-0", "u1")
	handle(t, h, upsert(t, key, 1, 3, time.Now().Add(-50*time.Millisecond), "h1"))
	acks := sink.take()
	if len(acks) != 1 || acks[0].GetIntentResult().GetError() != nil || acks[0].GetIntentResult().GetVersion().GetSequence() != 1 ||
		acks[0].GetIntentResult().GetLocalName() != "w-0" || acks[0].GetIntentResult().GetKey().GetUid() != "u1" {
		t.Fatalf("answers %v; want one ack of sequence 1 naming the local copy", acks)
	}
	out = drain(h)
	if len(out) != 1 || out[0].GetStatusReport() == nil {
		t.Fatalf("reports %v; want one status report", out)
	}
	sr := out[0].GetStatusReport()
	if sr.GetReportId() == 0 || sr.GetReportEpoch() == 0 || string(sr.GetStatus()) != `{"observedRevision":3,"phase":"Applied"}` || sr.GetKey().GetUid() != "u1" {
		t.Errorf("status report %v; want id, epoch and the observed revision 3", sr)
	}
	if trips := h.traffic.takeRoundTrips(); len(trips) != 1 || trips[0] < 50*time.Millisecond {
		t.Errorf("round trips %v; want one of at least 50ms", trips)
	}

	// The same state again (a re-sent intent): acked, nothing new to report.
	handle(t, h, upsert(t, key, 2, 3, time.Now(), "h1"))
	if acks := sink.take(); len(acks) != 1 || acks[0].GetIntentResult().GetVersion().GetSequence() != 2 {
		t.Errorf("answers %v; want the ack of sequence 2", acks)
	}
	if out := drain(h); len(out) != 0 {
		t.Errorf("an unchanged state reported again: %v", out)
	}
	if trips := h.traffic.takeRoundTrips(); len(trips) != 0 {
		t.Errorf("an unchanged state measured: %v", trips)
	}
	handle(t, h, &ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_ReportResult{ReportResult: &ferryv1.ReportResult{
		ReportId: sr.GetReportId(), ReportEpoch: sr.GetReportEpoch(),
	}}})
	if n := h.traffic.pendingReports(); n != 0 {
		t.Errorf("%d reports pending after the answer", n)
	}

	// The next stream: the Publish and the inventory at once, listing the
	// applied state, and nothing else.
	h.Detach()
	h.Attach(&ferryv1.BrokerHello{}, sink)
	out = drain(h)
	if len(out) != 2 || out[0].GetPublish() == nil {
		t.Fatalf("second stream sends %v; want the Publish and the inventory", out)
	}
	inv := out[1].GetInventory()
	if !inv.GetComplete() || len(inv.GetEntries()) != 1 || inv.GetEntries()[0].GetAppliedHash() != "h1" ||
		inv.GetEntries()[0].GetKey().GetUid() != "u1" || inv.GetEntries()[0].GetLocalName() != "w-0" {
		t.Errorf("inventory %v; want w-0 applied with hash h1", inv)
	}

	want := TrafficCounts{Intents: 2, IntentResults: 2, Reports: 1, ReportResults: 1}
	if got := h.traffic.countsNow(); got != want {
		t.Errorf("counts %+v; want %+v", got, want)
	}
}

// TestTrafficIntentAnswers covers each kind of intent a traffic edge may
// get: what it answers on the control lane and what it reports.
func TestTrafficIntentAnswers(t *testing.T) {
	key := widgetKey("w-1", "u2")
	version := &ferryv1.ObjectVersion{BrokerEpoch: 1, Sequence: 9}
	intent := func(mod func(*ferryv1.SyncIntent)) *ferryv1.ConnectResponse {
		in := &ferryv1.SyncIntent{Key: key, Version: version, PublishedResource: WidgetPublishedResource}
		mod(in)
		return &ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Intent{Intent: in}}
	}
	for _, tc := range []struct {
		name       string
		intent     *ferryv1.ConnectResponse
		wantReason ferryv1.ApplyErrorReason // unspecified: an ack
		wantReport func(*ferryv1.ConnectRequest) bool
	}{{
		name: "delete is confirmed",
		intent: intent(func(in *ferryv1.SyncIntent) {
			in.Operation = &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{}}
		}),
		wantReport: func(m *ferryv1.ConnectRequest) bool {
			d := m.GetDeletionConfirmation()
			return d != nil && d.GetKey().GetUid() == "u2" && d.GetVersion().GetSequence() == 9 && d.GetReportId() != 0
		},
	}, {
		name: "another PublishedResource is not published",
		intent: intent(func(in *ferryv1.SyncIntent) {
			in.PublishedResource = "gadgets"
			in.Operation = &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{Object: []byte(`{}`), ContentHash: "h"}}
		}),
		wantReason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_PUBLISHED,
	}, {
		name: "a related object is not published",
		intent: intent(func(in *ferryv1.SyncIntent) {
			in.RelatedTo = &ferryv1.RelatedTo{Primary: key, Identifier: "secret"}
			in.Operation = &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{Object: []byte(`{}`), ContentHash: "h"}}
		}),
		wantReason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_PUBLISHED,
	}, {
		name:       "no operation is invalid",
		intent:     intent(func(*ferryv1.SyncIntent) {}),
		wantReason: ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_INVALID,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHandler(testPublish(t))
			sink := &recordSink{}
			h.Attach(&ferryv1.BrokerHello{}, sink)
			drain(h)
			handle(t, h, tc.intent)
			answers := sink.take()
			if len(answers) != 1 {
				t.Fatalf("answers %v; want one", answers)
			}
			res := answers[0].GetIntentResult()
			if res.GetVersion().GetSequence() != 9 || res.GetError().GetReason() != tc.wantReason {
				t.Errorf("answer %v; want sequence 9, error reason %s", res, tc.wantReason)
			}
			out := drain(h)
			switch {
			case tc.wantReport == nil && len(out) != 0:
				t.Errorf("reports %v; want none", out)
			case tc.wantReport != nil && (len(out) != 1 || !tc.wantReport(out[0])):
				t.Errorf("reports %v; want the expected one", out)
			}
			if nacks := h.traffic.countsNow().Nacks; (nacks == 1) != (tc.wantReason != 0) {
				t.Errorf("%d nacks counted", nacks)
			}
		})
	}
}

// TestTrafficReportsResent sends an unanswered report again on the next
// stream with a new id; an answer to the old id, or of another epoch,
// leaves it pending; a newer status replaces an unanswered one.
func TestTrafficReportsResent(t *testing.T) {
	p := testPublish(t)
	h := newHandler(p)
	sink := &recordSink{}
	h.Attach(&ferryv1.BrokerHello{}, sink)
	handle(t, h, published(p))
	drain(h)
	key := widgetKey("w-0", "u1")
	handle(t, h, upsert(t, key, 1, 1, time.Now(), "h1"))
	first := drain(h)[0].GetStatusReport()

	h.Detach()
	h.Attach(&ferryv1.BrokerHello{}, sink)
	out := drain(h)
	if len(out) != 3 || out[2].GetStatusReport() == nil {
		t.Fatalf("second stream sends %v; want the Publish, the inventory and the report again", out)
	}
	again := out[2].GetStatusReport()
	if again.GetReportId() == first.GetReportId() || again.GetReportEpoch() != first.GetReportEpoch() {
		t.Errorf("report resent with id %d epoch %d; first id %d epoch %d: want a new id, the same epoch",
			again.GetReportId(), again.GetReportEpoch(), first.GetReportId(), first.GetReportEpoch())
	}
	for _, r := range []*ferryv1.ReportResult{
		{ReportId: first.GetReportId(), ReportEpoch: first.GetReportEpoch()}, // the first stream's
		{ReportId: again.GetReportId(), ReportEpoch: again.GetReportEpoch() + 1},
	} {
		handle(t, h, &ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_ReportResult{ReportResult: r}})
	}
	if n := h.traffic.pendingReports(); n != 1 {
		t.Fatalf("%d reports pending; want the one not answered", n)
	}

	// A newer state before the answer: the answer to the older report
	// leaves the newer one queued.
	handle(t, h, upsert(t, key, 2, 2, time.Now(), "h2"))
	handle(t, h, &ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_ReportResult{ReportResult: &ferryv1.ReportResult{
		ReportId: again.GetReportId(), ReportEpoch: again.GetReportEpoch(),
	}}})
	out = drain(h)
	if len(out) != 1 || !strings.Contains(string(out[0].GetStatusReport().GetStatus()), `"observedRevision":2`) {
		t.Fatalf("reports %v; want the newer status", out)
	}
	if n := h.traffic.pendingReports(); n != 1 {
		t.Errorf("%d reports pending; want the newer one", n)
	}
}

// TestFleetTraffic counts a window's traffic over the traffic edges only.
func TestFleetTraffic(t *testing.T) {
	p := testPublish(t)
	traffic := NewEdge(EdgeOptions{Name: "t", Publish: p})
	quiet := NewEdge(EdgeOptions{Name: "q"})
	f := NewFleet([]*Edge{traffic, quiet})
	if got := f.TrafficEdges(); len(got) != 1 || got[0] != traffic {
		t.Fatalf("traffic edges %v", got)
	}
	sink := &recordSink{}
	traffic.handler.Attach(&ferryv1.BrokerHello{}, sink)
	handle(t, traffic.handler, published(p))
	handle(t, traffic.handler, upsert(t, widgetKey("w-0", "u0"), 1, 0, time.Now(), "h0")) // before the window

	m := f.MarkTraffic()
	for i, name := range []string{"w-1", "w-2", "w-3"} {
		handle(t, traffic.handler, upsert(t, widgetKey(name, "u"+name), uint64(i+2), 0, time.Now().Add(-time.Duration(i+1)*10*time.Millisecond), "h"))
	}
	drain(traffic.handler)
	w := f.TrafficSince(m)
	if w.Edges != 1 || w.Counts.Intents != 3 || w.Counts.IntentResults != 3 || w.Counts.Reports != 4 || w.RoundTrips != 3 {
		t.Errorf("window %+v; want 1 edge, 3 intents and results, 4 reports sent (one from before), 3 round trips", w)
	}
	if w.IntentsPerSecond <= 0 || w.RoundTripMaxSeconds < 0.03 || w.RoundTripP50Seconds < 0.02 || w.PendingReports != 4 {
		t.Errorf("window %+v; want rates, round trips of 10–30ms and 4 reports pending", w)
	}
}

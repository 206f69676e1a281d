package session

import (
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/edge/publish"
	"github.com/ferry-dev/ferry/edge/replication"
	"github.com/ferry-dev/ferry/pkg/link"
)

type discardSink struct{}

func (discardSink) Control(*ferryv1.ConnectRequest) error { return nil }

func testHandler() *Handler {
	wake, pending := link.NewWake()
	eng := replication.NewEngine(replication.Options{Agent: "nora", Dynamic: dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()),
		Kube: kubefake.NewClientset(), Wake: wake, Log: logr.Discard()})
	return NewHandler(publish.NewStore("broker:443", wake), eng, pending)
}

func TestLinkStatus(t *testing.T) {
	h := testHandler()
	if st := h.Link(); st.Connected || !st.Since.IsZero() || st.Hello != nil {
		t.Fatalf("before the first stream: %+v", st)
	}
	hello := &ferryv1.BrokerHello{SessionId: "s1", ProtocolVersion: 1, Export: &ferryv1.ExportStatus{LogicalCluster: "lc"}}
	h.Attach(hello, discardSink{})
	st := h.Link()
	if !st.Connected || st.Since.IsZero() || st.Hello.GetSessionId() != "s1" || st.Export.GetLogicalCluster() != "lc" {
		t.Fatalf("connected: %+v", st)
	}
	st.Hello.SessionId = "changed"
	if h.Link().Hello.GetSessionId() != "s1" {
		t.Error("Link hands out the handler's own message")
	}
	ready := &ferryv1.ExportStatus{LogicalCluster: "lc", VirtualWorkspaceReady: true}
	if err := h.Handle(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_ExportStatus{ExportStatus: ready}}); err != nil {
		t.Fatal(err)
	}
	if !h.Link().Export.GetVirtualWorkspaceReady() {
		t.Error("the export status change is not shown")
	}
	h.Detach()
	if st := h.Link(); st.Connected || st.Hello.GetSessionId() != "s1" {
		t.Errorf("disconnected: %+v", st)
	}
}

func TestHandleRoutesBrokerMessages(t *testing.T) {
	h := testHandler()
	h.Attach(&ferryv1.BrokerHello{SessionId: "s1"}, discardSink{})
	cases := []struct {
		name    string
		msg     *ferryv1.ConnectResponse
		wantErr bool
	}{
		{"inventory request", &ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_InventoryRequest{
			InventoryRequest: &ferryv1.InventoryRequest{PublishedResources: []string{"pr"}}}}, false},
		{"resync complete", &ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_ResyncComplete{ResyncComplete: &ferryv1.ResyncComplete{}}}, false},
		{"a second hello is not the handler's", &ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Hello{Hello: &ferryv1.BrokerHello{}}}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := h.Handle(tc.msg); (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want one: %v", err, tc.wantErr)
			}
		})
	}
}

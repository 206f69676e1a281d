package admin

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	reflectionpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/grpc/status"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/edge/publish"
	"github.com/ferry-dev/ferry/edge/replication"
	"github.com/ferry-dev/ferry/edge/session"
	"github.com/ferry-dev/ferry/pkg/link"
)

func TestValidateAddress(t *testing.T) {
	for _, tc := range []struct {
		addr    string
		wantErr string
	}{
		{"0", ""},
		{"127.0.0.1:8082", ""},
		{"[::1]:8082", ""},
		{"localhost:8082", ""},
		{"127.0.0.2:0", ""},
		{":8082", "not a loopback address"},
		{"0.0.0.0:8082", "not a loopback address"},
		{"10.0.0.1:8082", "not a loopback address"},
		{"edge.example.com:8082", "not a loopback address"},
		{"8082", "--admin-bind-address"},
	} {
		err := ValidateAddress(tc.addr)
		if (err == nil) != (tc.wantErr == "") || (err != nil && !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("ValidateAddress(%q) = %v, want an error containing %q", tc.addr, err, tc.wantErr)
		}
	}
}

func TestServeRefusesBadAddresses(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := New("nora", "broker:443")
	if addr, err := s.Serve(ctx, "0", logr.Discard()); addr != nil || err != nil {
		t.Errorf("off: %v %v", addr, err)
	}
	if _, err := s.Serve(ctx, "0.0.0.0:0", logr.Discard()); err == nil {
		t.Error("served beyond loopback")
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	if _, err := s.Serve(ctx, busy.Addr().String(), logr.Discard()); err == nil || !strings.Contains(err.Error(), "--admin-bind-address") {
		t.Errorf("busy address: %v", err)
	}
}

func TestServer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := New("nora", "broker:443")
	addr, err := s.Serve(ctx, "127.0.0.1:0", logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(addr.String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := ferryv1.NewEdgeAdminServiceClient(conn)

	// Reflection lists the service (grpcurl -plaintext ADDRESS list).
	refl, err := reflectionpb.NewServerReflectionClient(conn).ServerReflectionInfo(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := refl.Send(&reflectionpb.ServerReflectionRequest{MessageRequest: &reflectionpb.ServerReflectionRequest_ListServices{}}); err != nil {
		t.Fatal(err)
	}
	resp, err := refl.Recv()
	if err != nil {
		t.Fatal(err)
	}
	var services []string
	for _, svc := range resp.GetListServicesResponse().GetService() {
		services = append(services, svc.GetName())
	}
	if !strings.Contains(strings.Join(services, " "), "ferry.v1alpha1.EdgeAdminService") {
		t.Errorf("reflection lists %v", services)
	}

	// Before an incarnation runs.
	st, err := client.GetStatus(ctx, &ferryv1.GetStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.GetAgentName() != "nora" || st.GetBrokerAddress() != "broker:443" || st.GetConnected() || st.GetLeading() {
		t.Errorf("status without an incarnation: %v", st)
	}
	if _, err := client.GetObjectState(ctx, &ferryv1.EdgeAdminServiceGetObjectStateRequest{LocalName: "x"}); status.Code(err) != codes.Unavailable {
		t.Errorf("object state without an incarnation: %v", err)
	}

	// An incarnation that leads and is connected; then the next one.
	for i, session := range []string{"s1", "s2"} {
		wake, pending := link.NewWake()
		eng := replication.NewEngine(replication.Options{Agent: "nora", Dynamic: dynamicfake.NewSimpleDynamicClient(runtime.NewScheme()),
			Kube: kubefake.NewClientset(), Wake: wake, Log: logr.Discard()})
		h := sessionHandler(eng, wake, pending)
		h.Attach(&ferryv1.BrokerHello{SessionId: session, ProtocolVersion: 1, Identity: "spiffe://edge",
			Capabilities: []ferryv1.Capability{ferryv1.Capability_CAPABILITY_INVENTORY_REQUEST}}, discardSink{})
		leading := i == 0
		s.SetSource(&Source{Link: h, Engine: eng, Leading: func() bool { return leading }})
		st, err := client.GetStatus(ctx, &ferryv1.GetStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if !st.GetConnected() || st.GetSessionId() != session || st.GetSince() == nil || st.GetIdentity() != "spiffe://edge" ||
			len(st.GetCapabilities()) != 1 || st.GetLeading() != leading {
			t.Errorf("incarnation %d: status %v", i+1, st)
		}
		_, err = client.GetObjectState(ctx, &ferryv1.EdgeAdminServiceGetObjectStateRequest{LocalName: "x"})
		if status.Code(err) != codes.NotFound || strings.Contains(status.Convert(err).Message(), "not the leader") == leading {
			t.Errorf("incarnation %d: unknown object: %v", i+1, err)
		}
		_, err = client.GetObjectState(ctx, &ferryv1.EdgeAdminServiceGetObjectStateRequest{Workspace: "c1"})
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("incarnation %d: no selection: %v", i+1, err)
		}
	}
}

type discardSink struct{}

func (discardSink) Control(*ferryv1.ConnectRequest) error { return nil }

func sessionHandler(eng *replication.Engine, wake func(), pending <-chan struct{}) *session.Handler {
	return session.NewHandler(publish.NewStore("broker:443", wake), eng, pending)
}

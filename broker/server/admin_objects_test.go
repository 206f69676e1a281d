package server

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/kcp"
	"github.com/ferry-dev/ferry/broker/publish"
	"github.com/ferry-dev/ferry/pkg/devpki"
	"github.com/ferry-dev/ferry/pkg/protocol"
)

// workspaceResolver resolves exportA and the workspace paths in clusters;
// its virtual workspace never appears, so engines make no call to kcp.
type workspaceResolver struct {
	clusters map[string]string
}

func (workspaceResolver) Resolve(_ context.Context, ref config.APIExportRef) (kcp.ExportState, error) {
	if ref != exportA {
		return kcp.ExportState{}, &kcp.NotFoundError{What: "APIExport " + ref.String(), Err: errors.New("not found")}
	}
	return kcp.ExportState{LogicalCluster: "provider"}, nil
}

func (workspaceResolver) WatchVirtualWorkspace(ctx context.Context, _ config.APIExportRef, _ func(kcp.VirtualWorkspace)) {
	<-ctx.Done()
}

func (w workspaceResolver) LogicalCluster(_ context.Context, path string) (string, error) {
	c, ok := w.clusters[path]
	if !ok {
		return "", &kcp.NotFoundError{What: "workspace " + path, Err: errors.New("not found")}
	}
	return c, nil
}

// servingApplier publishes every resource as certificates.a.ferry.dev.
type servingApplier struct{}

func (servingApplier) Apply(_ context.Context, _ config.APIExportRef, owners publish.Owners, msg *ferryv1.Publish) (*ferryv1.PublishResult, error) {
	owners[msg.GetPublishedResource()] = msg.GetPublishedResource()
	return &ferryv1.PublishResult{
		PublishedResource: msg.GetPublishedResource(), Revision: msg.GetRevision(), State: ferryv1.PublishState_PUBLISH_STATE_PUBLISHED,
		ServedResource: &ferryv1.GroupVersionResource{Group: exportA.Name, Version: "v1", Resource: "certificates"},
	}, nil
}

var certKey = &ferryv1.ObjectKey{Cluster: "consumer-lc", Resource: &ferryv1.GroupVersionResource{Group: exportA.Name, Version: "v1", Resource: "certificates"},
	Namespace: "default", Name: "c1", Uid: "u1"}

// connectPublished connects edge-a with caps, publishes "certs" and sends
// an inventory holding a copy of certKey; it returns the stream and the
// session id.
func connectPublished(t *testing.T, tb *testBroker, caps ...ferryv1.Capability) (ferryv1.SyncService_ConnectClient, string) {
	t.Helper()
	hello := validHello()
	hello.Capabilities = caps
	stream, resp, err := connect(t, tb.dial(t, "edge-a"), helloRequest(hello))
	if err != nil {
		t.Fatal(err)
	}
	send := func(m *ferryv1.ConnectRequest) {
		t.Helper()
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	send(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_Publish{Publish: &ferryv1.Publish{
		PublishedResource: "certs", Spec: []byte("{}"), CustomResourceDefinition: []byte("{}"), Revision: "r1",
	}}})
	for {
		msg, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if msg.GetPublishResult().GetState() == ferryv1.PublishState_PUBLISH_STATE_PUBLISHED {
			break
		}
	}
	send(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_Inventory{Inventory: &ferryv1.Inventory{
		PublishedResource: "certs", Complete: true,
		Entries: []*ferryv1.InventoryEntry{{Key: certKey, AppliedHash: "h1", AppliedResourceVersion: "5", LocalNamespace: "team-x", LocalName: "c1"}},
	}}})
	return stream, resp.GetHello().GetSessionId()
}

func TestAdminGetObjectState(t *testing.T) {
	tb := startTestBrokerWith(t, workspaceResolver{clusters: map[string]string{"root:consumer": "consumer-lc"}}, servingApplier{})
	connectPublished(t, tb, ferryv1.Capability_CAPABILITY_INVENTORY_RESYNC)
	admin := ferryv1.NewAdminServiceClient(tb.dial(t, "admin"))
	ctx := context.Background()
	query := &ferryv1.GetObjectStateRequest{Workspace: "consumer-lc", Resource: "certificates", Namespace: "default", Name: "c1"}
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := admin.GetObjectState(ctx, query)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the inventory's copy never became visible: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	tests := []struct {
		name     string
		client   string
		req      *ferryv1.GetObjectStateRequest
		wantCode codes.Code
		wantMsg  string
		wantPath string
	}{
		{name: "not an admin", client: "edge-a", req: query, wantCode: codes.PermissionDenied, wantMsg: "not an admin"},
		{name: "workspace missing", client: "admin", req: &ferryv1.GetObjectStateRequest{Resource: "certificates", Name: "c1"},
			wantCode: codes.InvalidArgument, wantMsg: "workspace is required"},
		{name: "resource missing", client: "admin", req: &ferryv1.GetObjectStateRequest{Workspace: "x", Name: "c1"},
			wantCode: codes.InvalidArgument, wantMsg: "resource is required"},
		{name: "name missing", client: "admin", req: &ferryv1.GetObjectStateRequest{Workspace: "x", Resource: "certificates"},
			wantCode: codes.InvalidArgument, wantMsg: "name is required"},
		{name: "resource nobody serves", client: "admin", req: &ferryv1.GetObjectStateRequest{Workspace: "x", Resource: "widgets", Name: "c1"},
			wantCode: codes.NotFound, wantMsg: "no sync engine of this broker serves widgets"},
		{name: "other group", client: "admin", req: &ferryv1.GetObjectStateRequest{Workspace: "x", Group: "other.dev", Resource: "certificates", Name: "c1"},
			wantCode: codes.NotFound, wantMsg: "certificates.other.dev"},
		{name: "object not synced", client: "admin", req: &ferryv1.GetObjectStateRequest{Workspace: "consumer-lc", Resource: "certificates", Namespace: "default", Name: "nope"},
			wantCode: codes.NotFound, wantMsg: "is not synced by APIExport " + exportA.String()},
		{name: "unknown workspace path", client: "admin", req: &ferryv1.GetObjectStateRequest{Workspace: "root:nope", Resource: "certificates", Name: "c1"},
			wantCode: codes.NotFound, wantMsg: "logical cluster name"},
		{name: "by logical cluster", client: "admin", req: query, wantCode: codes.OK},
		{name: "by workspace path and plural.group", client: "admin", wantCode: codes.OK, wantPath: "root:consumer",
			req: &ferryv1.GetObjectStateRequest{Workspace: "root:consumer", Resource: "certificates." + exportA.Name, Namespace: "default", Name: "c1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ferryv1.NewAdminServiceClient(tb.dial(t, tt.client)).GetObjectState(ctx, tt.req)
			st := status.Convert(err)
			if st.Code() != tt.wantCode || !strings.Contains(st.Message(), tt.wantMsg) {
				t.Fatalf("got %v %q; want %v containing %q", st.Code(), st.Message(), tt.wantCode, tt.wantMsg)
			}
			if err != nil {
				return
			}
			switch {
			case got.GetIdentity() != devpki.IdentityFor("edge-a") || got.GetPublishedResource() != "certs" || !got.GetEdgeConnected():
				t.Errorf("identity %q pr %q connected %v", got.GetIdentity(), got.GetPublishedResource(), got.GetEdgeConnected())
			case got.GetKey().GetUid() != "u1" || got.GetWorkspacePath() != tt.wantPath:
				t.Errorf("key %v path %q", got.GetKey(), got.GetWorkspacePath())
			case got.GetLocalCopy().GetNamespace() != "team-x" || got.GetLocalCopy().GetName() != "c1":
				t.Errorf("local copy %v", got.GetLocalCopy())
			case got.GetApplied().GetContentHash() != "h1" || got.GetApplied().GetSource() != "inventory":
				t.Errorf("applied %v", got.GetApplied())
			case got.GetSummary() == "":
				t.Error("no summary")
			}
		})
	}

	// ListEdges shows the negotiated capabilities and the engine's resources.
	list, err := admin.ListEdges(ctx, &ferryv1.ListEdgesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list.GetEdges() {
		if e.GetIdentity() != devpki.IdentityFor("edge-a") {
			continue
		}
		if len(e.GetCapabilities()) != 1 || len(e.GetEngine().GetResources()) != 1 || e.GetEngine().GetResources()[0].GetPublishedResource() != "certs" {
			t.Errorf("edge %v", e)
		}
	}
}

func TestAdminResync(t *testing.T) {
	tb := startTestBrokerWith(t, workspaceResolver{}, servingApplier{})
	stream, session := connectPublished(t, tb, ferryv1.Capability_CAPABILITY_INVENTORY_RESYNC, ferryv1.Capability_CAPABILITY_INVENTORY_REQUEST)
	requests := make(chan *ferryv1.InventoryRequest, 4)
	go func() {
		for {
			msg, err := stream.Recv()
			if err != nil {
				return
			}
			if r := msg.GetInventoryRequest(); r != nil {
				requests <- r
			}
		}
	}()
	ctx := context.Background()
	byIdentity := &ferryv1.ResyncRequest{Identity: devpki.IdentityFor("edge-a"), Wait: durationpb.New(0)}
	tests := []struct {
		name     string
		client   string
		req      *ferryv1.ResyncRequest
		wantCode codes.Code
		wantMsg  string
	}{
		{name: "not an admin", client: "edge-a", req: byIdentity, wantCode: codes.PermissionDenied},
		{name: "no edge named", client: "admin", req: &ferryv1.ResyncRequest{}, wantCode: codes.InvalidArgument, wantMsg: "identity or export"},
		{name: "unknown identity", client: "admin", req: &ferryv1.ResyncRequest{Identity: "spiffe://nobody"}, wantCode: codes.NotFound},
		{name: "identity and another export", client: "admin", wantCode: codes.InvalidArgument, wantMsg: "serves APIExport",
			req: &ferryv1.ResyncRequest{Identity: devpki.IdentityFor("edge-a"), Export: &ferryv1.APIExportReference{WorkspacePath: "root:org", Name: "other"}}},
		{name: "edge not connected", client: "admin", req: &ferryv1.ResyncRequest{Identity: devpki.IdentityFor("edge-b")},
			wantCode: codes.FailedPrecondition, wantMsg: "not connected"},
		{name: "negative wait", client: "admin", req: &ferryv1.ResyncRequest{Identity: devpki.IdentityFor("edge-a"), Wait: durationpb.New(-time.Second)},
			wantCode: codes.InvalidArgument, wantMsg: "wait"},
		{name: "unknown published resource", client: "admin", wantCode: codes.InvalidArgument, wantMsg: "nope",
			req: &ferryv1.ResyncRequest{Identity: devpki.IdentityFor("edge-a"), PublishedResources: []string{"nope"}}},
		{name: "by export", client: "admin", wantCode: codes.OK,
			req: &ferryv1.ResyncRequest{Export: &ferryv1.APIExportReference{WorkspacePath: exportA.Workspace, Name: exportA.Name}, Wait: durationpb.New(0)}},
		{name: "joins the running resync", client: "admin", req: byIdentity, wantCode: codes.OK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ferryv1.NewAdminServiceClient(tb.dial(t, tt.client)).Resync(ctx, tt.req)
			st := status.Convert(err)
			if st.Code() != tt.wantCode || !strings.Contains(st.Message(), tt.wantMsg) {
				t.Fatalf("got %v %q; want %v containing %q", st.Code(), st.Message(), tt.wantCode, tt.wantMsg)
			}
			if err != nil {
				return
			}
			r := got.GetResync()
			if r.GetSessionId() != session || r.GetRequestedAt() == nil || len(r.GetPublishedResources()) != 1 || r.GetPublishedResources()[0] != "certs" {
				t.Errorf("resync %v, want session %s and resource certs", r, session)
			}
		})
	}
	select {
	case r := <-requests:
		if len(r.GetPublishedResources()) != 0 {
			t.Errorf("request %v, want all resources", r)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the edge was not asked for its inventory")
	}
	select {
	case r := <-requests:
		t.Errorf("a joined resync asked again: %v", r)
	case <-time.After(200 * time.Millisecond):
	}
}

func TestAdminResyncNeedsTheCapability(t *testing.T) {
	tb := startTestBrokerWith(t, workspaceResolver{}, servingApplier{})
	connectPublished(t, tb, ferryv1.Capability_CAPABILITY_INVENTORY_RESYNC)
	_, err := ferryv1.NewAdminServiceClient(tb.dial(t, "admin")).Resync(context.Background(), &ferryv1.ResyncRequest{Identity: devpki.IdentityFor("edge-a")})
	if st := status.Convert(err); st.Code() != codes.FailedPrecondition || !strings.Contains(st.Message(), "CAPABILITY_INVENTORY_REQUEST") {
		t.Fatalf("got %v %q", st.Code(), st.Message())
	}
}

func TestSplitResource(t *testing.T) {
	for _, tc := range []struct{ group, resource, wantGroup, wantResource string }{
		{"", "certificates", "", "certificates"},
		{"", "certificates.a.ferry.dev", "a.ferry.dev", "certificates"},
		{"a.ferry.dev", "certificates", "a.ferry.dev", "certificates"},
		{"", " things ", "", "things"},
	} {
		if g, r := protocol.SplitResource(tc.group, tc.resource); g != tc.wantGroup || r != tc.wantResource {
			t.Errorf("SplitResource(%q, %q) = %q, %q", tc.group, tc.resource, g, r)
		}
	}
}

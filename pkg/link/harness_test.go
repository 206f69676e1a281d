package link

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// connectServer runs serve as the broker's Connect handler.
type connectServer struct {
	ferryv1.UnimplementedSyncServiceServer
	serve func(ferryv1.SyncService_ConnectServer) error
}

func (s *connectServer) Connect(stream ferryv1.SyncService_ConnectServer) error {
	return s.serve(stream)
}

// dialPair starts a real gRPC server on an in-memory listener running serve
// for each stream and returns a client stream to it.
func dialPair(t *testing.T, ctx context.Context, serve func(ferryv1.SyncService_ConnectServer) error) ferryv1.SyncService_ConnectClient {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	ferryv1.RegisterSyncServiceServer(srv, &connectServer{serve: serve})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	stream, err := ferryv1.NewSyncServiceClient(conn).Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return stream
}

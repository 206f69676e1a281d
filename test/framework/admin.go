package framework

import (
	"context"
	"fmt"
	"time"

	"google.golang.org/grpc"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// WaitEdgeState waits until the broker's admin API reports identity in state
// and returns the edge's entry.
func WaitEdgeState(ctx context.Context, conn *grpc.ClientConn, identity string, state ferryv1.EdgeState, timeout time.Duration) (*ferryv1.Edge, error) {
	admin := ferryv1.NewAdminServiceClient(conn)
	var found *ferryv1.Edge
	err := Eventually(ctx, timeout, 100*time.Millisecond, func(ctx context.Context) (bool, string) {
		resp, err := admin.ListEdges(ctx, &ferryv1.ListEdgesRequest{})
		if err != nil {
			return false, "ListEdges: " + err.Error()
		}
		for _, e := range resp.GetEdges() {
			if e.GetIdentity() != identity {
				continue
			}
			if e.GetState() == state {
				found = e
				return true, ""
			}
			return false, fmt.Sprintf("edge %s is %s", identity, e.GetState())
		}
		return false, fmt.Sprintf("edge %s not listed", identity)
	})
	return found, err
}

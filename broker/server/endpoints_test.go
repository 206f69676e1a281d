package server

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/kcp"
	"github.com/ferry-dev/ferry/pkg/devpki"
)

// shardResolver is workspaceResolver whose virtual workspace has one
// endpoint, at url.
type shardResolver struct {
	workspaceResolver
	url string
}

func (r shardResolver) WatchVirtualWorkspace(ctx context.Context, _ config.APIExportRef, onChange func(kcp.VirtualWorkspace)) {
	onChange(kcp.VirtualWorkspace{Exists: true, URLs: []string{r.url}})
	<-ctx.Done()
}

// closedPort returns an address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	if err := lis.Close(); err != nil {
		t.Fatal(err)
	}
	return addr
}

// TestUnreachableEndpointIsVisible: a virtual workspace endpoint the
// broker cannot reach shows in ListEdges (export_status.endpoints, and
// waiting_for names its URL), is pushed to the connected edge and is named
// for the readiness probe.
func TestUnreachableEndpointIsVisible(t *testing.T) {
	url := "https://" + closedPort(t) + "/services/apiexport/provider/a.ferry.dev"
	tb := startTestBrokerWith(t, shardResolver{url: url}, servingApplier{})
	stream, _ := connectPublished(t, tb)

	unreachable := func(st *ferryv1.ExportStatus) bool {
		eps := st.GetEndpoints()
		return len(eps) == 1 && eps[0].GetUrl() == url && !eps[0].GetReachable()
	}
	pushed := make(chan *ferryv1.ExportStatus, 1)
	go func() {
		for {
			msg, err := stream.Recv()
			if err != nil {
				return
			}
			if st := msg.GetExportStatus(); unreachable(st) {
				pushed <- st
				return
			}
		}
	}()
	select {
	case st := <-pushed:
		if !strings.Contains(st.GetWaitingFor(), url) {
			t.Errorf("pushed waiting_for %q does not name %s", st.GetWaitingFor(), url)
		}
	case <-time.After(30 * time.Second):
		// Generous: the failing list is retried with the reflector's backoff,
		// and the unit tests of every package run at once under -race on a
		// small CI machine (10 s was missed there once).
		t.Fatal("the edge was not told that the endpoint is unreachable")
	}

	admin := ferryv1.NewAdminServiceClient(tb.dial(t, "admin"))
	list, err := admin.ListEdges(context.Background(), &ferryv1.ListEdgesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range list.GetEdges() {
		if e.GetIdentity() != devpki.IdentityFor("edge-a") {
			continue
		}
		st := e.GetExportStatus()
		if !unreachable(st) || st.GetEndpoints()[0].GetLastError() == "" || st.GetEndpoints()[0].GetSince() == nil {
			t.Fatalf("ListEdges export status %v: want the endpoint unreachable, with its error and since when", st)
		}
		if !strings.Contains(st.GetWaitingFor(), url) {
			t.Errorf("ListEdges waiting_for %q does not name %s", st.GetWaitingFor(), url)
		}
		// The readiness probe's body names it too (degraded, not failed).
		if down := tb.srv.UnreachableEndpoints(); len(down) != 1 || !strings.Contains(down[0], url) || !strings.Contains(down[0], "a.ferry.dev") {
			t.Errorf("UnreachableEndpoints = %q, want the one endpoint with its export", down)
		}
		return
	}
	t.Fatal("edge-a not listed")
}

package e2e

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/protocol"
	"github.com/ferry-dev/ferry/test/framework"
)

// fakeEdge is an edge client in the test process: one stream to the broker,
// with a client certificate of the broker's PKI.
type fakeEdge struct {
	mu      sync.Mutex // serializes Send
	stream  ferryv1.SyncService_ConnectClient
	results chan *ferryv1.ReportResult
}

// dialFakeEdge opens a stream with client's certificate and completes the
// handshake as edge/stream does (retrying while the broker still holds the
// previous stream's slot).
func dialFakeEdge(t testing.TB, address, pki, client string) *fakeEdge {
	t.Helper()
	conn, err := framework.DialBroker(address, pki, client)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	var fe *fakeEdge
	var cancel context.CancelFunc
	err = framework.Eventually(context.Background(), time.Minute, 500*time.Millisecond, func(context.Context) (bool, string) {
		streamCtx, c := context.WithCancel(context.Background())
		stream, err := ferryv1.NewSyncServiceClient(conn).Connect(streamCtx)
		if err == nil {
			err = stream.Send(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_Hello{Hello: &ferryv1.EdgeHello{
				ProtocolVersion: protocol.Version, Capabilities: protocol.Capabilities(), AgentName: client,
				MaxReceiveMessageBytes: protocol.DefaultMaxMessageBytes, HeartbeatInterval: durationpb.New(time.Second),
				EdgeVersion: "fake",
			}}})
		}
		var first *ferryv1.ConnectResponse
		if err == nil {
			first, err = stream.Recv()
		}
		if err == nil && first.GetHello() == nil {
			err = fmt.Errorf("first message from the broker is %T", first.GetMessage())
		}
		if err != nil {
			c()
			return false, "handshake: " + err.Error()
		}
		fe, cancel = &fakeEdge{stream: stream, results: make(chan *ferryv1.ReportResult, 64)}, c
		return true, ""
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cancel)
	go func() {
		for {
			msg, err := fe.stream.Recv()
			if err != nil {
				return
			}
			if r := msg.GetReportResult(); r != nil {
				fe.results <- r
			}
		}
	}()
	go func() {
		for seq := uint64(1); ; seq++ {
			time.Sleep(time.Second)
			if fe.stream.Context().Err() != nil {
				return
			}
			fe.mu.Lock()
			err := fe.stream.Send(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_Heartbeat{Heartbeat: &ferryv1.Heartbeat{
				SentAt: timestamppb.Now(), Sequence: seq,
			}}})
			fe.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return fe
}

func (fe *fakeEdge) send(t testing.TB, m *ferryv1.ConnectRequest) {
	t.Helper()
	fe.mu.Lock()
	defer fe.mu.Unlock()
	if err := fe.stream.Send(m); err != nil {
		t.Fatal(err)
	}
}

// waitReportResults waits for the broker's answers to the reports ids.
func (fe *fakeEdge) waitReportResults(t testing.TB, timeout time.Duration, ids ...uint64) map[uint64]*ferryv1.ReportResult {
	t.Helper()
	out := map[uint64]*ferryv1.ReportResult{}
	end := time.After(timeout)
	for len(out) < len(ids) {
		select {
		case r := <-fe.results:
			if slices.Contains(ids, r.GetReportId()) {
				out[r.GetReportId()] = r
			}
		case <-end:
			t.Fatalf("answers to reports %v after %s: %v", ids, timeout, out)
		}
	}
	return out
}

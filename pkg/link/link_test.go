package link

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/outbox"
)

func TestReceiveDeliversInOrderThenError(t *testing.T) {
	msgs := []int{1, 2, 3}
	i := 0
	r := Receive(context.Background(), func() (int, error) {
		if i == len(msgs) {
			return 0, io.EOF
		}
		i++
		return msgs[i-1], nil
	}, 1)
	for _, want := range msgs {
		if got := <-r.C; got != want {
			t.Fatalf("got %d, want %d", got, want)
		}
	}
	if err := <-r.Err; !errors.Is(err, io.EOF) {
		t.Fatalf("want io.EOF, got %v", err)
	}
}

func TestReceiveStopsWhenContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	r := Receive(ctx, func() (int, error) { return 7, nil }, 0)
	<-r.C
	cancel()
	select {
	case err := <-r.Err:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("want context.Canceled, got %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("receiver did not stop after the context ended")
	}
}

func TestLoopEndsOnSilentPeer(t *testing.T) {
	l := NewLoop[int, int](1)
	l.Receiver = Receiver[int]{C: make(chan int), Err: make(chan error)}
	l.Send = func(int) error { return nil }
	l.Handle = func(int) error { return nil }
	l.Heartbeat = func(*ferryv1.Heartbeat) int { return 0 }
	l.Interval, l.DeadAfter = time.Hour, 200*time.Millisecond
	if err := l.Run(context.Background()); !errors.Is(err, ErrPeerSilent) {
		t.Fatalf("want ErrPeerSilent, got %v", err)
	}
}

func TestControlNeverBlocks(t *testing.T) {
	l := NewLoop[int, int](2)
	if l.Control(1) != nil || l.Control(2) != nil {
		t.Fatal("control refused within capacity")
	}
	if err := l.Control(3); !errors.Is(err, ErrControlFull) {
		t.Fatalf("want ErrControlFull, got %v", err)
	}
}

// TestOverrunControlLaneEndsStream: an answer that does not fit the control
// lane is lost, so the stream must end (the reconnect re-sends everything)
// instead of running on with the peer's window slowly filling while
// heartbeats look healthy.
func TestOverrunControlLaneEndsStream(t *testing.T) {
	l := NewLoop[int, int](2)
	l.Receiver = Receiver[int]{C: make(chan int), Err: make(chan error)}
	release := make(chan struct{})
	var sent atomic.Int32
	l.Send = func(int) error {
		<-release // the stream does not move
		sent.Add(1)
		return nil
	}
	l.Handle = func(int) error { return nil }
	l.Heartbeat = func(*ferryv1.Heartbeat) int { return 0 }
	l.Interval, l.DeadAfter = time.Hour, time.Hour

	done := make(chan error, 1)
	go func() { done <- l.Run(context.Background()) }()
	// The first message is taken by the (stuck) sender; two more fill the
	// lane and the fourth overruns it. Until the sender holds the first,
	// the lane may refuse early: keep queueing until one is refused.
	overrun := false
	for i := 0; i < 100 && !overrun; i++ {
		if err := l.Control(i); err != nil {
			if !errors.Is(err, ErrControlFull) {
				t.Fatalf("want ErrControlFull, got %v", err)
			}
			overrun = true
		}
	}
	if !overrun {
		t.Fatal("control lane never refused a message")
	}
	close(release)
	select {
	case err := <-done:
		if !errors.Is(err, ErrControlFull) {
			t.Fatalf("stream ended with %v, want ErrControlFull", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("stream still running after an overrun of its control lane (%d messages sent)", sent.Load())
	}
}

func TestOversizedBulkIsReportedNotSent(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	msgs := []string{"small", "this one is far too large", "ok"}
	var sent []string
	var tooLarge []string
	l := NewLoop[int, string](4)
	l.Receiver = Receiver[int]{C: make(chan int), Err: make(chan error)}
	l.Handle = func(int) error { return nil }
	l.Heartbeat = func(*ferryv1.Heartbeat) string { return "hb" }
	l.Interval, l.DeadAfter = time.Hour, time.Hour
	l.MaxSend, l.Size = 10, func(s string) int { return len(s) }
	l.TooLarge = func(m string, _ int) { tooLarge = append(tooLarge, m) }
	l.Bulk = func() (string, bool) {
		if len(msgs) == 0 {
			return "", false
		}
		m := msgs[0]
		msgs = msgs[1:]
		return m, true
	}
	l.Send = func(m string) error {
		sent = append(sent, m)
		if len(sent) == 2 {
			cancel()
		}
		return nil
	}
	_ = l.Run(ctx)
	if len(sent) != 2 || sent[0] != "small" || sent[1] != "ok" || len(tooLarge) != 1 {
		t.Fatalf("sent %q, too large %q", sent, tooLarge)
	}
}

// TestStreamDoesNotStall pushes thousands of 2 KiB messages both ways at
// once over real gRPC: intents broker → edge, reports edge → broker, each
// answered through the control lane. The loop shape this package replaced
// stalled here after 96 messages per side (both sides blocked in Send).
func TestStreamDoesNotStall(t *testing.T) {
	const n, size, window = 5000, 2048, 256
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	payload := string(bytes.Repeat([]byte("x"), size))

	var brokerAcked, edgeAcked atomic.Int64
	serverErr := make(chan error, 1)
	client := dialPair(t, ctx, func(s ferryv1.SyncService_ConnectServer) error {
		wake, ready := NewWake()
		intents := outbox.New[string, *ferryv1.SyncIntent](window, wake)
		for i := range n {
			k := &ferryv1.ObjectKey{Name: payload, Uid: strconv.Itoa(i)}
			intents.Put(k.GetUid(), &ferryv1.SyncIntent{Key: k})
		}
		l := NewLoop[*ferryv1.ConnectRequest, *ferryv1.ConnectResponse](2 * window)
		l.Receiver = Receive(s.Context(), s.Recv, 64)
		l.Send = s.Send
		l.BulkReady = ready
		l.Heartbeat = func(hb *ferryv1.Heartbeat) *ferryv1.ConnectResponse {
			return &ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Heartbeat{Heartbeat: hb}}
		}
		l.Interval, l.DeadAfter = time.Second, 30*time.Second
		l.Bulk = func() (*ferryv1.ConnectResponse, bool) {
			e, ok := intents.Next()
			if !ok {
				return nil, false
			}
			in := proto.Clone(e.Value).(*ferryv1.SyncIntent)
			in.Version = &ferryv1.ObjectVersion{Sequence: e.Seq}
			return &ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_Intent{Intent: in}}, true
		}
		l.Handle = func(m *ferryv1.ConnectRequest) error {
			switch m := m.GetMessage().(type) {
			case *ferryv1.ConnectRequest_IntentResult:
				if _, ok := intents.Ack(m.IntentResult.GetKey().GetUid(), m.IntentResult.GetVersion().GetSequence()); ok {
					brokerAcked.Add(1)
				}
			case *ferryv1.ConnectRequest_StatusReport:
				return l.Control(&ferryv1.ConnectResponse{Message: &ferryv1.ConnectResponse_ReportResult{
					ReportResult: &ferryv1.ReportResult{ReportId: m.StatusReport.GetReportId()}}})
			}
			return nil
		}
		err := l.Run(ctx)
		serverErr <- err
		return err
	})

	wake, ready := NewWake()
	reports := outbox.New[string, *ferryv1.StatusReport](window, wake)
	for i := range n {
		reports.Put(strconv.Itoa(i), &ferryv1.StatusReport{Status: []byte(payload)})
	}
	l := NewLoop[*ferryv1.ConnectResponse, *ferryv1.ConnectRequest](2 * window)
	l.Receiver = Receive(ctx, client.Recv, 64)
	l.Send = client.Send
	l.BulkReady = ready
	l.Heartbeat = func(hb *ferryv1.Heartbeat) *ferryv1.ConnectRequest {
		return &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_Heartbeat{Heartbeat: hb}}
	}
	l.Interval, l.DeadAfter = time.Second, 30*time.Second
	l.Bulk = func() (*ferryv1.ConnectRequest, bool) {
		e, ok := reports.Next()
		if !ok {
			return nil, false
		}
		r := proto.Clone(e.Value).(*ferryv1.StatusReport)
		r.ReportId = e.Seq
		return &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_StatusReport{StatusReport: r}}, true
	}
	loopCtx, stop := context.WithCancel(ctx)
	l.Handle = func(m *ferryv1.ConnectResponse) error {
		switch m := m.GetMessage().(type) {
		case *ferryv1.ConnectResponse_Intent:
			return l.Control(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_IntentResult{IntentResult: &ferryv1.IntentResult{
				Key: m.Intent.GetKey(), Version: m.Intent.GetVersion()}}})
		case *ferryv1.ConnectResponse_ReportResult:
			if _, ok := reports.AckSeq(m.ReportResult.GetReportId()); ok {
				edgeAcked.Add(1)
			}
		}
		if brokerAcked.Load() == n && edgeAcked.Load() == n {
			stop()
		}
		return nil
	}
	err := l.Run(loopCtx)
	if brokerAcked.Load() != n || edgeAcked.Load() != n {
		t.Fatalf("stalled: broker got %d of %d intent results, edge got %d of %d report results (loop: %v)",
			brokerAcked.Load(), n, edgeAcked.Load(), n, err)
	}
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("loop ended with %v", err)
	}
}

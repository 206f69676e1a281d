package link

import (
	"context"
	"errors"
	"io"
	"testing"
	"time"
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
	})
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
	r := Receive(ctx, func() (int, error) { return 7, nil })
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

func TestClockDeadUnlessReceived(t *testing.T) {
	c := NewClock(time.Hour, 500*time.Millisecond)
	defer c.Stop()
	// Keep it alive for a while...
	for i := 0; i < 5; i++ {
		time.Sleep(20 * time.Millisecond)
		c.Received()
		select {
		case <-c.Dead:
			t.Fatal("clock declared the peer dead although messages kept arriving")
		default:
		}
	}
	// ...then stay silent.
	select {
	case <-c.Dead:
	case <-time.After(10 * time.Second):
		t.Fatal("clock never declared a silent peer dead")
	}
}

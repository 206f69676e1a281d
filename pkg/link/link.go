// Package link holds the stream mechanics both ends of the edge ↔ broker
// connection share: a receiver goroutine that turns blocking Recv calls into
// channel messages (so one loop can select over messages, timers and
// shutdown), and the heartbeat/liveness clock.
//
// gRPC allows one goroutine in Recv and one in Send per stream. The receiver
// owns Recv; the caller's loop owns Send.
package link

import (
	"context"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// Receiver delivers messages read from a stream.
type Receiver[T any] struct {
	// C delivers messages in order. Never closed; select on Err too.
	C <-chan T
	// Err delivers the error that ended Recv (io.EOF on a clean close),
	// exactly once.
	Err <-chan error
}

// Receive starts a goroutine calling recv until it fails or ctx ends. The
// goroutine exits when recv returns an error, which gRPC guarantees once the
// stream's context is done; it never blocks on a full channel after ctx ends.
func Receive[T any](ctx context.Context, recv func() (T, error)) Receiver[T] {
	msgs := make(chan T)
	errs := make(chan error, 1)
	go func() {
		for {
			m, err := recv()
			if err != nil {
				errs <- err
				return
			}
			select {
			case msgs <- m:
			case <-ctx.Done():
				errs <- ctx.Err()
				return
			}
		}
	}()
	return Receiver[T]{C: msgs, Err: errs}
}

// Clock paces heartbeats and detects a silent peer. Not safe for concurrent
// use: the stream loop owns it.
type Clock struct {
	// Beat fires every heartbeat interval: time to send a heartbeat.
	Beat <-chan time.Time
	// Dead fires when nothing was received for the dead-after duration.
	Dead <-chan time.Time

	ticker    *time.Ticker
	deadTimer *time.Timer
	deadAfter time.Duration
	beats     uint64
}

// NewClock starts a clock. Call Stop when the stream ends.
func NewClock(interval, deadAfter time.Duration) *Clock {
	t := time.NewTicker(interval)
	d := time.NewTimer(deadAfter)
	return &Clock{Beat: t.C, Dead: d.C, ticker: t, deadTimer: d, deadAfter: deadAfter}
}

// Received records that a message arrived, pushing the dead line back.
func (c *Clock) Received() { c.deadTimer.Reset(c.deadAfter) }

// Heartbeat returns the next heartbeat to send, numbered from 1.
func (c *Clock) Heartbeat() *ferryv1.Heartbeat {
	c.beats++
	return &ferryv1.Heartbeat{SentAt: timestamppb.Now(), Sequence: c.beats}
}

// Stop releases the timers.
func (c *Clock) Stop() {
	c.ticker.Stop()
	c.deadTimer.Stop()
}

// NewWake returns a non-blocking signal and the channel it signals; many
// producers share one, a loop selects on the channel and then drains what
// the producers queued.
func NewWake() (wake func(), ready <-chan struct{}) {
	ch := make(chan struct{}, 1)
	return func() {
		select {
		case ch <- struct{}{}:
		default:
		}
	}, ch
}

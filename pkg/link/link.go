// Package link holds the stream mechanics both ends of the edge ↔ broker
// connection share.
//
// gRPC allows one goroutine in Recv and one in Send per stream. A stream
// that one loop both reads and writes can deadlock: when both peers write
// faster than the other reads, HTTP/2 flow control blocks both Sends and
// neither loop gets back to Recv. Here the directions never wait on each
// other:
//
//   - a receiver goroutine owns Recv and only puts messages into a bounded
//     queue (Receive);
//   - a dispatcher goroutine takes them off that queue and hands them to the
//     engine, which must not block on the network;
//   - a sender goroutine owns Send. Control messages (acks, results,
//     heartbeats) go ahead of bulk traffic, which the sender pulls from the
//     engine's outboxes only when it has nothing more urgent. Bulk traffic is
//     bounded by the outboxes' in-flight windows, so a peer that stops
//     answering slows the sender down instead of blocking it.
package link

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
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

// Receive starts a goroutine calling recv until it fails or ctx ends,
// queueing up to buffer messages. It blocks only on its own queue, which the
// dispatcher drains without ever waiting on a Send. The goroutine exits when
// recv returns an error, which gRPC guarantees once the stream's context is
// done, and never touches the queue after ctx ends.
func Receive[T any](ctx context.Context, recv func() (T, error), buffer int) Receiver[T] {
	msgs := make(chan T, buffer)
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

// ErrControlFull ends a stream whose control queue overflowed: the peer sent
// more than its windows allow, or the stream stopped moving. The message
// that did not fit is lost, so the stream cannot go on: the peer would wait
// for it forever, its window filling while heartbeats still flow. A new
// stream re-sends everything unanswered.
var ErrControlFull = errors.New("control queue full")

// Loop runs an established stream: dispatcher and sender. Fields are set
// before Run; Control may be called from any goroutine.
type Loop[In, Out any] struct {
	// Receiver delivers the peer's messages (started with Receive).
	Receiver Receiver[In]
	// Send sends one message; only the Loop's sender goroutine calls it.
	Send func(Out) error
	// Handle processes one received message on the dispatcher goroutine. It
	// must not block on the network; an error ends the stream.
	Handle func(In) error
	// Bulk returns the next bulk message, or false when there is none (or a
	// window is full). Called on the sender goroutine only.
	Bulk func() (Out, bool)
	// BulkReady is signalled when Bulk may have something new.
	BulkReady <-chan struct{}
	// Heartbeat wraps a heartbeat into an outgoing message.
	Heartbeat func(*ferryv1.Heartbeat) Out
	// Interval is the heartbeat interval; DeadAfter how long silence from
	// the peer is tolerated.
	Interval, DeadAfter time.Duration
	// MaxSend is the largest message the peer accepts (0: no limit); Size
	// measures a message. A bulk message over the limit is not sent:
	// TooLarge is told instead (it must not block).
	MaxSend  int
	Size     func(Out) int
	TooLarge func(m Out, size int)
	// OnReceive, when set, is called for every received message (liveness
	// bookkeeping).
	OnReceive func()

	control chan Out
	// overrun is closed when Control refused a message; Run then ends.
	overrun     chan struct{}
	overrunOnce sync.Once
}

// NewLoop returns a loop whose control queue holds controlCapacity messages.
// The capacity must exceed what the peer's windows allow to be answered at
// once (plus heartbeats): a full queue ends the stream.
func NewLoop[In, Out any](controlCapacity int) *Loop[In, Out] {
	return &Loop[In, Out]{control: make(chan Out, controlCapacity), overrun: make(chan struct{})}
}

// Control queues a message that goes ahead of bulk traffic. It never blocks.
// When the queue is full the message is dropped, Control fails and Run ends
// with ErrControlFull.
func (l *Loop[In, Out]) Control(m Out) error {
	select {
	case l.control <- m:
		return nil
	default:
		l.overrunOnce.Do(func() { close(l.overrun) })
		return l.errControlFull()
	}
}

func (l *Loop[In, Out]) errControlFull() error {
	return fmt.Errorf("%w (%d messages): a message was dropped, the stream ends", ErrControlFull, cap(l.control))
}

// Run runs the dispatcher and the sender until one of them fails or ctx
// ends, and returns when both have stopped. io.EOF from the peer (a clean
// close) is returned as is.
func (l *Loop[In, Out]) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return l.dispatch(ctx) })
	g.Go(func() error { return l.sendLoop(ctx) })
	return g.Wait()
}

func (l *Loop[In, Out]) dispatch(ctx context.Context) error {
	dead := time.NewTimer(l.DeadAfter)
	defer dead.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-l.Receiver.Err:
			return err
		case <-l.overrun:
			return l.errControlFull()
		case m := <-l.Receiver.C:
			dead.Reset(l.DeadAfter)
			if l.OnReceive != nil {
				l.OnReceive()
			}
			if err := l.Handle(m); err != nil {
				return err
			}
		case <-dead.C:
			return fmt.Errorf("%w: nothing received for %s", ErrPeerSilent, l.DeadAfter)
		}
	}
}

// ErrPeerSilent ends a stream whose peer sent nothing, not even heartbeats,
// for too long.
var ErrPeerSilent = errors.New("peer silent")

func (l *Loop[In, Out]) sendLoop(ctx context.Context) error {
	beat := time.NewTicker(l.Interval)
	defer beat.Stop()
	var beats uint64
	for {
		// Control first, always.
		select {
		case <-l.overrun:
			return l.errControlFull()
		case m := <-l.control:
			if err := l.Send(m); err != nil {
				return err
			}
			continue
		default:
		}
		if m, ok := l.nextBulk(); ok {
			if err := l.Send(m); err != nil {
				return err
			}
			continue
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-l.overrun:
			return l.errControlFull()
		case m := <-l.control:
			if err := l.Send(m); err != nil {
				return err
			}
		case <-l.BulkReady:
		case <-beat.C:
			beats++
			hb := &ferryv1.Heartbeat{SentAt: timestamppb.Now(), Sequence: beats}
			if err := l.Send(l.Heartbeat(hb)); err != nil {
				return err
			}
		}
	}
}

// nextBulk returns the next bulk message within the size limit.
func (l *Loop[In, Out]) nextBulk() (Out, bool) {
	for l.Bulk != nil {
		m, ok := l.Bulk()
		if !ok {
			break
		}
		if l.MaxSend > 0 && l.Size != nil {
			if size := l.Size(m); size > l.MaxSend {
				l.TooLarge(m, size)
				continue
			}
		}
		return m, true
	}
	var zero Out
	return zero, false
}

// IsEOF tells whether err is a clean close by the peer.
func IsEOF(err error) bool { return errors.Is(err, io.EOF) }

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

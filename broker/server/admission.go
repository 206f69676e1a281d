package server

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// AdmissionOptions bound the handshakes the broker runs at once. A
// handshake reads kcp (the edge's revocations, its workspace, APIExport and
// endpoint slice) and may start the export's engine (a list and a watch);
// when every edge of a replica reconnects at once (the broker or the
// network came back), unbounded handshakes queue all of that on kcp and on
// the broker's client rate limit together, each waits for all others, and
// edges give up on their BrokerHello after the handshake timeout and dial
// again, adding to the storm. Bounded, the handshakes beyond the limit
// wait a little for a slot and are otherwise refused at once, cheaply,
// with RESOURCE_EXHAUSTED and a retry delay the edge honours.
type AdmissionOptions struct {
	// MaxConcurrent is how many handshakes may run at once; 0 bounds
	// nothing.
	MaxConcurrent int
	// MaxWait is how long a handshake waits for a slot before it is
	// refused; well under protocol.HandshakeTimeout, which the edge waits
	// for its BrokerHello.
	MaxWait time.Duration
	// RetryAfter is the mean retry delay a refused edge is given; each
	// refusal draws one from [RetryAfter/2, RetryAfter·3/2) so that the
	// refused edges do not come back together.
	RetryAfter time.Duration
}

// Defaults of the handshake admission (ferry-broker's flags). 128 at once:
// make bench-edges with 1,000 edges on 2 cores took its reconnect storms
// fastest with it (32 halved the handshake rate: a handshake's kcp reads
// take about a second under such a storm, so few slots idle the broker;
// unbounded, edges gave up on their BrokerHello and dialled again).
const (
	DefaultMaxConcurrentHandshakes = 128
	DefaultHandshakeMaxWait        = 2 * time.Second
	DefaultHandshakeRetryAfter     = 2 * time.Second
)

// admission is a counting semaphore over handshakes; a nil *admission
// admits everything.
type admission struct {
	slots      chan struct{}
	maxWait    time.Duration
	retryAfter time.Duration
	// jitter returns a float in [0,1); tests fix it.
	jitter func() float64
}

func newAdmission(o AdmissionOptions) *admission {
	if o.MaxConcurrent <= 0 {
		return nil
	}
	return &admission{slots: make(chan struct{}, o.MaxConcurrent), maxWait: o.MaxWait, retryAfter: o.RetryAfter, jitter: rand.Float64}
}

// busyError refuses a handshake for want of a slot.
type busyError struct {
	inProgress int
	retryAfter time.Duration
}

func (e *busyError) Error() string {
	return fmt.Sprintf("broker busy: %d handshakes in progress; retry after %s", e.inProgress, e.retryAfter.Round(time.Millisecond))
}

// GRPCStatus is RESOURCE_EXHAUSTED with a RetryInfo detail (the delay the
// edge waits at least before it dials again).
func (e *busyError) GRPCStatus() *status.Status {
	st := status.New(codes.ResourceExhausted, e.Error())
	if d, err := st.WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(e.retryAfter)}); err == nil {
		return d
	}
	return st
}

// acquire waits up to maxWait for a slot and returns its release, or a
// *busyError (ctx's error when the stream ended first).
func (a *admission) acquire(ctx context.Context) (release func(), err error) {
	if a == nil {
		return func() {}, nil
	}
	select {
	case a.slots <- struct{}{}:
		return a.release, nil
	default:
	}
	t := time.NewTimer(a.maxWait)
	defer t.Stop()
	select {
	case a.slots <- struct{}{}:
		return a.release, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-t.C:
		d := time.Duration((0.5 + a.jitter()) * float64(a.retryAfter))
		return nil, &busyError{inProgress: len(a.slots), retryAfter: d}
	}
}

func (a *admission) release() { <-a.slots }

package stream

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

func busy(t *testing.T, retry time.Duration) error {
	t.Helper()
	st, err := status.New(codes.ResourceExhausted, "broker busy").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
	if err != nil {
		t.Fatal(err)
	}
	return st.Err()
}

// TestBrokerDelayHonoursRetryInfo: a busy refusal's retry delay is waited
// at least, up to the backoff cap; everything else keeps the backoff.
func TestBrokerDelayHonoursRetryInfo(t *testing.T) {
	const ceiling = 5 * time.Second
	tests := []struct {
		name    string
		backoff time.Duration
		err     error
		want    time.Duration
	}{
		{name: "busy: the broker's longer delay", backoff: 100 * time.Millisecond, err: busy(t, 2*time.Second), want: 2 * time.Second},
		{name: "busy: the backoff's longer delay", backoff: 3 * time.Second, err: busy(t, time.Second), want: 3 * time.Second},
		{name: "busy: never beyond the cap", backoff: 100 * time.Millisecond, err: busy(t, time.Minute), want: ceiling},
		{name: "resource exhausted without a delay", backoff: 100 * time.Millisecond, err: status.Error(codes.ResourceExhausted, "control queue full"), want: 100 * time.Millisecond},
		{name: "another refusal", backoff: 100 * time.Millisecond, err: status.Error(codes.FailedPrecondition, "held"), want: 100 * time.Millisecond},
		{name: "not a status", backoff: 100 * time.Millisecond, err: errors.New("connection reset"), want: 100 * time.Millisecond},
		{name: "no error", backoff: 100 * time.Millisecond, want: 100 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := brokerDelay(tt.backoff, tt.err, ceiling); got != tt.want {
				t.Errorf("brokerDelay = %v; want %v", got, tt.want)
			}
		})
	}
}

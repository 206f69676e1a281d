package server

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/kcp"
)

// retryDelay is the RetryInfo delay of err's status, or false.
func retryDelay(err error) (time.Duration, bool) {
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return ri.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

func TestAdmission(t *testing.T) {
	tests := []struct {
		name string
		// held slots before the acquire under test; release one after
		// releaseAfter (0: never).
		held         int
		releaseAfter time.Duration
		cancel       bool
		jitter       float64
		wantBusy     bool
		wantCtxErr   bool
		wantRetry    time.Duration
	}{
		{name: "a free slot is taken at once", held: 1},
		{name: "a slot freed while waiting is taken", held: 2, releaseAfter: 20 * time.Millisecond},
		{name: "no slot within the wait: busy, shortest retry", held: 2, jitter: 0, wantBusy: true, wantRetry: 500 * time.Millisecond},
		{name: "no slot within the wait: busy, longest retry", held: 2, jitter: 0.999, wantBusy: true, wantRetry: 1499 * time.Millisecond},
		{name: "the stream ends while waiting", held: 2, cancel: true, wantCtxErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a := newAdmission(AdmissionOptions{MaxConcurrent: 2, MaxWait: 200 * time.Millisecond, RetryAfter: time.Second})
			a.jitter = func() float64 { return tt.jitter }
			var releases []func()
			for range tt.held {
				r, err := a.acquire(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				releases = append(releases, r)
			}
			if tt.releaseAfter > 0 {
				time.AfterFunc(tt.releaseAfter, releases[0])
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if tt.cancel {
				time.AfterFunc(20*time.Millisecond, cancel)
			}
			release, err := a.acquire(ctx)
			var busy *busyError
			switch {
			case tt.wantBusy:
				if !errors.As(err, &busy) {
					t.Fatalf("err = %v; want busy", err)
				}
				st := busy.GRPCStatus()
				if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "2 handshakes in progress") {
					t.Errorf("status = %v %q", st.Code(), st.Message())
				}
				got, ok := retryDelay(st.Err())
				if !ok || got.Round(time.Millisecond) != tt.wantRetry {
					t.Errorf("retry delay = %v (%v); want %v", got, ok, tt.wantRetry)
				}
			case tt.wantCtxErr:
				if !errors.Is(err, context.Canceled) {
					t.Fatalf("err = %v; want the context's", err)
				}
			default:
				if err != nil {
					t.Fatal(err)
				}
				release()
			}
		})
	}
}

func TestNilAdmissionAdmitsAll(t *testing.T) {
	a := newAdmission(AdmissionOptions{})
	if a != nil {
		t.Fatalf("admission without a limit = %v; want nil", a)
	}
	for range 100 {
		if _, err := a.acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// gatedResolver holds every Resolve until gate is closed; entered learns
// each one that started.
type gatedResolver struct {
	fakeResolver
	entered chan struct{}
	gate    chan struct{}
}

func (g gatedResolver) Resolve(ctx context.Context, ref config.APIExportRef) (kcp.ExportState, error) {
	g.entered <- struct{}{}
	select {
	case <-g.gate:
	case <-ctx.Done():
		return kcp.ExportState{}, ctx.Err()
	}
	return g.fakeResolver.Resolve(ctx, ref)
}

// TestConnectBusyWhileHandshakesAreFull: with one handshake slot, an edge
// whose handshake is in progress (reading kcp) makes another edge's
// handshake wait and then be refused as busy, with a retry delay; once the
// first handshake is done (its BrokerHello sent, the stream running), the
// slot is free again and the other edge is accepted.
func TestConnectBusyWhileHandshakesAreFull(t *testing.T) {
	states := map[config.APIExportRef]kcp.ExportState{exportA: {LogicalCluster: "abc"}, exportB: {LogicalCluster: "def"}}
	resolver := gatedResolver{fakeResolver: fakeResolver{states: states}, entered: make(chan struct{}, 4), gate: make(chan struct{})}
	tb := startTestBrokerWith(t, resolver, &echoApplier{}, func(o *Options, _ string) {
		o.Admission = AdmissionOptions{MaxConcurrent: 1, MaxWait: 100 * time.Millisecond, RetryAfter: time.Second}
	})

	first := make(chan error, 1)
	go func() {
		_, resp, err := connect(t, tb.dial(t, "edge-a"), helloRequest(validHello()))
		if err == nil && resp.GetHello() == nil {
			err = errors.New("first answer is not a BrokerHello")
		}
		first <- err
	}()
	<-resolver.entered // edge-a holds the slot

	_, _, err := connect(t, tb.dial(t, "edge-b"), helloRequest(validHello()))
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted || !strings.Contains(st.Message(), "broker busy") {
		t.Fatalf("second edge got %v %q; want RESOURCE_EXHAUSTED, busy", st.Code(), st.Message())
	}
	if d, ok := retryDelay(err); !ok || d < 500*time.Millisecond || d >= 1500*time.Millisecond {
		t.Errorf("retry delay %v (%v); want within [0.5s, 1.5s)", d, ok)
	}

	close(resolver.gate)
	if err := <-first; err != nil {
		t.Fatalf("first edge: %v", err)
	}
	// edge-a's stream still runs; its handshake's slot is free.
	_, resp, err := connect(t, tb.dial(t, "edge-b"), helloRequest(validHello()))
	if err != nil || resp.GetHello() == nil {
		t.Fatalf("second edge after the first handshake: %v, %v", resp, err)
	}
}

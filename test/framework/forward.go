package framework

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
)

// Forwarder relays every connection accepted on a listener to a target the
// dial function reaches. Tests put it between an edge and the broker to cut
// the connection on purpose (Sever), as a middlebox or a network blip would,
// and to give a process one way out of a network namespace.
type Forwarder struct {
	lis  net.Listener
	dial func(ctx context.Context) (net.Conn, error)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns map[net.Conn]struct{}
	// accepted counts the connections relayed so far.
	accepted atomic.Int64
}

// ForwardTCP relays connections to target from a new listener on a free
// loopback port.
func ForwardTCP(target string) (*Forwarder, error) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	return Forward(lis, func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "tcp", target) }), nil
}

// Forward relays every connection accepted on lis to a connection from
// dial, until Close.
func Forward(lis net.Listener, dial func(ctx context.Context) (net.Conn, error)) *Forwarder {
	ctx, cancel := context.WithCancel(context.Background())
	f := &Forwarder{lis: lis, dial: dial, ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{}}
	f.wg.Add(1)
	go f.accept()
	return f
}

// Addr is the listener's address.
func (f *Forwarder) Addr() string { return f.lis.Addr().String() }

// Accepted is the number of connections relayed so far.
func (f *Forwarder) Accepted() int64 { return f.accepted.Load() }

// Sever closes every relayed connection (both halves) and returns how many
// it closed; new connections are still accepted.
func (f *Forwarder) Sever() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	for c := range f.conns {
		_ = c.Close()
	}
	n := len(f.conns) / 2
	clear(f.conns)
	return n
}

// Close stops accepting, severs every connection and waits for the relays.
func (f *Forwarder) Close() error {
	f.cancel()
	err := f.lis.Close()
	f.Sever()
	f.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

func (f *Forwarder) accept() {
	defer f.wg.Done()
	for {
		in, err := f.lis.Accept()
		if err != nil {
			return
		}
		f.accepted.Add(1)
		f.wg.Add(1)
		go f.relay(in)
	}
}

func (f *Forwarder) relay(in net.Conn) {
	defer f.wg.Done()
	out, err := f.dial(f.ctx)
	if err != nil {
		_ = in.Close()
		return
	}
	if !f.track(in, out) {
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// Half-close where the connection allows it, so a side's EOF
		// reaches the other; Sever/Close close both halves for good.
		if tc, ok := dst.(interface{ CloseWrite() error }); ok {
			_ = tc.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(out, in)
	go pipe(in, out)
	<-done
	<-done
	f.untrack(in, out)
}

func (f *Forwarder) track(conns ...net.Conn) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ctx.Err() != nil {
		for _, c := range conns {
			_ = c.Close()
		}
		return false
	}
	for _, c := range conns {
		f.conns[c] = struct{}{}
	}
	return true
}

func (f *Forwarder) untrack(conns ...net.Conn) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, c := range conns {
		_ = c.Close()
		delete(f.conns, c)
	}
}

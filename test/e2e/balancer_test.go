package e2e

import (
	"context"
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// balancer stands in for the Service in front of broker replicas: it
// accepts TCP connections and hands each to the next backend in turn that
// accepts one (a dead replica is skipped, as a Service skips a pod that is
// not ready), copying bytes both ways; TLS passes through untouched.
type balancer struct {
	addr     string
	backends []string

	mu   sync.Mutex
	next int
}

func startBalancer(t testing.TB, backends ...string) *balancer {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &balancer{addr: lis.Addr().String(), backends: backends}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		_ = lis.Close()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			conn, err := lis.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { b.serve(ctx, conn) })
		}
	})
	return b
}

func (b *balancer) serve(ctx context.Context, client net.Conn) {
	defer client.Close()
	b.mu.Lock()
	first := b.next
	b.next = (b.next + 1) % len(b.backends)
	b.mu.Unlock()
	var backend net.Conn
	for i := range b.backends {
		d := net.Dialer{Timeout: time.Second}
		c, err := d.DialContext(ctx, "tcp", b.backends[(first+i)%len(b.backends)])
		if err == nil {
			backend = c
			break
		}
	}
	if backend == nil {
		return
	}
	defer backend.Close()
	stop := context.AfterFunc(ctx, func() {
		_ = client.Close()
		_ = backend.Close()
	})
	defer stop()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(backend, client); done <- struct{}{} }()
	go func() { _, _ = io.Copy(client, backend); done <- struct{}{} }()
	<-done
}

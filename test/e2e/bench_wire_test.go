package e2e

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// wireProxy sits between the edge and the broker and counts the bytes that
// cross it both ways (TLS records and all: what the hop costs on the
// wire). Each connection is forwarded to the broker's address, so a
// restarted broker is reached again.
type wireProxy struct {
	lis   net.Listener
	bytes atomic.Int64
	wg    sync.WaitGroup
}

// startWireProxy forwards a loopback port to target until the test ends.
func startWireProxy(tb testing.TB, target string) *wireProxy {
	tb.Helper()
	lis, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &wireProxy{lis: lis}
	p.wg.Go(func() {
		for {
			in, err := lis.Accept()
			if err != nil {
				return // closed
			}
			p.wg.Go(func() { p.forward(in, target) })
		}
	})
	tb.Cleanup(func() {
		_ = lis.Close()
		p.wg.Wait()
	})
	return p
}

// address is what the edge dials.
func (p *wireProxy) address() string { return p.lis.Addr().String() }

// total is the number of bytes forwarded so far, both directions.
func (p *wireProxy) total() int64 {
	if p == nil {
		return 0
	}
	return p.bytes.Load()
}

func (p *wireProxy) forward(in net.Conn, target string) {
	defer in.Close()
	out, err := (&net.Dialer{}).DialContext(context.Background(), "tcp", target)
	if err != nil {
		return
	}
	defer out.Close()
	var wg sync.WaitGroup
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(countingWriter{dst, &p.bytes}, src)
		// One side ended: end the other too (a killed broker or edge).
		_ = dst.Close()
		_ = src.Close()
	}
	wg.Go(func() { pipe(out, in) })
	wg.Go(func() { pipe(in, out) })
	wg.Wait()
}

// countingWriter counts what it writes as it goes: the streams live for
// the whole bench, and each phase reads the count.
type countingWriter struct {
	w io.Writer
	n *atomic.Int64
}

func (c countingWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n.Add(int64(n))
	return n, err
}

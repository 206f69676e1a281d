package framework

import (
	"bufio"
	"net"
	"testing"
	"time"
)

// TestForwarderRelaysAndSevers: bytes cross both ways; Sever ends the live
// connection, and the next one is relayed again.
func TestForwarderRelaysAndSevers(t *testing.T) {
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					_, _ = c.Write([]byte(line))
				}
			}()
		}
	}()
	f, err := ForwardTCP(echo.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()

	roundTrip := func(c net.Conn) error {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := c.Write([]byte("ping\n")); err != nil {
			return err
		}
		got, err := bufio.NewReader(c).ReadString('\n')
		if err == nil && got != "ping\n" {
			t.Fatalf("echo %q", got)
		}
		return err
	}
	c, err := net.Dial("tcp", f.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := roundTrip(c); err != nil {
		t.Fatal(err)
	}
	if n := f.Sever(); n != 1 {
		t.Errorf("Sever closed %d connections, want 1", n)
	}
	if err := roundTrip(c); err == nil {
		t.Fatal("a severed connection still relays")
	}
	c2, err := net.Dial("tcp", f.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if err := roundTrip(c2); err != nil {
		t.Fatalf("after Sever: %v", err)
	}
	if f.Accepted() != 2 {
		t.Errorf("accepted %d, want 2", f.Accepted())
	}
}

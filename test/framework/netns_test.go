package framework

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// echoServer accepts connections on l and echoes one line back on each,
// prefixed with tag.
func echoServer(t *testing.T, l net.Listener, tag string) {
	t.Helper()
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, err := bufio.NewReader(c).ReadString('\n')
				if err != nil {
					return
				}
				_, _ = io.WriteString(c, tag+": "+line)
			}()
		}
	}()
}

// roundTrip sends one line over c and returns the answer.
func roundTrip(t *testing.T, c net.Conn, line string) string {
	t.Helper()
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		t.Fatal(err)
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("no answer through %s: %v", c.RemoteAddr(), err)
	}
	return strings.TrimSuffix(got, "\n")
}

func TestNetNS(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root; CI runs the tests as root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns, err := NewNetNS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := ns.Close(); err != nil {
			t.Error(err)
		}
	}()

	// Nothing but loopback inside.
	ifs, err := ns.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	if len(ifs) != 1 || ifs[0].Name != "lo" || ifs[0].Flags&net.FlagUp == 0 {
		t.Errorf("interfaces in the namespace: %+v, want lo (up) alone", ifs)
	}

	// Two servers on the host: the gateway's target and another one.
	target, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	echoServer(t, target, "target")
	other, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	echoServer(t, other, "other")

	gw, err := ns.Gateway(target.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := ns.DialContext(ctx, gw)
	if err != nil {
		t.Fatalf("dialing the gateway %s from inside: %v", gw, err)
	}
	if got := roundTrip(t, c, "hello"); got != "target: hello" {
		t.Errorf("through the gateway: %q, want %q", got, "target: hello")
	}
	// The host's servers are not reachable directly from inside.
	for _, addr := range []string{target.Addr().String(), other.Addr().String()} {
		if c, err := ns.DialContext(ctx, addr); err == nil {
			c.Close()
			t.Errorf("dialing host address %s from inside the namespace succeeded", addr)
		}
	}
	// A server inside: the test reaches it through Forward, not directly.
	inside, err := ns.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	echoServer(t, inside, "inside")
	fwd, err := ns.Forward(inside.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err = net.Dial("tcp", fwd)
	if err != nil {
		t.Fatal(err)
	}
	if got := roundTrip(t, c, "hi"); got != "inside: hi" {
		t.Errorf("through the forward: %q, want %q", got, "inside: hi")
	}
	if c, err := net.Dial("tcp", inside.Addr().String()); err == nil {
		c.Close()
		t.Errorf("the namespace's listener %s is reachable from the host", inside.Addr())
	}

	// A process started in the namespace is in it, and sees its interfaces
	// only.
	sleeper, err := ns.StartProcess("sleeper", "/bin/sleep", []string{"60"}, nil, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer sleeper.Kill()
	waitFor := time.Now().Add(10 * time.Second)
	for {
		in, err := ns.Holds(sleeper.Pid())
		if err == nil && in {
			break
		}
		// Until ip has entered the namespace and exec'd sleep.
		if time.Now().After(waitFor) {
			t.Fatalf("Holds(a process started in the namespace) = %t, %v; want true", in, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	p, err := ns.StartProcess("netdev", "/bin/cat", []string{"/proc/self/net/dev"}, nil, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	<-p.Exited()
	if in, err := ns.Holds(os.Getpid()); err != nil || in {
		t.Errorf("Holds(the test process) = %t, %v; want false", in, err)
	}
	if err := p.ExitErr(); err != nil {
		t.Fatalf("cat in the namespace: %v", err)
	}
	out, err := p.Log()
	if err != nil {
		t.Fatal(err)
	}
	var devs []string
	for _, line := range strings.Split(string(out), "\n") {
		if name, _, ok := strings.Cut(line, ":"); ok && !strings.Contains(line, "|") && !strings.HasPrefix(line, "===") {
			devs = append(devs, strings.TrimSpace(name))
		}
	}
	if len(devs) != 1 || devs[0] != "lo" {
		t.Errorf("a process in the namespace sees devices %q, want lo alone:\n%s", devs, out)
	}

	// Close ends the gateway and removes the namespace.
	if err := ns.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(netnsDir, ns.Name)); !os.IsNotExist(err) {
		t.Errorf("namespace %s still exists after Close: %v", ns.Name, err)
	}
	if c, err := net.Dial("tcp", fwd); err == nil {
		c.Close()
		t.Errorf("the forward %s still accepts after Close", fwd)
	}
}

func TestNetNSRemovesOrphans(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root; CI runs the tests as root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// A pid that no longer runs: a child that has exited and been reaped.
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	orphan := fmt.Sprintf("%s%d-orphan", netnsPrefix, dead.Process.Pid)
	// One whose creator runs: this test process.
	alive := fmt.Sprintf("%s%d-alive", netnsPrefix, os.Getpid())
	for _, name := range []string{orphan, alive} {
		if out, err := exec.CommandContext(ctx, "ip", "netns", "add", name).CombinedOutput(); err != nil {
			t.Fatalf("ip netns add %s: %v: %s", name, err, out)
		}
	}
	defer func() {
		for _, name := range []string{orphan, alive} {
			if _, err := os.Stat(filepath.Join(netnsDir, name)); err == nil {
				_ = exec.Command("ip", "netns", "delete", name).Run()
			}
		}
	}()

	ns, err := NewNetNS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if _, err := os.Stat(filepath.Join(netnsDir, orphan)); !os.IsNotExist(err) {
		t.Errorf("orphaned namespace %s survived NewNetNS: %v", orphan, err)
	}
	if _, err := os.Stat(filepath.Join(netnsDir, alive)); err != nil {
		t.Errorf("namespace %s of a running process was removed: %v", alive, err)
	}
}

package framework

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// NetNS is a network namespace the test made, as a firewall without packet
// filtering: it has a loopback interface and nothing else (no veth, no
// routes), so a process inside can reach only what listens on the
// namespace's own loopback. The test harness opens the holes itself:
// Gateway accepts connections inside the namespace and forwards each to one
// address of the host, and Forward lets the test's own clients reach a
// server inside.
//
// Making one needs root (CAP_SYS_ADMIN) and the `ip` program.
type NetNS struct {
	// Name is the namespace's name for `ip netns`.
	Name string
	// path is the namespace's bind mount, what setns(2) opens.
	path  string
	ipBin string

	mu     sync.Mutex
	closed bool
	// relays are the gateway and the forwards.
	relays []*Forwarder
}

// netnsPrefix starts the names of the namespaces NewNetNS makes; the
// creating process's pid follows.
const netnsPrefix = "ferry-e2e-"

// netnsDir is where `ip netns` keeps its namespaces' bind mounts.
const netnsDir = "/var/run/netns"

// NewNetNS creates a network namespace named ferry-e2e-<pid>-<random> with
// its loopback interface up. Close removes it. Namespaces that an earlier
// test process left behind (killed by a timeout before its cleanups ran)
// are removed first: those whose creating process is gone.
func NewNetNS(ctx context.Context) (*NetNS, error) {
	ipBin, err := exec.LookPath("ip")
	if err != nil {
		return nil, fmt.Errorf("network namespaces need the ip program: %w", err)
	}
	suffix := make([]byte, 4)
	if _, err := rand.Read(suffix); err != nil {
		return nil, err
	}
	n := &NetNS{
		Name:  fmt.Sprintf("%s%d-%s", netnsPrefix, os.Getpid(), hex.EncodeToString(suffix)),
		ipBin: ipBin,
	}
	n.path = filepath.Join(netnsDir, n.Name)
	if err := n.removeOrphans(ctx); err != nil {
		return nil, err
	}
	if err := n.ip(ctx, "netns", "add", n.Name); err != nil {
		return nil, err
	}
	if err := n.ip(ctx, "-n", n.Name, "link", "set", "lo", "up"); err != nil {
		return nil, errors.Join(err, n.ip(context.Background(), "netns", "delete", n.Name))
	}
	return n, nil
}

// removeOrphans deletes the namespaces named by NewNetNS whose creating
// process no longer runs.
func (n *NetNS) removeOrphans(ctx context.Context) error {
	entries, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), netnsPrefix)
		if !ok {
			continue
		}
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil {
			continue // not named by NewNetNS
		}
		if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); !errors.Is(err, os.ErrNotExist) {
			continue // its creator still runs (or cannot be told)
		}
		if err := n.ip(ctx, "netns", "delete", e.Name()); err != nil {
			return fmt.Errorf("removing orphaned network namespace: %w", err)
		}
	}
	return nil
}

func (n *NetNS) ip(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, n.ipBin, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %q: %w: %s", args, err, out)
	}
	return nil
}

// Do runs fn on an OS thread that has entered the namespace. Sockets that
// fn creates belong to the namespace for their whole life, also once used
// from other threads; fn must create them itself, not in goroutines it
// starts (those run on other threads, outside the namespace).
func (n *NetNS) Do(fn func() error) error {
	errc := make(chan error, 1)
	// A goroutine of its own: when the thread cannot return to the host's
	// namespace, the goroutine ends still locked to it, and the Go runtime
	// then throws the thread away instead of reusing it elsewhere.
	go func() {
		runtime.LockOSThread()
		orig, err := unix.Open("/proc/thread-self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("cannot open this thread's network namespace: %w", err)
			return
		}
		defer unix.Close(orig)
		target, err := unix.Open(n.path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("cannot open network namespace %s: %w", n.Name, err)
			return
		}
		defer unix.Close(target)
		if err := unix.Setns(target, unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			errc <- fmt.Errorf("cannot enter network namespace %s: %w", n.Name, err)
			return
		}
		fnErr := fn()
		if err := unix.Setns(orig, unix.CLONE_NEWNET); err != nil {
			errc <- errors.Join(fnErr, fmt.Errorf("cannot leave network namespace %s (the thread is discarded): %w", n.Name, err))
			return
		}
		runtime.UnlockOSThread()
		errc <- fnErr
	}()
	return <-errc
}

// Listen listens on addr (host:port; port 0 picks one) inside the
// namespace.
func (n *NetNS) Listen(addr string) (net.Listener, error) {
	var l net.Listener
	err := n.Do(func() error {
		var err error
		l, err = net.Listen("tcp", addr)
		return err
	})
	return l, err
}

// DialContext opens a TCP connection from inside the namespace to addr, an
// IP literal with port (a name would be resolved in goroutines of the
// resolver, outside the namespace).
func (n *NetNS) DialContext(ctx context.Context, addr string) (net.Conn, error) {
	var c net.Conn
	err := n.Do(func() error {
		var err error
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}

// Interfaces lists the network interfaces inside the namespace.
func (n *NetNS) Interfaces() ([]net.Interface, error) {
	var ifs []net.Interface
	err := n.Do(func() error {
		var err error
		ifs, err = net.Interfaces()
		return err
	})
	return ifs, err
}

// Holds tells whether the process pid is in the namespace (both name the
// same namespace inode).
func (n *NetNS) Holds(pid int) (bool, error) {
	var want, got unix.Stat_t
	if err := unix.Stat(n.path, &want); err != nil {
		return false, fmt.Errorf("network namespace %s: %w", n.Name, err)
	}
	if err := unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &got); err != nil {
		return false, fmt.Errorf("network namespace of process %d: %w", pid, err)
	}
	return want.Dev == got.Dev && want.Ino == got.Ino, nil
}

// Gateway is the namespace's one way out: it listens on 127.0.0.1 inside
// the namespace and forwards every connection to target, an address the
// host can reach (the broker's port, or a proxy). It returns the address to
// use inside the namespace. It lives until Close.
func (n *NetNS) Gateway(target string) (string, error) {
	l, err := n.Listen("127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("gateway in %s: %w", n.Name, err)
	}
	var d net.Dialer
	if err := n.serve(l, func(ctx context.Context) (net.Conn, error) { return d.DialContext(ctx, "tcp", target) }); err != nil {
		return "", err
	}
	return l.Addr().String(), nil
}

// Forward lets the test process reach addr inside the namespace (a server
// running there): it listens on 127.0.0.1 of the host and forwards every
// connection into the namespace. It returns the host address. Processes in
// the namespace cannot use it; it is for the test's own clients. It lives
// until Close.
func (n *NetNS) Forward(addr string) (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("forward to %s in %s: %w", addr, n.Name, err)
	}
	if err := n.serve(l, func(ctx context.Context) (net.Conn, error) { return n.DialContext(ctx, addr) }); err != nil {
		return "", err
	}
	return l.Addr().String(), nil
}

// serve relays every connection accepted on l to a connection from dial,
// until Close.
func (n *NetNS) serve(l net.Listener, dial func(context.Context) (net.Conn, error)) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		l.Close()
		return fmt.Errorf("network namespace %s is closed", n.Name)
	}
	n.relays = append(n.relays, Forward(l, dial))
	return nil
}

// Command returns the command line that runs bin with args inside the
// namespace.
func (n *NetNS) Command(bin string, args ...string) (string, []string) {
	return n.ipBin, append([]string{"netns", "exec", n.Name, bin}, args...)
}

// StartProcess is the package's StartProcess with the process inside the
// namespace (through `ip netns exec`, which execs bin in place: the process
// keeps its pid, process group and parent-death signal).
func (n *NetNS) StartProcess(name, bin string, args []string, env []string, logDir string) (*Process, error) {
	cmdBin, cmdArgs := n.Command(bin, args...)
	return StartProcess(name, cmdBin, cmdArgs, env, logDir)
}

// Close stops the gateway and forwards, closes their connections and
// deletes the namespace. Processes still running inside keep it alive
// until they exit: stop them first.
func (n *NetNS) Close() error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.closed = true
	relays := n.relays
	n.mu.Unlock()
	for _, r := range relays {
		_ = r.Close()
	}
	if _, err := os.Stat(n.path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	return n.ip(context.Background(), "netns", "delete", n.Name)
}

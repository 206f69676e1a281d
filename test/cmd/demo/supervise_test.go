package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ferry-dev/ferry/test/framework"
)

// lockedBuffer is the supervisor's output, read by the test while the
// supervisor writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// waitOutput waits until the output matches re and returns the submatches
// of its first match.
func waitOutput(t *testing.T, out *lockedBuffer, re *regexp.Regexp, timeout time.Duration) []string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if m := re.FindStringSubmatch(out.String()); m != nil {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("no line matching %q within %s; output:\n%s", re, timeout, out.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// processStarter starts `sh -c script` as a fake ferry process and counts
// the starts.
type processStarter struct {
	t      *testing.T
	script string
	logDir string

	mu     sync.Mutex
	starts []time.Time
	procs  []*framework.Process
}

func newProcessStarter(t *testing.T, script string) *processStarter {
	return &processStarter{t: t, script: script, logDir: t.TempDir()}
}

func (p *processStarter) start(context.Context) (child, error) {
	proc, err := framework.StartProcess("fake", "/bin/sh", []string{"-c", p.script}, nil, p.logDir)
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	p.starts = append(p.starts, time.Now())
	p.procs = append(p.procs, proc)
	p.mu.Unlock()
	return proc, nil
}

func (p *processStarter) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.starts)
}

// cleanup kills every process the starter started (a failed test leaves
// none behind).
func (p *processStarter) cleanup() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, proc := range p.procs {
		proc.Kill()
	}
}

func testSupervisor(out *lockedBuffer, start func(context.Context) (child, error)) *supervisor {
	s := newSupervisor("fake", start, out)
	s.initialDelay, s.maxDelay, s.stableAfter, s.stopGrace = 100*time.Millisecond, time.Second, 10*time.Second, 5*time.Second
	return s
}

func alive(pid int) bool {
	return !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

func TestSupervisorRestartsAKilledChild(t *testing.T) {
	out := &lockedBuffer{}
	starter := newProcessStarter(t, "exec sleep 30")
	t.Cleanup(starter.cleanup)
	s := testSupervisor(out, starter.start)
	s.pidFile = t.TempDir() + "/fake.pid"
	first, err := starter.start(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	stop := s.supervise(t.Context(), first)
	if s.Pid() != first.Pid() {
		t.Fatalf("Pid() = %d, want %d", s.Pid(), first.Pid())
	}
	if data, err := os.ReadFile(s.pidFile); err != nil || string(data) != strconv.Itoa(first.Pid())+"\n" {
		t.Fatalf("pid file holds %q (%v), want %d", data, err, first.Pid())
	}

	killed := time.Now()
	if err := syscall.Kill(first.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitOutput(t, out, regexp.MustCompile(`==> fake \(pid `+strconv.Itoa(first.Pid())+`\) was killed by signal: killed after \S+; restarting in 100ms\n`), 5*time.Second)
	m := waitOutput(t, out, regexp.MustCompile(`==> fake restarted \(pid (\d+)\)\n`), 5*time.Second)
	pid, _ := strconv.Atoi(m[1])
	if pid == first.Pid() || !alive(pid) {
		t.Fatalf("restarted pid %d: want a new, running process", pid)
	}
	starter.mu.Lock()
	restartedAfter := starter.starts[1].Sub(killed)
	starter.mu.Unlock()
	if restartedAfter < s.initialDelay {
		t.Errorf("restarted %s after the kill, before the delay of %s", restartedAfter, s.initialDelay)
	}
	if s.Pid() != pid {
		t.Errorf("Pid() = %d, want %d", s.Pid(), pid)
	}
	if data, _ := os.ReadFile(s.pidFile); string(data) != m[1]+"\n" {
		t.Errorf("pid file holds %q, want %s", data, m[1])
	}

	// Stopping (Ctrl-C) stops the running process with SIGTERM and
	// starts nothing.
	if err := stop(); err != nil {
		t.Errorf("stop: %v", err)
	}
	if alive(pid) {
		t.Errorf("process %d still runs after stop", pid)
	}
	if n := starter.count(); n != 2 {
		t.Errorf("%d starts, want 2", n)
	}
	if _, err := os.Stat(s.pidFile); !os.IsNotExist(err) {
		t.Errorf("pid file left behind: %v", err)
	}
}

func TestSupervisorDoesNotRestartWhileStopping(t *testing.T) {
	for _, tc := range []struct {
		name string
		// end cancels the context and kills the child, in some order.
		end func(t *testing.T, out *lockedBuffer, cancel context.CancelFunc, pid int)
	}{
		{"cancelled then killed", func(_ *testing.T, _ *lockedBuffer, cancel context.CancelFunc, pid int) {
			cancel()
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}},
		{"killed then cancelled", func(_ *testing.T, _ *lockedBuffer, cancel context.CancelFunc, pid int) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			cancel()
		}},
		{"killed, cancelled during the delay", func(t *testing.T, out *lockedBuffer, cancel context.CancelFunc, pid int) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			// In the delay for sure: the supervisor announced the restart.
			waitOutput(t, out, regexp.MustCompile(`restarting in`), 5*time.Second)
			cancel()
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out := &lockedBuffer{}
			starter := newProcessStarter(t, "exec sleep 30")
			t.Cleanup(starter.cleanup)
			s := testSupervisor(out, starter.start)
			first, err := starter.start(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- s.run(ctx, first) }()
			tc.end(t, out, cancel, first.Pid())
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("run did not return after the context ended")
			}
			// Longer than the restart delay: a restart would have happened.
			time.Sleep(2 * s.initialDelay)
			if n := starter.count(); n != 1 {
				t.Errorf("%d starts, want 1 (no restart); output:\n%s", n, out.String())
			}
			if strings.Contains(out.String(), "restarted") {
				t.Errorf("restarted while stopping; output:\n%s", out.String())
			}
		})
	}
}

func TestSupervisorBacksOffAFastCrashLoop(t *testing.T) {
	out := &lockedBuffer{}
	starter := newProcessStarter(t, "exit 3")
	t.Cleanup(starter.cleanup)
	s := testSupervisor(out, starter.start)
	s.initialDelay, s.maxDelay = 20*time.Millisecond, 80*time.Millisecond
	first, err := starter.start(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	stop := s.supervise(t.Context(), first)
	re := regexp.MustCompile(`==> fake \(pid \d+\) exited with status 3 after \S+; restarting in (\S+)\n`)
	waitOutput(t, out, regexp.MustCompile(`(?s)(restarting in.*){5}`), 5*time.Second)
	if err := stop(); err != nil {
		t.Errorf("stop: %v", err)
	}
	var delays []string
	for _, m := range re.FindAllStringSubmatch(out.String(), -1) {
		delays = append(delays, m[1])
	}
	want := []string{"20ms", "40ms", "80ms", "80ms", "80ms"}
	if len(delays) < len(want) || strings.Join(delays[:len(want)], " ") != strings.Join(want, " ") {
		t.Errorf("delays %v, want %v first; output:\n%s", delays, want, out.String())
	}
}

func TestSupervisorResetsTheDelayAfterAStableRun(t *testing.T) {
	out := &lockedBuffer{}
	// Each run lasts longer than stableAfter, so every exit is a first one.
	starter := newProcessStarter(t, "sleep 0.15; exit 1")
	t.Cleanup(starter.cleanup)
	s := testSupervisor(out, starter.start)
	s.initialDelay, s.maxDelay, s.stableAfter = 20*time.Millisecond, time.Second, 100*time.Millisecond
	first, err := starter.start(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	stop := s.supervise(t.Context(), first)
	waitOutput(t, out, regexp.MustCompile(`(?s)(restarting in.*){3}`), 5*time.Second)
	if err := stop(); err != nil {
		t.Errorf("stop: %v", err)
	}
	for _, m := range regexp.MustCompile(`restarting in (\S+)\n`).FindAllStringSubmatch(out.String(), -1) {
		if m[1] != "20ms" {
			t.Errorf("delay %s after a stable run, want 20ms; output:\n%s", m[1], out.String())
		}
	}
}

// fakeChild is a child that exits when told to.
type fakeChild struct {
	pid    int
	exited chan struct{}
}

func (c *fakeChild) Pid() int                 { return c.pid }
func (c *fakeChild) Exited() <-chan struct{}  { return c.exited }
func (c *fakeChild) ExitErr() error           { return errors.New("boom") }
func (c *fakeChild) Stop(time.Duration) error { return nil }

func TestSupervisorRetriesAFailedStart(t *testing.T) {
	out := &lockedBuffer{}
	var mu sync.Mutex
	attempts := 0
	started := make(chan *fakeChild, 1)
	s := testSupervisor(out, func(context.Context) (child, error) {
		mu.Lock()
		defer mu.Unlock()
		attempts++
		if attempts < 3 {
			return nil, errors.New("port in use")
		}
		c := &fakeChild{pid: 1000 + attempts, exited: make(chan struct{})}
		started <- c
		return c, nil
	})
	s.initialDelay = 10 * time.Millisecond
	first := &fakeChild{pid: 1000, exited: make(chan struct{})}
	stop := s.supervise(t.Context(), first)
	close(first.exited)
	c := <-started
	// The start function hands the child over before the supervisor takes
	// it on: wait for that, not for the scheduler.
	for deadline := time.Now().Add(5 * time.Second); s.Pid() != c.pid && time.Now().Before(deadline); {
		time.Sleep(time.Millisecond)
	}
	if err := stop(); err != nil {
		t.Errorf("stop: %v", err)
	}
	want := "==> fake (pid 1000) exited: boom after 0s; restarting in 10ms\n" +
		"==> fake could not be restarted: port in use; retrying in 20ms\n" +
		"==> fake could not be restarted: port in use; retrying in 40ms\n" +
		"==> fake restarted (pid 1003)\n"
	if got := regexp.MustCompile(`after \S+;`).ReplaceAllString(out.String(), "after 0s;"); got != want {
		t.Errorf("output:\n%s\nwant:\n%s", got, want)
	}
	if c.pid != 1003 || s.Pid() != 1003 {
		t.Errorf("running pid %d (Pid() %d), want 1003", c.pid, s.Pid())
	}
}

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// child is what a supervisor needs of a running process;
// *framework.Process and *framework.Broker have it.
type child interface {
	Pid() int
	Exited() <-chan struct{}
	ExitErr() error
	// Stop sends SIGTERM, SIGKILL after grace, and waits for the exit.
	Stop(grace time.Duration) error
}

// supervisor keeps one ferry process running the way a kubelet keeps a
// container of a restartPolicy: Always pod running: a process that exits
// for any reason while the demo runs is started again after a delay. The
// delay starts at initialDelay and doubles, up to maxDelay, for every exit
// (or failed start) that follows a short run; a run of at least stableAfter
// resets it (kubelet: 10 s doubling to 5 min, reset after 10 min; the demo
// is impatient).
type supervisor struct {
	// name is the program's name in the lines the supervisor prints.
	name string
	// start starts the process again (the first one is started by the
	// caller, which wants its errors to stop the demo).
	start func(ctx context.Context) (child, error)
	// out receives one line per exit, restart and failed start.
	out io.Writer
	// pidFile, when set, holds the pid of the running process; it is
	// rewritten on every start and removed when run returns.
	pidFile string

	initialDelay, maxDelay, stableAfter time.Duration
	// stopGrace is how long a process may take to exit on SIGTERM when
	// the demo stops.
	stopGrace time.Duration

	mu  sync.Mutex
	pid int
}

func newSupervisor(name string, start func(ctx context.Context) (child, error), out io.Writer) *supervisor {
	return &supervisor{
		name: name, start: start, out: out,
		initialDelay: time.Second, maxDelay: 30 * time.Second, stableAfter: 10 * time.Second,
		stopGrace: 20 * time.Second,
	}
}

// Pid is the pid of the process started last.
func (s *supervisor) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pid
}

// run supervises c (already started) and its successors until ctx ends,
// then stops the running process and returns its stop error. A process
// that exits while ctx ends is not started again.
func (s *supervisor) run(ctx context.Context, c child) error {
	if s.pidFile != "" {
		defer os.Remove(s.pidFile)
	}
	delay := backoff{initial: s.initialDelay, max: s.maxDelay}
	s.started(c)
	for {
		since := time.Now()
		select {
		case <-ctx.Done():
			return c.Stop(s.stopGrace)
		case <-c.Exited():
		}
		if ctx.Err() != nil {
			return nil
		}
		ran := time.Since(since)
		if ran >= s.stableAfter {
			delay.reset()
		}
		d := delay.next()
		fmt.Fprintf(s.out, "==> %s (pid %d) %s after %s; restarting in %s\n",
			s.name, c.Pid(), describeExit(c.ExitErr()), roundDuration(ran), d)
		for {
			if !sleep(ctx, d) {
				return nil
			}
			next, err := s.start(ctx)
			if ctx.Err() != nil {
				if err == nil {
					return next.Stop(s.stopGrace)
				}
				return nil
			}
			if err == nil {
				c = next
				s.started(c)
				fmt.Fprintf(s.out, "==> %s restarted (pid %d)\n", s.name, c.Pid())
				break
			}
			d = delay.next()
			fmt.Fprintf(s.out, "==> %s could not be restarted: %v; retrying in %s\n", s.name, err, d)
		}
	}
}

// supervise records c's pid and runs the supervision in the background
// until ctx ends or stop is called; stop waits for the end and returns
// run's result.
func (s *supervisor) supervise(ctx context.Context, c child) (stop func() error) {
	s.started(c)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.run(ctx, c) }()
	return func() error {
		cancel()
		return <-done
	}
}

// started records c's pid (in the pid file through a rename: a reader
// sees the old pid or the new one, never an empty file).
func (s *supervisor) started(c child) {
	s.mu.Lock()
	s.pid = c.Pid()
	s.mu.Unlock()
	if s.pidFile == "" {
		return
	}
	tmp := s.pidFile + ".tmp"
	err := os.WriteFile(tmp, []byte(strconv.Itoa(c.Pid())+"\n"), 0o644)
	if err == nil {
		err = os.Rename(tmp, s.pidFile)
	}
	if err != nil {
		fmt.Fprintf(s.out, "==> %s: cannot write its pid file: %v\n", s.name, err)
	}
}

// backoff is a doubling delay with a cap.
type backoff struct {
	initial, max, cur time.Duration
}

// next returns the delay to wait now and doubles the following one.
func (b *backoff) next() time.Duration {
	if b.cur == 0 {
		b.cur = b.initial
	}
	d := b.cur
	b.cur = min(2*b.cur, b.max)
	return d
}

func (b *backoff) reset() { b.cur = 0 }

// sleep waits for d; false when ctx ended first.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// describeExit says how a process ended: "was killed by signal: killed",
// "exited with status 1".
func describeExit(err error) string {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return "exited with status 0"
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return "was killed by signal: " + ws.Signal().String()
		}
		return "exited with status " + strconv.Itoa(ee.ExitCode())
	default:
		return "exited: " + err.Error()
	}
}

// roundDuration keeps the lines short: 45ms, 1.234s, 2m3s.
func roundDuration(d time.Duration) time.Duration {
	if d >= time.Minute {
		return d.Round(time.Second)
	}
	return d.Round(time.Millisecond)
}

package framework

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"
)

// Process is a running child process whose output goes to a log file.
type Process struct {
	Name    string
	LogFile string
	// MetricsAddress and HealthAddress are where a ferry process serves
	// /metrics and /healthz, /readyz (host:port); empty for other programs.
	MetricsAddress, HealthAddress string
	// AdminAddress is where an edge serves its local admin API
	// (EdgeAdminService, plaintext gRPC); empty for other programs.
	AdminAddress string

	// logStart is where this process's part of LogFile begins (a restarted
	// process appends to its predecessor's log).
	logStart int64

	cmd    *exec.Cmd
	exited chan struct{}
	mu     sync.Mutex
	err    error
	killed bool
}

// StartProcess starts bin with args; stdout and stderr go to
// logDir/<name>.log (appended, so a restarted process keeps one log).
//
// The child gets its own process group (Stop signals the whole group) and
// SIGKILL as parent-death signal (it dies with the test binary). Not
// exec.CommandContext: its kill would skip the graceful SIGTERM and the
// process group.
func StartProcess(name, bin string, args []string, env []string, logDir string) (*Process, error) {
	return StartProcessIn("", name, bin, args, env, logDir)
}

// StartProcessIn is StartProcess with the child's working directory set to
// workDir (the caller's when empty).
func StartProcessIn(workDir, name, bin string, args []string, env []string, logDir string) (*Process, error) {
	if err := os.MkdirAll(logDir, 0o755); err != nil {
		return nil, err
	}
	logPath := filepath.Join(logDir, name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	info, err := logFile.Stat()
	if err != nil {
		logFile.Close()
		return nil, err
	}
	fmt.Fprintf(logFile, "=== %s: %s %q\n", time.Now().Format(time.RFC3339), bin, args)
	cmd := exec.Command(bin, args...)
	cmd.Dir = workDir
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("cannot start %s (%s): %w", name, bin, err)
	}
	p := &Process{Name: name, LogFile: logPath, logStart: info.Size(), cmd: cmd, exited: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		logFile.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(p.exited)
	}()
	return p, nil
}

// Log returns what this process wrote to LogFile: not what an earlier
// process of the same name wrote there before it.
func (p *Process) Log() ([]byte, error) {
	f, err := os.Open(p.LogFile)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(p.logStart, io.SeekStart); err != nil {
		return nil, fmt.Errorf("cannot seek in %s: %w", p.LogFile, err)
	}
	return io.ReadAll(f)
}

// Pid is the process's ID.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Exited is closed when the process has exited.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// ExitErr is the process's exit error, once Exited is closed.
func (p *Process) ExitErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// Signal sends sig to the process group.
func (p *Process) Signal(sig syscall.Signal) error {
	err := syscall.Kill(-p.cmd.Process.Pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// Stop sends SIGTERM to the process group and SIGKILL after grace; it
// returns once the process has exited, with its exit error (nil for a clean
// exit).
func (p *Process) Stop(grace time.Duration) error {
	select {
	case <-p.exited:
		return p.ExitErr()
	default:
	}
	_ = p.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
		return cleanAfterTerm(p.ExitErr())
	case <-time.After(grace):
	}
	_ = p.Signal(syscall.SIGKILL)
	<-p.exited
	return fmt.Errorf("%s did not stop within %s of SIGTERM and was killed", p.Name, grace)
}

// Kill sends SIGKILL to the process group and waits for the exit.
func (p *Process) Kill() {
	p.mu.Lock()
	p.killed = true
	p.mu.Unlock()
	_ = p.Signal(syscall.SIGKILL)
	<-p.exited
}

// Killed tells whether Kill was called.
func (p *Process) Killed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.killed
}

// cleanAfterTerm treats "killed by the SIGTERM we sent" as a clean stop:
// servers such as kube-apiserver exit through the signal rather than with
// status 0.
func cleanAfterTerm(err error) error {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGTERM {
			return nil
		}
	}
	return err
}

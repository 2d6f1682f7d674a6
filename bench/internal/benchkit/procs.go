package benchkit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// OwnGroup makes cmd the leader of a new process group and makes cancelling its context
// kill that whole group: `rampart endpoint exec` and nsenter may leave the real work to a
// child, which must not outlive the benchmark. cmd must come from exec.CommandContext.
func OwnGroup(cmd *exec.Cmd) *exec.Cmd {
	setGroup(cmd)
	cmd.Cancel = func() error { return killGroup(cmd, syscall.SIGKILL) }
	cmd.WaitDelay = 5 * time.Second
	return cmd
}

// setGroup makes cmd the leader of a new process group, killed if the benchmark dies.
func setGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// killGroup signals the process group that cmd leads (only processes this benchmark
// started, addressed by their id).
func killGroup(cmd *exec.Cmd, sig syscall.Signal) error {
	if cmd.Process == nil {
		return nil
	}
	err := syscall.Kill(-cmd.Process.Pid, sig)
	if errors.Is(err, syscall.ESRCH) {
		return nil
	}
	return err
}

// RunOutput runs the command mk returns (built with OwnGroup) with a time limit and returns
// its stdout; the error carries stderr.
func RunOutput(ctx context.Context, timeout time.Duration, mk func(ctx context.Context) *exec.Cmd) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := mk(ctx)
	var stdout, stderr bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	err := cmd.Run()
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			err = fmt.Errorf("timed out after %v", timeout)
		}
		return stdout.Bytes(), fmt.Errorf("%s: %w: %s", strings.Join(cmd.Args, " "), err, strings.TrimSpace(Truncate(stderr.String(), 500)))
	}
	return stdout.Bytes(), nil
}

// Truncate shortens s to n bytes for error messages.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// Daemons tracks long-running processes (servers, the agent) for clean-up.
type Daemons struct {
	mu    sync.Mutex
	procs []*Daemon
}

// Daemon is one tracked process.
type Daemon struct {
	name   string
	cmd    *exec.Cmd
	done   chan struct{}
	err    error
	stderr *lockedWriter
}

// Start starts cmd in its own process group and tracks it. Its stderr is kept for error
// messages unless cmd.Stderr is set.
func (d *Daemons) Start(name string, cmd *exec.Cmd) (*Daemon, error) {
	setGroup(cmd)
	p := &Daemon{name: name, cmd: cmd, done: make(chan struct{}), stderr: &lockedWriter{}}
	if cmd.Stderr == nil {
		cmd.Stderr = p.stderr
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	d.mu.Lock()
	d.procs = append(d.procs, p)
	d.mu.Unlock()
	return p, nil
}

// Pid is the process id of the daemon (the leader of its process group).
func (p *Daemon) Pid() int { return p.cmd.Process.Pid }

// Exited reports whether the daemon has stopped, and why.
func (p *Daemon) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, fmt.Errorf("%s exited: %v: %s", p.name, p.err, strings.TrimSpace(Truncate(p.stderr.String(), 500)))
	default:
		return false, nil
	}
}

// Stop asks the daemon's group to terminate, then kills it if it lingers.
func (p *Daemon) Stop(grace time.Duration) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	if err := killGroup(p.cmd, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stopping %s: %w", p.name, err)
	}
	select {
	case <-p.done:
		// The leader is gone; its group may still hold children (exec wrappers).
		_ = killGroup(p.cmd, syscall.SIGKILL)
		return nil
	case <-time.After(grace):
	}
	if err := killGroup(p.cmd, syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing %s: %w", p.name, err)
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(5 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.name, p.cmd.Process.Pid)
	}
}

// StopAll stops every tracked daemon, newest first.
func (d *Daemons) StopAll() error {
	d.mu.Lock()
	procs := d.procs
	d.procs = nil
	d.mu.Unlock()
	var errs []error
	for i := len(procs) - 1; i >= 0; i-- {
		errs = append(errs, procs[i].Stop(3*time.Second))
	}
	return errors.Join(errs...)
}

// lockedWriter collects a daemon's stderr for error messages.
type lockedWriter struct {
	mu sync.Mutex
	w  bytes.Buffer
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.String()
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.w.Len() > 1<<20 { // keep memory bounded for chatty daemons
		return len(p), nil
	}
	return l.w.Write(p)
}

package podrunner

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/netns"
)

// process is a pod's running process: started by this runner (cmd set, its exit code
// known) or adopted from an earlier runner (watched through a pidfd, its exit code not
// known).
type process struct {
	pid     int
	start   uint64
	started time.Time
	// done is closed when the process has exited; code is then its exit code, -1 if
	// unknown (adopted) or killed by a signal.
	done chan struct{}
	code int
}

// startProcess runs argv inside the network namespace at nsPath, in its own process
// group (so that signals to the runner do not reach it and stopping it reaches its
// children), with stdout and stderr appended to logPath. The process outlives the
// runner: a restarted runner adopts it.
func startProcess(nsPath string, argv, env []string, dir, logPath string) (*process, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, fmt.Errorf("creating log directory: %w", err)
	}
	log, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("opening log: %w", err)
	}
	defer log.Close()
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = env
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// The child inherits the namespace of the thread that forks it: netns.Do runs the
	// fork on a thread locked inside the pod's namespace.
	if err := netns.Do(nsPath, cmd.Start); err != nil {
		return nil, fmt.Errorf("starting %s: %w", argv[0], err)
	}
	p := &process{pid: cmd.Process.Pid, started: time.Now(), done: make(chan struct{})}
	p.start, _ = procStart(p.pid)
	go func() {
		err := cmd.Wait()
		p.code = 0
		if err != nil {
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				p.code = ee.ExitCode() // -1 when killed by a signal
			} else {
				p.code = -1
			}
		}
		close(p.done)
	}()
	return p, nil
}

// adoptProcess takes over the process pid if it still runs and started at start (so that
// a reused PID is not mistaken for it). It is watched through a pidfd, which reports its
// exit whoever its parent is.
func adoptProcess(pid int, start uint64) (*process, bool) {
	if pid <= 0 {
		return nil, false
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, false
	}
	// Checked after opening the pidfd: the fd then refers to this very process.
	if got, err := procStart(pid); err != nil || got != start || procZombie(pid) {
		unix.Close(fd)
		return nil, false
	}
	p := &process{pid: pid, start: start, started: time.Now(), done: make(chan struct{}), code: -1}
	go func() {
		defer unix.Close(fd)
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		for {
			if _, err := unix.Poll(fds, -1); err == nil || !errors.Is(err, unix.EINTR) {
				break
			}
		}
		close(p.done)
	}()
	return p, true
}

// signal sends sig to the process's group (its ID is the process's: Setpgid).
func (p *process) signal(sig unix.Signal) {
	if err := unix.Kill(-p.pid, sig); errors.Is(err, unix.ESRCH) {
		unix.Kill(p.pid, sig)
	}
}

// stop sends SIGTERM, waits up to grace, then SIGKILL, and waits for the exit (bounded:
// a process stuck in the kernel is reported).
func (p *process) stop(grace time.Duration) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	p.signal(unix.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		// The group may hold children that outlived the leader.
		p.signal(unix.SIGKILL)
		return nil
	case <-t.C:
	}
	p.signal(unix.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("process %d did not exit after SIGKILL", p.pid)
	}
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// procStat returns the fields of /proc/pid/stat after the command name.
func procStat(pid int) ([]string, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil, err
	}
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return nil, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	return strings.Fields(string(data[i+1:])), nil
}

// procStart is the process's start time in clock ticks since boot (field 22).
func procStart(pid int) (uint64, error) {
	f, err := procStat(pid)
	if err != nil {
		return 0, err
	}
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: short", pid)
	}
	return strconv.ParseUint(f[19], 10, 64)
}

func procZombie(pid int) bool {
	f, err := procStat(pid)
	return err != nil || len(f) == 0 || f[0] == "Z" || f[0] == "X"
}

package nodetest

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
)

// proc is one process the lab started, its output in a log file.
type proc struct {
	name string
	argv []string // as started, nsenter included: restart runs it again
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

// startProc starts argv with its output appended to logPath. With holder > 0 it runs in
// that process's network and mount namespaces (nsenter, which execs it: the pid is the
// component's). It is killed if the test's process dies first (Pdeathsig).
func startProc(name, logPath string, holder int, argv ...string) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	defer logf.Close()
	if holder > 0 {
		argv = append([]string{"nsenter", "--target", strconv.Itoa(holder), "--net", "--mount", "--"}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	return &proc{name: name, argv: argv, cmd: cmd, log: logPath, done: done}, nil
}

// restart stops the process (stop) and starts its command line again, in place.
func (p *proc) restart(grace time.Duration) error {
	p.stop(grace)
	q, err := startProc(p.name, p.log, 0, p.argv...)
	if err != nil {
		return err
	}
	*p = *q
	return nil
}

// kill kills the process at once (SIGKILL), as a power loss would.
func (p *proc) kill() {
	if p == nil || p.exited() {
		return
	}
	p.cmd.Process.Kill()
	<-p.done
}

// pid is the process's id, 0 if it is not running.
func (p *proc) pid() int {
	if p == nil || p.exited() {
		return 0
	}
	return p.cmd.Process.Pid
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, and SIGKILL after grace.
func (p *proc) stop(grace time.Duration) {
	if p == nil || p.exited() {
		return
	}
	testenv.Terminate(p.cmd.Process, p.done, grace)
}

// rssKiB is the process's resident set (VmRSS) in KiB, 0 if it has exited.
func rssKiB(pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	var kib int64
	for _, line := range strings.Split(string(b), "\n") {
		if _, err := fmt.Sscanf(line, "VmRSS: %d kB", &kib); err == nil {
			return kib
		}
	}
	return 0
}

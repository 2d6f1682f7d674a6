package suricata

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	rnetns "github.com/rampartnet/rampart/internal/netns"
)

// ErrNotInstalled is returned when no Suricata executable is found.
var ErrNotInstalled = errors.New("suricata not installed (scripts/install-suricata.sh)")

// Monitor is one running Suricata.
type Monitor struct {
	cfg     Config
	cmd     *exec.Cmd
	started time.Duration
	exited  chan struct{}
	waitErr error // set before exited closes

	stopOnce sync.Once
	stopErr  error

	mu      sync.Mutex
	reader  *Reader
	pending []Event // read from the file, not yet returned (WaitEvent stopped before them)
}

// Binary returns the Suricata executable Start would run for binary ("" = PATH).
func Binary(binary string) (string, error) {
	if binary == "" {
		binary = "suricata"
	}
	p, err := exec.LookPath(binary)
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNotInstalled, err)
	}
	return p, nil
}

var versionRE = regexp.MustCompile(`version (\d+\.\d+\.\d+)`)

// Version returns the version of the Suricata executable binary ("" = PATH), e.g. "7.0.10".
func Version(binary string) (string, error) {
	bin, err := Binary(binary)
	if err != nil {
		return "", err
	}
	out, err := exec.Command(bin, "-V").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s -V: %w: %s", bin, err, bytes.TrimSpace(out))
	}
	m := versionRE.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("%s -V: no version in %q", bin, bytes.TrimSpace(out))
	}
	return string(m[1]), nil
}

// Start writes the monitor's configuration and rules into cfg.Dir, starts Suricata in
// cfg.Netns and returns once its engine runs (its log says "Engine started"), or an error
// that says what failed with the end of Suricata's log. ctx bounds the start only; Stop
// ends the process.
func Start(ctx context.Context, cfg Config) (*Monitor, error) {
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("suricata config: %w", err)
	}
	bin, err := Binary(cfg.Binary)
	if err != nil {
		return nil, err
	}
	if err := checkInterfaces(&cfg); err != nil {
		return nil, err
	}
	lock, err := lockDir(cfg.Dir)
	if err != nil {
		return nil, err
	}
	started := false
	defer func() {
		if !started { // after the start, the lock goes when Suricata exits
			lock.Close()
		}
	}()
	if err := writeFiles(&cfg); err != nil {
		return nil, err
	}
	out, err := os.OpenFile(filepath.Join(cfg.Dir, outputName), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening suricata output file: %w", err)
	}
	defer out.Close()

	var cmd *exec.Cmd
	if cfg.Netns != "" {
		// nsenter switches only the network namespace and execs Suricata in place: it
		// stays this process's child, and sees the caller's files and mounts.
		cmd = exec.Command("nsenter", append([]string{"--net=" + cfg.Netns, "--", bin}, cfg.args()...)...)
	} else {
		cmd = exec.Command(bin, cfg.args()...)
	}
	cmd.Stdout, cmd.Stderr = out, out
	// A monitor does not outlive the process that runs it: an IPS left behind would keep
	// judging a path that nobody reads the alerts of.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	begin := time.Now()
	m := &Monitor{cfg: cfg, cmd: cmd, exited: make(chan struct{}), reader: NewReader(eveFile(cfg))}
	// The parent-death signal follows the thread that forked Suricata, not the process:
	// fork from a goroutine that holds its thread until Suricata exits, so that no thread
	// ending elsewhere in this process (one that changed namespaces) stops the monitor.
	startErr := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			startErr <- err
			return
		}
		startErr <- nil
		m.waitErr = cmd.Wait()
		lock.Close()
		close(m.exited)
	}()
	if err := <-startErr; err != nil {
		return nil, fmt.Errorf("starting suricata (%s): %w", cmd, err)
	}
	started = true

	timeout := cfg.StartTimeout
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		if ok, err := m.engineStarted(); err != nil {
			m.Stop()
			return nil, err
		} else if ok {
			m.started = time.Since(begin)
			return m, nil
		}
		select {
		case <-m.exited:
			return nil, fmt.Errorf("suricata (%s mode) exited while starting: %v%s", cfg.Mode, m.waitErr, m.logExcerpt())
		case <-ctx.Done():
			m.Stop()
			return nil, fmt.Errorf("suricata (%s mode) did not start within %s: %w%s", cfg.Mode, timeout, ctx.Err(), m.logExcerpt())
		case <-tick.C:
		}
	}
}

func eveFile(cfg Config) string { return filepath.Join(cfg.Dir, eveName) }

// checkInterfaces fails early, naming the interface and namespace, when a capture
// interface is missing: Suricata's own error for it comes late and reads less clearly.
func checkInterfaces(cfg *Config) error {
	var names []string
	switch cfg.Mode {
	case Passive:
		names = []string{cfg.Interface}
	case IPS:
		names = []string{cfg.Interface, cfg.PeerInterface}
	}
	if len(names) == 0 {
		return nil
	}
	return rnetns.Do(cfg.Netns, func() error {
		for _, n := range names {
			ifi, err := net.InterfaceByName(n)
			if err != nil {
				return fmt.Errorf("suricata %s mode: interface %s in network namespace %q: %w", cfg.Mode, n, cfg.Netns, err)
			}
			if ifi.Flags&net.FlagUp == 0 {
				return fmt.Errorf("suricata %s mode: interface %s in network namespace %q is down", cfg.Mode, n, cfg.Netns)
			}
		}
		return nil
	})
}

// lockDir takes the monitor directory's lock, which a monitor holds until Suricata
// exits: a second Suricata started in the same directory would delete the first one's
// EVE file and pid file, and two inline ones on the same interfaces would each pass on
// every frame, so the second start is refused.
func lockDir(dir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating monitor directory: %w", err)
	}
	// O_CLOEXEC (Go's default): Suricata does not inherit the lock, whose holder is this
	// process until Suricata exits.
	f, err := os.OpenFile(filepath.Join(dir, lockName), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the monitor's lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("a monitor already runs in %s", dir)
		}
		return nil, fmt.Errorf("locking the monitor directory %s: %w", dir, err)
	}
	return f, nil
}

// writeFiles creates the monitor's directory with its configuration, its rules and the
// empty classification, reference and threshold files the configuration names.
func writeFiles(cfg *Config) error {
	y, err := cfg.Rendered()
	if err != nil {
		return fmt.Errorf("suricata config: %w", err)
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return fmt.Errorf("creating monitor directory: %w", err)
	}
	// What a previous run left: Suricata refuses to start over an existing pid file, and
	// a reader must not take the old run's events for this one's.
	for _, n := range []string{pidName, eveName, logName, socketName} {
		if err := os.Remove(filepath.Join(cfg.Dir, n)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("removing the previous run's %s: %w", n, err)
		}
	}
	rules := strings.Join(cfg.Rules, "\n")
	if rules != "" {
		rules += "\n"
	}
	files := map[string]string{configName: string(y), rulesName: rules, className: "", refName: "", threshName: ""}
	var scripts strings.Builder
	for _, f := range cfg.LuaScripts {
		b, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("reading lua script: %w", err)
		}
		files[filepath.Base(f)] = string(b)
		scripts.WriteString(filepath.Base(f) + "\n")
	}
	// The scripts of this run and of earlier ones: each copy is the monitor's to remove.
	if old, err := os.ReadFile(filepath.Join(cfg.Dir, scriptsName)); err == nil {
		for _, n := range strings.Fields(string(old)) {
			if _, again := files[n]; !again {
				scripts.WriteString(n + "\n")
			}
		}
	}
	files[scriptsName] = scripts.String()
	for n, body := range files {
		if err := os.WriteFile(filepath.Join(cfg.Dir, n), []byte(body), 0o600); err != nil {
			return fmt.Errorf("writing %s: %w", n, err)
		}
	}
	return nil
}

// engineStarted reports whether Suricata's log says its engine runs.
func (m *Monitor) engineStarted() (bool, error) {
	b, err := os.ReadFile(filepath.Join(m.cfg.Dir, logName))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading suricata log: %w", err)
	}
	return bytes.Contains(b, []byte("Engine started")), nil
}

// logExcerpt returns the errors and the last lines of Suricata's log and output, for an
// error message.
func (m *Monitor) logExcerpt() string {
	var b strings.Builder
	for _, n := range []string{logName, outputName} {
		data, err := os.ReadFile(filepath.Join(m.cfg.Dir, n))
		if err != nil || len(bytes.TrimSpace(data)) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		var keep []string
		for _, l := range lines {
			if strings.Contains(l, "Error") || strings.Contains(l, "error") {
				keep = append(keep, l)
			}
		}
		tail := lines[max(0, len(lines)-5):]
		for _, l := range tail {
			if !slices.Contains(keep, l) {
				keep = append(keep, l)
			}
		}
		if len(keep) > 20 {
			keep = keep[len(keep)-20:]
		}
		fmt.Fprintf(&b, "\n%s:\n  %s", filepath.Join(m.cfg.Dir, n), strings.Join(keep, "\n  "))
	}
	return b.String()
}

// StartupTime is how long Suricata took from exec to "Engine started".
func (m *Monitor) StartupTime() time.Duration { return m.started }

// Pid is Suricata's process id.
func (m *Monitor) Pid() int { return m.cmd.Process.Pid }

// Dir is the monitor's directory.
func (m *Monitor) Dir() string { return m.cfg.Dir }

// EVEPath is the EVE JSON file Suricata writes events to.
func (m *Monitor) EVEPath() string { return eveFile(m.cfg) }

// Exited is closed when Suricata has exited (stopped or died).
func (m *Monitor) Exited() <-chan struct{} { return m.exited }

// Stop ends Suricata with SIGTERM, which makes it log the flows it still holds and flush
// its outputs, and waits for it to exit; after 10s it is killed. Stopping twice is fine.
func (m *Monitor) Stop() error {
	m.stopOnce.Do(func() {
		select {
		case <-m.exited:
			// It died before: that is worth reporting, a stop is not.
			if m.waitErr != nil {
				m.stopErr = fmt.Errorf("suricata had exited: %w%s", m.waitErr, m.logExcerpt())
			}
			return
		default:
		}
		m.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-m.exited:
			if m.waitErr != nil {
				m.stopErr = fmt.Errorf("stopping suricata: %w%s", m.waitErr, m.logExcerpt())
			}
		case <-time.After(10 * time.Second):
			m.cmd.Process.Kill()
			<-m.exited
			m.stopErr = fmt.Errorf("stopping suricata: no exit 10s after SIGTERM; killed%s", m.logExcerpt())
		}
	})
	return m.stopErr
}

// Events returns the EVE events written since the previous call of Events or WaitEvent
// (the first call: since the start).
func (m *Monitor) Events() ([]Event, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	evs, err := m.reader.Next()
	evs = append(m.pending, evs...)
	m.pending = nil
	return evs, err
}

// next returns the first unreturned event that satisfies match, with the events before
// it; the events after it stay for the next call.
func (m *Monitor) next(match func(Event) bool) (ev Event, before []Event, found bool, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	evs, err := m.reader.Next()
	evs = append(m.pending, evs...)
	m.pending = nil
	for i, e := range evs {
		if match(e) {
			m.pending = append(m.pending, evs[i+1:]...)
			return e, evs[:i], true, err
		}
	}
	return Event{}, evs, false, err
}

// WaitEvent reads events until one satisfies match and returns it, with every event read
// on the way (match's included), or an error when ctx ends or Suricata exits first. Events
// after the match are left for the next call.
func (m *Monitor) WaitEvent(ctx context.Context, match func(Event) bool) (Event, []Event, error) {
	var seen []Event
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		// Checked before reading: the events Suricata flushed as it exited are read once
		// more below.
		var exited bool
		select {
		case <-m.exited:
			exited = true
		default:
		}
		ev, before, found, err := m.next(match)
		seen = append(seen, before...)
		if found {
			return ev, append(seen, ev), err
		}
		if err != nil {
			return Event{}, seen, err
		}
		if exited {
			return Event{}, seen, fmt.Errorf("waiting for a suricata event: suricata exited: %v", m.waitErr)
		}
		select {
		case <-ctx.Done():
			return Event{}, seen, fmt.Errorf("waiting for a suricata event: %w", ctx.Err())
		case <-m.exited:
		case <-tick.C:
		}
	}
}

// Command sends one command to Suricata's command socket (e.g. "dump-counters",
// "uptime", "reload-rules") and returns its "message".
func (m *Monitor) Command(ctx context.Context, command string) (json.RawMessage, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", filepath.Join(m.cfg.Dir, socketName))
	if err != nil {
		return nil, fmt.Errorf("suricata command %s: %w", command, err)
	}
	defer c.Close()
	if dl, ok := ctx.Deadline(); ok {
		c.SetDeadline(dl)
	} else {
		c.SetDeadline(time.Now().Add(10 * time.Second))
	}
	dec := json.NewDecoder(c)
	type reply struct {
		Return  string          `json:"return"`
		Message json.RawMessage `json:"message"`
	}
	call := func(req any) (json.RawMessage, error) {
		b, _ := json.Marshal(req)
		if _, err := c.Write(append(b, '\n')); err != nil {
			return nil, err
		}
		var r reply
		if err := dec.Decode(&r); err != nil {
			return nil, err
		}
		if r.Return != "OK" {
			return nil, fmt.Errorf("%s: %s", r.Return, r.Message)
		}
		return r.Message, nil
	}
	// The protocol starts with a version handshake.
	if _, err := call(map[string]string{"version": "0.2"}); err != nil {
		return nil, fmt.Errorf("suricata command socket handshake: %w", err)
	}
	msg, err := call(map[string]string{"command": command})
	if err != nil {
		return nil, fmt.Errorf("suricata command %s: %w", command, err)
	}
	return msg, nil
}

// CaptureStats are Suricata's counters that a tap reports: packets the kernel handed it
// over AF_PACKET and packets the kernel dropped because Suricata did not take them in time
// (copies a mirror monitor lost), the inline verdicts (IPS and NFQueue: packets passed on
// and dropped) and alerts.
type CaptureStats struct {
	KernelPackets uint64
	KernelDrops   uint64
	Accepted      uint64
	Blocked       uint64
	Alerts        uint64
}

// Stats reads the counters through the command socket. Suricata publishes them once a
// second; before the first time the command fails ("stats not yet synchronized").
func (m *Monitor) Stats(ctx context.Context) (CaptureStats, error) {
	msg, err := m.Command(ctx, "dump-counters")
	if err != nil {
		return CaptureStats{}, err
	}
	var c struct {
		Capture struct {
			KernelPackets uint64 `json:"kernel_packets"`
			KernelDrops   uint64 `json:"kernel_drops"`
		} `json:"capture"`
		IPS struct {
			Accepted uint64 `json:"accepted"`
			Blocked  uint64 `json:"blocked"`
		} `json:"ips"`
		Detect struct {
			Alert uint64 `json:"alert"`
		} `json:"detect"`
	}
	if err := json.Unmarshal(msg, &c); err != nil {
		return CaptureStats{}, fmt.Errorf("decoding suricata counters: %w", err)
	}
	return CaptureStats{KernelPackets: c.Capture.KernelPackets, KernelDrops: c.Capture.KernelDrops,
		Accepted: c.IPS.Accepted, Blocked: c.IPS.Blocked, Alerts: c.Detect.Alert}, nil
}

// RemoveDir removes what monitors wrote in dir: their configuration, rules, logs, EVE
// file, socket, pid file, lock and the Lua scripts they copied (listed in the
// directory), then dir itself. A file a monitor did not write stays, and so does dir,
// which RemoveDir then reports as kept (false). A dir that does not exist is removed.
// The caller makes sure no monitor runs there.
func RemoveDir(dir string) (removed bool, err error) {
	names := []string{configName, rulesName, eveName, logName, outputName, socketName, pidName, className, refName, threshName, lockName}
	if b, err := os.ReadFile(filepath.Join(dir, scriptsName)); err == nil {
		for _, n := range strings.Fields(string(b)) {
			if n == filepath.Base(n) && n != "." && n != ".." {
				names = append(names, n)
			}
		}
	} else if errors.Is(err, os.ErrNotExist) {
		if _, serr := os.Stat(dir); errors.Is(serr, os.ErrNotExist) {
			return true, nil
		}
	}
	names = append(names, scriptsName) // last: the list of what else to remove
	for _, n := range names {
		if err := os.Remove(filepath.Join(dir, n)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return false, fmt.Errorf("removing monitor file: %w", err)
		}
	}
	if err := os.Remove(dir); err != nil {
		if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
			return false, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return false, fmt.Errorf("removing monitor directory: %w", err)
		}
	}
	return true, nil
}

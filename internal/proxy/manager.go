package proxy

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	accesslogdata "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/l7plan"
)

// Config configures a Manager.
type Config struct {
	Instance string // names the Envoy node and derives its --base-id
	Envoy    string // the Envoy binary (see FindEnvoy)
	// NetnsPath is the network namespace Envoy runs in (the node namespace); "" runs it in
	// the agent's own.
	NetnsPath string
	// RunDir holds the control and admin sockets, the bootstrap and Envoy's log. Unix socket
	// paths are limited to 107 bytes: keep it short.
	RunDir  string
	Options Options
	// Concurrency is Envoy's worker thread count (default: the CPUs this process may run
	// on).
	Concurrency int
	// ExtraArgs are appended to Envoy's command line (tuning, debugging).
	ExtraArgs []string
	// AckTimeout bounds how long Update waits for a connected Envoy to apply a configuration
	// (default 5s).
	AckTimeout time.Duration
	Logger     *slog.Logger
	// OnAccessLog receives every request the proxy logged. It runs on the control plane's
	// goroutine (Envoy's logs) and on the fast path's connection goroutines, concurrently:
	// it must be safe for that and must not block for long.
	OnAccessLog func(flow.AccessLog)
}

// Status describes the proxy for `rampart status`.
type Status struct {
	Running   bool      `json:"running"`
	PID       int       `json:"pid,omitempty"`
	StartedAt time.Time `json:"startedAt,omitempty"` // of the current Envoy process
	Restarts  int       `json:"restarts"`            // Envoy exits the supervisor recovered from
	// Version is the latest configuration version published; AckedVersion the latest one
	// Envoy applied (0 while no Envoy is connected).
	Version      uint64 `json:"version"`
	AckedVersion uint64 `json:"ackedVersion"`
	Connected    bool   `json:"connected"`
	Chains       int    `json:"chains"`
	LastExit     string `json:"lastExit,omitempty"`
	LastError    string `json:"lastError,omitempty"`
	Log          string `json:"log"` // Envoy's log file
	Binary       string `json:"binary"`
	Listen       string `json:"listen"` // Envoy's listener
	// FastPath is the agent's own HTTP/1.1 check (nil when off); it serves the listener
	// the dataplane steers to and hands Envoy what it does not check itself.
	FastPath *FastPathStatus `json:"fastPath,omitempty"`
}

// Manager runs Envoy and its control plane: it supervises the Envoy process (restarting it
// with backoff when it exits), serves it configuration over ADS, and receives its access
// logs.
type Manager struct {
	cfg       Config
	log       *slog.Logger
	cp        *controlPlane
	bootstrap string
	logPath   string
	adminSock string

	update sync.Mutex // serialises Update
	ver    atomic.Uint64
	plan   atomic.Pointer[l7plan.Plan]
	fast   *fastPath // nil unless Options.FastPath

	mu        sync.Mutex
	started   bool
	stopping  bool
	stop      chan struct{}
	supDone   chan struct{}
	pid       int
	procStart time.Time
	restarts  int
	lastExit  string
	lastErr   string
}

// Socket file names inside RunDir.
const (
	controlSocketName = "xds.sock"
	adminSocketName   = "admin.sock"
	bootstrapName     = "envoy.json"
	logName           = "envoy.log"
	maxLogSize        = 16 << 20
)

// New prepares the run directory and starts the control plane. Envoy itself starts with
// Start.
func New(cfg Config) (*Manager, error) {
	if cfg.Envoy == "" {
		return nil, ErrNoEnvoy
	}
	if cfg.RunDir == "" {
		return nil, errors.New("proxy: no run directory")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Concurrency <= 0 {
		// The CPUs this process may run on (Envoy inherits the affinity): more workers
		// than that only contend.
		cfg.Concurrency = max(1, runtime.NumCPU())
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = 5 * time.Second
	}
	cfg.Options.AccessLog = cfg.Options.AccessLog || cfg.OnAccessLog != nil
	cfg.Options = cfg.Options.withDefaults()
	if err := os.MkdirAll(cfg.RunDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating proxy run directory: %w", err)
	}
	m := &Manager{
		cfg:       cfg,
		log:       cfg.Logger.With("component", "proxy"),
		bootstrap: filepath.Join(cfg.RunDir, bootstrapName),
		logPath:   filepath.Join(cfg.RunDir, logName),
		adminSock: filepath.Join(cfg.RunDir, adminSocketName),
	}
	ctl := filepath.Join(cfg.RunDir, controlSocketName)
	if len(ctl) > 100 || len(m.adminSock) > 100 {
		return nil, fmt.Errorf("proxy run directory %s: path too long for Unix sockets", cfg.RunDir)
	}
	b, err := bootstrapConfig{
		NodeID:       m.nodeID(),
		AdminSocket:  m.adminSock,
		ControlSock:  ctl,
		ConnectLimit: 2 * time.Second,
	}.json()
	if err != nil {
		return nil, fmt.Errorf("writing proxy bootstrap: %w", err)
	}
	if err := os.WriteFile(m.bootstrap, b, 0o600); err != nil {
		return nil, fmt.Errorf("writing proxy bootstrap: %w", err)
	}
	var onLog func(*accesslogdata.HTTPAccessLogEntry)
	if cfg.OnAccessLog != nil {
		onLog = func(e *accesslogdata.HTTPAccessLogEntry) { cfg.OnAccessLog(m.decodeLog(e)) }
	}
	m.cp, err = newControlPlane(ctl, m.nodeID(), m.log, onLog)
	if err != nil {
		return nil, err
	}
	// An empty configuration first: an Envoy that connects before the first Update gets
	// no listener (fail closed) rather than waiting.
	m.plan.Store(&l7plan.Plan{})
	if err := m.cp.set(m.ver.Add(1), Resources{}); err != nil {
		m.cp.close()
		return nil, err
	}
	if cfg.Options.FastPath {
		// Listening from now on, with the empty plan: every connection is closed until
		// the first Update (fail closed).
		if m.fast, err = startFastPath(m); err != nil {
			m.cp.close()
			return nil, err
		}
	}
	return m, nil
}

func (m *Manager) nodeID() string { return "rampart-" + m.cfg.Instance }

// baseID keeps Envoys of different instances on one host apart (shared memory and domain
// socket names); hot restart is off, so one instance never needs two.
func (m *Manager) baseID() uint32 {
	h := fnv.New32a()
	h.Write([]byte(m.cfg.Instance))
	return 1 + h.Sum32()%1_000_000
}

// Update makes the proxy enforce plan (l7plan.BuildPlan; it must not change afterwards).
// When an Envoy is connected it waits until Envoy applied the configuration (or rejected it,
// which is an error), so that the dataplane can steer traffic to it afterwards. With no
// Envoy connected it returns at once: an Envoy that connects later gets this configuration
// before it has any listener.
func (m *Manager) Update(ctx context.Context, plan *l7plan.Plan) error {
	res, err := BuildResources(*plan, m.cfg.Options)
	if err != nil {
		return fmt.Errorf("translating L7 policy: %w", err)
	}
	m.update.Lock()
	defer m.update.Unlock()
	v := m.ver.Add(1)
	// Publish the plan first: access logs for the new chains may arrive as soon as Envoy
	// has them.
	m.plan.Store(plan)
	if err := m.cp.set(v, res); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.AckTimeout)
	defer cancel()
	err = m.cp.waitAck(ctx, v, len(res.Routes) > 0)
	if errors.Is(err, errNoProxy) {
		return nil
	}
	if err != nil {
		m.setErr(err)
		return err
	}
	return nil
}

// Plan returns the plan of the latest Update.
func (m *Manager) Plan() l7plan.Plan { return *m.plan.Load() }

// Start starts supervising Envoy. It returns at once; Envoy gets its configuration when it
// connects. Calling it again does nothing.
func (m *Manager) Start() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.started {
		return
	}
	m.started = true
	m.stop = make(chan struct{})
	m.supDone = make(chan struct{})
	go m.supervise()
}

// Started reports whether Start was called.
func (m *Manager) Started() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.started
}

// supervise runs Envoy until Stop, restarting it with backoff whenever it exits.
func (m *Manager) supervise() {
	// Envoy's parent-death signal follows the thread that forked it, not the process: keep
	// every fork on this one thread and never let it exit while Envoy runs.
	runtime.LockOSThread()
	defer close(m.supDone)
	backoff := 100 * time.Millisecond
	for {
		start := time.Now()
		exited, err := m.runOnce()
		if err != nil {
			m.setErr(err)
			m.log.Error("starting envoy", "error", err)
		}
		if exited == nil { // stopped
			return
		}
		if time.Since(start) > 30*time.Second {
			backoff = 100 * time.Millisecond
		}
		select {
		case <-m.stop:
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// runOnce starts Envoy and waits until it exits (returns a non-nil exit description) or
// Stop is called (returns nil after stopping it).
func (m *Manager) runOnce() (exited *string, err error) {
	failed := func(err error) (*string, error) { s := err.Error(); return &s, err }
	logf, err := m.openLog()
	if err != nil {
		return failed(err)
	}
	defer logf.Close()
	// A previous Envoy's admin socket file would make the bind fail.
	os.Remove(m.adminSock)
	args := []string{
		"-c", m.bootstrap,
		"--base-id", strconv.FormatUint(uint64(m.baseID()), 10),
		"--disable-hot-restart",
		"--concurrency", strconv.Itoa(m.cfg.Concurrency),
		"--log-level", "info",
		// Connections of a filter chain that goes away (an endpoint loses all its L7
		// rules) are closed soon; rule changes go through routes and drain nothing.
		"--drain-time-s", "2",
		"--drain-strategy", "immediate",
	}
	args = append(args, m.cfg.ExtraArgs...)
	var cmd *exec.Cmd
	if m.cfg.NetnsPath != "" {
		// nsenter execs Envoy in place: the agent stays its parent.
		cmd = exec.Command("nsenter", append([]string{"--net=" + m.cfg.NetnsPath, "--", m.cfg.Envoy}, args...)...)
	} else {
		cmd = exec.Command(m.cfg.Envoy, args...)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	fmt.Fprintf(logf, "---- rampart: starting %s at %s\n", cmd.String(), time.Now().Format(time.RFC3339Nano))
	if err := cmd.Start(); err != nil {
		return failed(fmt.Errorf("starting envoy: %w", err))
	}
	m.mu.Lock()
	m.pid, m.procStart = cmd.Process.Pid, time.Now()
	m.mu.Unlock()
	m.log.Info("envoy started", "pid", cmd.Process.Pid)
	waited := make(chan error, 1)
	go func() { waited <- cmd.Wait() }()
	select {
	case werr := <-waited:
		desc := "exited"
		if werr != nil {
			desc = werr.Error()
		}
		m.mu.Lock()
		m.pid = 0
		m.restarts++
		m.lastExit = fmt.Sprintf("%s at %s", desc, time.Now().Format(time.RFC3339))
		m.mu.Unlock()
		m.log.Warn("envoy exited; restarting it", "status", desc, "log", m.logPath)
		return &desc, nil
	case <-m.stop:
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-waited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-waited
		}
		m.mu.Lock()
		m.pid = 0
		m.mu.Unlock()
		return nil, nil
	}
}

// openLog opens Envoy's log for appending, starting a new one (the old kept as .1) when it
// grew too large.
func (m *Manager) openLog() (*os.File, error) {
	if st, err := os.Stat(m.logPath); err == nil && st.Size() > maxLogSize {
		os.Rename(m.logPath, m.logPath+".1")
	}
	f, err := os.OpenFile(m.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening envoy log: %w", err)
	}
	return f, nil
}

func (m *Manager) setErr(err error) {
	m.mu.Lock()
	m.lastErr = err.Error()
	m.mu.Unlock()
}

// Stop stops Envoy (SIGTERM, SIGKILL after 5s) and the supervisor. With Envoy gone nothing
// listens for steered connections and the dataplane refuses them.
func (m *Manager) Stop() {
	m.mu.Lock()
	if !m.started || m.stopping {
		done := m.supDone
		m.mu.Unlock()
		if done != nil {
			<-done
		}
		return
	}
	m.stopping = true
	close(m.stop)
	done := m.supDone
	m.mu.Unlock()
	<-done
}

// Close stops the fast path, Envoy and the control plane.
func (m *Manager) Close() error {
	if m.fast != nil {
		m.fast.close()
	}
	m.Stop()
	m.cp.close()
	return nil
}

// PID returns the running Envoy's process id (0 if none).
func (m *Manager) PID() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pid
}

// Status reports the proxy's state.
func (m *Manager) Status() Status {
	acked, connected := m.cp.acked()
	m.mu.Lock()
	defer m.mu.Unlock()
	s := Status{
		Running:      m.pid != 0,
		PID:          m.pid,
		Restarts:     m.restarts,
		Version:      m.ver.Load(),
		AckedVersion: acked,
		Connected:    connected,
		Chains:       len(m.plan.Load().Chains),
		LastExit:     m.lastExit,
		LastError:    m.lastErr,
		Log:          m.logPath,
		Binary:       m.cfg.Envoy,
		Listen:       m.cfg.Options.Listen.String(),
	}
	if m.fast != nil {
		s.Listen = m.cfg.Options.EnvoyListen.String()
		s.FastPath = m.fast.status()
	}
	if m.pid != 0 {
		s.StartedAt = m.procStart
	}
	return s
}

// WaitReady waits until an Envoy is connected and has applied the latest configuration.
func (m *Manager) WaitReady(ctx context.Context) error {
	for {
		v := m.ver.Load()
		wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		err := m.cp.waitAck(wctx, v, len(m.plan.Load().Chains) > 0)
		cancel()
		if err == nil && m.ver.Load() == v {
			return nil
		}
		if errors.Is(err, errNoProxy) || errors.Is(err, context.DeadlineExceeded) {
			select {
			case <-ctx.Done():
				return fmt.Errorf("waiting for the proxy: %w", ctx.Err())
			case <-time.After(20 * time.Millisecond):
			}
			continue
		}
		if err != nil {
			return err
		}
	}
}

// Admin fetches path (e.g. "/listeners", "/stats?filter=rbac") from Envoy's admin
// interface, which listens on a Unix socket in the run directory.
func (m *Manager) Admin(ctx context.Context, path string) ([]byte, error) {
	c := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", m.adminSock)
		},
	}}
	defer c.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://envoy"+path, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("envoy admin %s: %w", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("envoy admin %s: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return b, fmt.Errorf("envoy admin %s: %s", path, resp.Status)
	}
	return b, nil
}

// LogPath returns Envoy's log file.
func (m *Manager) LogPath() string { return m.logPath }

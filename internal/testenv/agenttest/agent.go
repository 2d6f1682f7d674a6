package agenttest

import (
	"bytes"
	"context"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/agent"
	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/cli"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/fqdn"
	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/testenv"
)

// Options configure StartAgent.
type Options struct {
	// PodCIDR defaults to 198.18.0.0/16. Agents in different node namespaces may share it.
	PodCIDR netip.Prefix
	// PodCIDR6 is agent.Config.PodCIDR6 (zero, the default: IPv4 only): endpoints get
	// IPv6 addresses too (e.g. 2001:2::/64 beside the default 198.18.0.0/16).
	PodCIDR6 netip.Prefix
	// TCPPorts and UDPPorts are served (echo) in every endpoint AddEndpoint creates;
	// default 80 and 81 for both.
	TCPPorts, UDPPorts []uint16
	// NoServers: AddEndpoint starts no servers.
	NoServers bool
	// CIDRHostSlots bounds the agent's CIDR host table (0: 1<<16, enough for the thousands
	// of addresses most tests load). Tests that load millions of prefixes ask for more.
	CIDRHostSlots uint32
	// ProxyEnvoyOnly runs the agent without its HTTP/1.1 fast path: Envoy checks every L7
	// connection.
	ProxyEnvoyOnly bool
	// L7SendSide turns the agent's send-side L7 verdict on (agent.Config.L7SendSide).
	L7SendSide bool
	// DefaultSocket leaves the agent on its instance's default socket
	// (/run/rampart/<instance>.sock), and the CLI finds it with --instance.
	DefaultSocket bool
	// HostTraffic is agent.Config.HostTraffic ("": the agent's default, allow).
	HostTraffic agent.HostTraffic
	// Tunnel is agent.Config.Tunnel ("": native routing).
	Tunnel overlay.Mode
	// VXLANUnderlay is agent.Config.VXLANUnderlay ("": IPv4).
	VXLANUnderlay overlay.Underlay
	// ServiceCgroup is agent.Config.ServiceCgroup: tests that declare Services give the
	// cgroup of their own (testenv.JoinNewCgroup) so that the host's sockets stay as they are.
	ServiceCgroup string
	// FQDN is agent.Config.FQDN: the bounds of the learnt-name cache (toFQDNs).
	FQDN fqdn.Config
}

// Env is an agent running in-process in a fresh node network namespace, with its own
// instance name, state directory, BPF pin directory and socket. Everything is removed when
// the test ends, also when it fails.
type Env struct {
	T      testing.TB
	Config agent.Config
	Client *api.Client
	opts   Options

	// uninstalled: the test ran Uninstall; the cleanup does not run it again.
	uninstalled bool
	mu          sync.Mutex
	agent       *agent.Agent
	cancel      context.CancelFunc
	done        chan error
	servers     map[string]*testenv.Servers // by ns/name
}

// StartAgent starts an agent for the test. It needs root (testenv.RequireRoot is called).
func StartAgent(t testing.TB, opts Options) *Env {
	t.Helper()
	testenv.RequireRoot(t)
	if !opts.PodCIDR.IsValid() {
		opts.PodCIDR = netip.MustParsePrefix("198.18.0.0/16")
	}
	if opts.CIDRHostSlots == 0 {
		opts.CIDRHostSlots = 1 << 16
	}
	if len(opts.TCPPorts) == 0 && len(opts.UDPPorts) == 0 {
		opts.TCPPorts = []uint16{80, 81}
		opts.UDPPorts = []uint16{80, 81}
	}
	instance := "t" + testenv.Suffix(8)
	// Unix socket paths are limited to 108 bytes: keep the socket out of the (long)
	// per-test temporary directory.
	sockDir, err := os.MkdirTemp("", "rp-sock-")
	if err != nil {
		t.Fatal(err)
	}
	e := &Env{
		T:    t,
		opts: opts,
		Config: agent.Config{
			Instance:       instance,
			StateDir:       filepath.Join(t.TempDir(), "state"),
			Socket:         filepath.Join(sockDir, "rampart.sock"),
			BPFDir:         filepath.Join("/sys/fs/bpf/rampart", instance),
			NodeNetns:      "rp-" + instance + "-node",
			PodCIDR:        opts.PodCIDR,
			PodCIDR6:       opts.PodCIDR6,
			CIDRHostSlots:  opts.CIDRHostSlots,
			ProxyEnvoyOnly: opts.ProxyEnvoyOnly,
			L7SendSide:     opts.L7SendSide,
			HostTraffic:    opts.HostTraffic,
			Tunnel:         opts.Tunnel,
			VXLANUnderlay:  opts.VXLANUnderlay,
			ServiceCgroup:  opts.ServiceCgroup,
			FQDN:           opts.FQDN,
			Logger:         slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
		},
		servers: map[string]*testenv.Servers{},
	}
	if opts.DefaultSocket {
		e.Config.Socket = ""
	}
	e.Client = api.NewClient(e.Socket())
	t.Cleanup(func() {
		e.mu.Lock()
		for _, s := range e.servers {
			s.Close()
		}
		e.servers = map[string]*testenv.Servers{}
		e.mu.Unlock()
		e.Stop()
		e.Client.Close()
		if !e.uninstalled {
			if err := agent.Uninstall(e.Config); err != nil {
				t.Errorf("uninstalling test agent: %v", err)
			}
		}
		os.RemoveAll(sockDir)
	})
	e.Start()
	return e
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Socket is the agent's API socket.
func (e *Env) Socket() string {
	if e.Config.Socket == "" {
		return api.SocketFor(e.Config.Instance)
	}
	return e.Config.Socket
}

// Start starts the agent (again, after Stop) with the same configuration.
func (e *Env) Start() {
	e.T.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.agent != nil {
		e.T.Fatal("agent already running")
	}
	a, err := agent.New(e.Config)
	if err != nil {
		e.T.Fatalf("starting agent: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	e.agent, e.cancel, e.done = a, cancel, make(chan error, 1)
	go func() { e.done <- a.Run(ctx) }()
}

// Stop stops the agent as SIGTERM does: the dataplane stays pinned and attached.
func (e *Env) Stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.agent == nil {
		return
	}
	e.cancel()
	if err := <-e.done; err != nil {
		e.T.Errorf("agent stopped with error: %v", err)
	}
	e.agent = nil
	e.Client.Close() // drop idle connections to the old socket
}

// Uninstall stops the agent and runs its uninstall, as rampartd --uninstall does, for a
// test that checks what uninstall leaves; the test's end then has nothing to uninstall.
func (e *Env) Uninstall() error {
	e.Stop()
	e.uninstalled = true
	return agent.Uninstall(e.Config)
}

// Restart stops and starts the agent.
func (e *Env) Restart() {
	e.T.Helper()
	e.Stop()
	e.Start()
}

// CLI runs `rampart --socket <agent socket> args...` in-process and returns its stdout,
// stderr and exit code. stdin is empty unless given with CLIStdin.
func (e *Env) CLI(args ...string) (stdout, stderr string, code int) {
	return e.CLIStdin("", args...)
}

// CLIStdin is CLI with stdin.
func (e *Env) CLIStdin(stdin string, args ...string) (stdout, stderr string, code int) {
	var out, errb bytes.Buffer
	full := append([]string{"--socket", e.Config.Socket}, args...)
	if e.Config.Socket == "" {
		full = append([]string{"--instance", e.Config.Instance}, args...)
	}
	code = cli.Run(context.Background(), full, cli.IO{In: strings.NewReader(stdin), Out: &out, Err: &errb})
	return out.String(), errb.String(), code
}

// MustCLI runs the CLI and fails the test unless it exits 0.
func (e *Env) MustCLI(args ...string) string {
	e.T.Helper()
	out, errs, code := e.CLI(args...)
	if code != 0 {
		e.T.Fatalf("rampart %s: exit %d\nstdout: %s\nstderr: %s", strings.Join(args, " "), code, out, errs)
	}
	return out
}

// AddEndpoint adds endpoint ns/name with labels (and optional extra CLI flags such as
// "--port", "http=80/TCP") and starts echo servers in it.
func (e *Env) AddEndpoint(ns, name string, labels map[string]string, extra ...string) api.Endpoint {
	e.T.Helper()
	var kv []string
	for k, v := range labels {
		kv = append(kv, k+"="+v)
	}
	sort.Strings(kv)
	args := []string{"endpoint", "add", ns + "/" + name, "-o", "json"}
	if len(kv) > 0 {
		args = append(args, "--labels", strings.Join(kv, ","))
	}
	e.MustCLI(append(args, extra...)...)
	ep := e.Endpoint(ns + "/" + name)
	if !e.opts.NoServers {
		s, err := testenv.Serve(ep.Netns, e.opts.TCPPorts, e.opts.UDPPorts)
		if err != nil {
			e.T.Fatalf("starting servers in %s/%s: %v", ns, name, err)
		}
		e.mu.Lock()
		e.servers[ns+"/"+name] = s
		e.mu.Unlock()
	}
	return ep
}

// DeleteEndpoint deletes an endpoint and stops its servers.
func (e *Env) DeleteEndpoint(key string) {
	e.T.Helper()
	e.mu.Lock()
	if s, ok := e.servers[key]; ok {
		s.Close()
		delete(e.servers, key)
	}
	e.mu.Unlock()
	e.MustCLI("endpoint", "delete", key)
}

// Endpoint returns an endpoint from the agent.
func (e *Env) Endpoint(key string) api.Endpoint {
	e.T.Helper()
	ns, name, _ := strings.Cut(key, "/")
	ep, err := e.Client.GetEndpoint(context.Background(), ns, name)
	if err != nil {
		e.T.Fatalf("getting endpoint %s: %v", key, err)
	}
	return ep
}

// IP returns an endpoint's address.
func (e *Env) IP(key string) netip.Addr {
	e.T.Helper()
	return netip.MustParseAddr(e.Endpoint(key).IP)
}

// IP6 returns the IPv6 address of the endpoint "ns/name" (Options.PodCIDR6).
func (e *Env) IP6(key string) netip.Addr {
	e.T.Helper()
	a, err := netip.ParseAddr(e.Endpoint(key).IP6)
	if err != nil {
		e.T.Fatalf("endpoint %s has no IPv6 address: %v", key, err)
	}
	return a
}

// Probe reports whether endpoint from (ns/name) gets an answer from to:port over proto
// ("tcp" or "udp") within timeout.
func (e *Env) Probe(from string, to netip.Addr, port uint16, proto string, timeout time.Duration) bool {
	e.T.Helper()
	ns, name, _ := strings.Cut(from, "/")
	return testenv.Probe(NetnsPathOf(e.Config.Instance, ns, name), netip.AddrPortFrom(to, port), proto, timeout)
}

// NetnsPathOf is the network namespace path of an endpoint of an instance.
func NetnsPathOf(instance, ns, name string) string {
	return endpoint.NetnsPath(endpoint.Node{Instance: instance}.EndpointNetns(ns, name))
}

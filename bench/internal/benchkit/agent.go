package benchkit

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/rampartnet/rampart/internal/api"
)

// Agent is a rampartd started by a benchmark, with its own instance name, node network
// namespace, state directory, socket and pin directory, so that it can run beside tests and
// other agents.
type Agent struct {
	Rampartd, Rampart string
	Instance          string
	// Args are the instance flags shared by the agent and --uninstall.
	Args           []string
	Socket, BPFDir string
	// Wrap is put before the rampartd command line, e.g. taskset -c 1 to pin the agent
	// (and the proxy it runs as its child, which inherits the CPU mask).
	Wrap []string
	// Flags are rampartd flags for the agent only (not for --uninstall).
	Flags []string
	// UninstallTimeout bounds --uninstall in Stop (0: one minute). An agent with
	// thousands of endpoints takes longer.
	UninstallTimeout time.Duration
	proc             *Daemon
	endpoints        map[string]api.Endpoint // by namespace/name
}

// NewAgent describes an agent for instance; its state and socket go into workDir.
func NewAgent(rampartd, rampart, instance, workDir string, podCIDR netip.Prefix) *Agent {
	a := &Agent{
		Rampartd:  rampartd,
		Rampart:   rampart,
		Instance:  instance,
		Socket:    filepath.Join(workDir, "rampart.sock"),
		BPFDir:    filepath.Join("/sys/fs/bpf/rampart", instance),
		endpoints: map[string]api.Endpoint{},
	}
	a.Args = []string{
		"--instance", instance,
		"--state-dir", filepath.Join(workDir, "state"),
		"--socket", a.Socket,
		"--bpf-dir", a.BPFDir,
		"--node-netns", a.NodeNetns(),
		"--pod-cidr", podCIDR.String(),
	}
	return a
}

// DualStack makes the agent's endpoints dual-stack: its pod range is the IPv4 one and p6
// (rampartd --pod-cidr v4,v6). Before Start.
func (a *Agent) DualStack(p6 netip.Prefix) {
	for i := 0; i+1 < len(a.Args); i++ {
		if a.Args[i] == "--pod-cidr" {
			a.Args[i+1] += "," + p6.String()
		}
	}
}

// NodeNetns is the name of the agent's node network namespace (under /run/netns).
func (a *Agent) NodeNetns() string { return "rp-" + a.Instance + "-node" }

// Start runs the agent and waits until its API answers.
func (a *Agent) Start(ctx context.Context, d *Daemons) error {
	argv := append(append([]string{}, a.Wrap...), a.Rampartd)
	argv = append(append(argv, a.Args...), a.Flags...)
	p, err := d.Start("rampartd", exec.Command(argv[0], argv[1:]...))
	if err != nil {
		return err
	}
	a.proc = p
	deadline := time.Now().Add(30 * time.Second)
	for {
		if done, err := p.Exited(); done {
			return err
		}
		_, err := a.CLI(ctx, 5*time.Second, "status", "-o", "json")
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting for the agent API: %w", err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Restart stops the agent's process, leaving its instance as it is (endpoints, pins,
// state), and starts rampartd on it: another build, or the same one again.
func (a *Agent) Restart(ctx context.Context, d *Daemons, rampartd string) error {
	if a.proc != nil {
		if err := a.proc.Stop(10 * time.Second); err != nil {
			return fmt.Errorf("stopping the agent: %w", err)
		}
	}
	a.Rampartd = rampartd
	return a.Start(ctx, d)
}

// Pid is the agent's process id (of the first command of Wrap if it does not exec; taskset
// does), or 0 before Start.
func (a *Agent) Pid() int {
	if a.proc == nil {
		return 0
	}
	return a.proc.Pid()
}

// Exited reports whether the agent has stopped, and why.
func (a *Agent) Exited() (bool, error) {
	if a.proc == nil {
		return false, nil
	}
	return a.proc.Exited()
}

// Stop stops the agent and removes everything its instance created (endpoints and their
// namespaces, node namespace, pins, state), as `rampartd --uninstall` does.
func (a *Agent) Stop() error {
	var errs []error
	if a.proc != nil {
		errs = append(errs, a.proc.Stop(10*time.Second))
	}
	timeout := a.UninstallTimeout
	if timeout <= 0 {
		timeout = time.Minute
	}
	if _, err := RunOutput(context.Background(), timeout, func(ctx context.Context) *exec.Cmd {
		return OwnGroup(exec.CommandContext(ctx, a.Rampartd, append(append([]string{}, a.Args...), "--uninstall")...))
	}); err != nil {
		errs = append(errs, fmt.Errorf("uninstalling the benchmark agent: %w", err))
	}
	return errors.Join(errs...)
}

// CLI runs `rampart --socket S args...` and returns its stdout.
func (a *Agent) CLI(ctx context.Context, timeout time.Duration, args ...string) ([]byte, error) {
	return RunOutput(ctx, timeout, func(ctx context.Context) *exec.Cmd {
		return OwnGroup(exec.CommandContext(ctx, a.Rampart, append([]string{"--socket", a.Socket}, args...)...))
	})
}

// Status returns the agent's status.
func (a *Agent) Status(ctx context.Context) (api.Status, error) {
	var st api.Status
	out, err := a.CLI(ctx, time.Minute, "status", "-o", "json")
	if err != nil {
		return st, fmt.Errorf("agent status: %w", err)
	}
	if err := json.Unmarshal(out, &st); err != nil {
		return st, fmt.Errorf("reading agent status: %w", err)
	}
	return st, nil
}

// Policies returns how many policies the agent stores.
func (a *Agent) Policies(ctx context.Context) (int, error) {
	st, err := a.Status(ctx)
	return st.Policies, err
}

// Endpoint is an endpoint a benchmark created.
type Endpoint struct {
	Name string // namespace/name
	IP   netip.Addr
	IP6  netip.Addr // a dual-stack agent's or topology's endpoints (DualStack)
	API  api.Endpoint
	// Command returns a command running argv inside the endpoint's network namespace, in
	// its own process group (see OwnGroup).
	Command func(ctx context.Context, argv ...string) *exec.Cmd
}

// AddEndpoint creates endpoint namespace/name with labels ("k=v") and a fixed address;
// extra are more `rampart endpoint add` flags (--monitor).
func (a *Agent) AddEndpoint(ctx context.Context, namespace, name string, labels []string, ip netip.Addr, extra ...string) (*Endpoint, error) {
	ref := namespace + "/" + name
	args := append([]string{"endpoint", "add", ref, "--labels", strings.Join(labels, ","), "--ip", ip.String(), "-o", "json"}, extra...)
	out, err := a.CLI(ctx, time.Minute, args...)
	if err != nil {
		return nil, fmt.Errorf("adding endpoint %s: %w", ref, err)
	}
	var ep api.Endpoint
	if err := json.Unmarshal(out, &ep); err != nil {
		return nil, fmt.Errorf("reading endpoint %s: %w", ref, err)
	}
	if ep.IP != ip.String() || ep.EpID == 0 {
		return nil, fmt.Errorf("endpoint %s: got address %q and ep_id %d, want %v and an ep_id", ref, ep.IP, ep.EpID, ip)
	}
	a.endpoints[ref] = ep
	var ip6 netip.Addr
	if ep.IP6 != "" {
		if ip6, err = netip.ParseAddr(ep.IP6); err != nil {
			return nil, fmt.Errorf("endpoint %s: IPv6 address %q: %w", ref, ep.IP6, err)
		}
	}
	return &Endpoint{
		Name: ref,
		IP:   ip,
		IP6:  ip6,
		API:  ep,
		// Through the CLI, as users run commands in endpoints.
		Command: func(ctx context.Context, argv ...string) *exec.Cmd {
			args := append([]string{"--socket", a.Socket, "endpoint", "exec", ref, "--"}, argv...)
			return OwnGroup(exec.CommandContext(ctx, a.Rampart, args...))
		},
	}, nil
}

// PolicyEntries counts the policy map entries of endpoint ref (namespace/name), read from
// the pinned map itself: what the dataplane consults, not what the agent believes it wrote.
func (a *Agent) PolicyEntries(ref string) (int, error) {
	ep, ok := a.endpoints[ref]
	if !ok {
		return 0, fmt.Errorf("unknown endpoint %s", ref)
	}
	return PolicyEntries(a.BPFDir, ep.EpID)
}

// PolicyEntries counts the entries of endpoint epID in the policy map pinned in bpfDir.
func PolicyEntries(bpfDir string, epID uint32) (int, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(bpfDir, "policy"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return 0, fmt.Errorf("opening pinned policy map: %w", err)
	}
	defer m.Close()
	// struct policy_key (bpf/include/rampart.h): prefixlen u32, ep_id u32, identity u32,
	// direction u8, protocol u8, dport be16; ep_id in host byte order.
	if m.KeySize() != 16 {
		return 0, fmt.Errorf("policy map key size %d, want 16 (struct policy_key changed?)", m.KeySize())
	}
	key := make([]byte, m.KeySize())
	val := make([]byte, m.ValueSize())
	n := 0
	it := m.Iterate()
	for it.Next(&key, &val) {
		if binary.NativeEndian.Uint32(key[4:8]) == epID {
			n++
		}
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("iterating policy map: %w", err)
	}
	return n, nil
}

// TapRemoteCounters reads what the agent counted of the copies other nodes mirrored to its
// monitors (rampart status, monitors): copies handed to a monitor here, and copies dropped
// for no monitor here.
func (a *Agent) TapRemoteCounters(ctx context.Context) (delivered, lost uint64, err error) {
	st, err := a.Status(ctx)
	if err != nil {
		return 0, 0, err
	}
	if m := st.Monitors; m != nil {
		if m.Error != "" {
			return 0, 0, fmt.Errorf("reading the monitors' counters: %s", m.Error)
		}
		return m.CopiesFromOtherNodes, m.CopiesFromOtherNodesLost, nil
	}
	return 0, 0, nil
}

package policyoverhead

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/cilium/ebpf"

	"github.com/rampartnet/rampart/internal/api"
)

// agentProc is a rampartd started by the benchmark, with its own instance name, node
// network namespace, state directory, socket and pin directory, so that it can run beside
// tests and other agents.
type agentProc struct {
	rampartd, rampart string
	args              []string // instance flags shared by the agent and --uninstall
	socket, bpfDir    string
	proc              *daemon
	endpoints         map[string]api.Endpoint // by endpoint name
}

func newAgentProc(rampartd, rampart, instance, workDir string, podCIDR netip.Prefix) *agentProc {
	a := &agentProc{
		rampartd:  rampartd,
		rampart:   rampart,
		socket:    filepath.Join(workDir, "rampart.sock"),
		bpfDir:    filepath.Join("/sys/fs/bpf/rampart", instance),
		endpoints: map[string]api.Endpoint{},
	}
	a.args = []string{
		"--instance", instance,
		"--state-dir", filepath.Join(workDir, "state"),
		"--socket", a.socket,
		"--bpf-dir", a.bpfDir,
		"--node-netns", "rp-" + instance + "-node",
		"--pod-cidr", podCIDR.String(),
	}
	return a
}

// start runs the agent and waits until its API answers.
func (a *agentProc) start(ctx context.Context, d *daemons) error {
	p, err := d.start("rampartd", exec.Command(a.rampartd, a.args...))
	if err != nil {
		return err
	}
	a.proc = p
	deadline := time.Now().Add(30 * time.Second)
	for {
		if done, err := p.exited(); done {
			return err
		}
		_, err := a.cli(ctx, 5*time.Second, "status", "-o", "json")
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

// stop stops the agent and removes everything its instance created (endpoints and their
// namespaces, node namespace, pins, state), as `rampartd --uninstall` does.
func (a *agentProc) stop() error {
	var errs []error
	if a.proc != nil {
		errs = append(errs, a.proc.stop(10*time.Second))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := runOutput(ctx, time.Minute, func(ctx context.Context) *exec.Cmd {
		return ownGroup(exec.CommandContext(ctx, a.rampartd, append(a.args, "--uninstall")...))
	}); err != nil {
		errs = append(errs, fmt.Errorf("uninstalling the benchmark agent: %w", err))
	}
	return errors.Join(errs...)
}

// cli runs `rampart --socket S args...` and returns its stdout.
func (a *agentProc) cli(ctx context.Context, timeout time.Duration, args ...string) ([]byte, error) {
	return runOutput(ctx, timeout, func(ctx context.Context) *exec.Cmd {
		return ownGroup(exec.CommandContext(ctx, a.rampart, append([]string{"--socket", a.socket}, args...)...))
	})
}

// policies returns how many policies the agent stores.
func (a *agentProc) policies(ctx context.Context) (int, error) {
	out, err := a.cli(ctx, time.Minute, "status", "-o", "json")
	if err != nil {
		return 0, fmt.Errorf("agent status: %w", err)
	}
	var st api.Status
	if err := json.Unmarshal(out, &st); err != nil {
		return 0, fmt.Errorf("reading agent status: %w", err)
	}
	return st.Policies, nil
}

// addEndpoint creates endpoint bench/name with the app label and a fixed address.
func (a *agentProc) addEndpoint(ctx context.Context, name, app string, ip netip.Addr) (*benchEndpoint, error) {
	ref := benchNamespace + "/" + name
	out, err := a.cli(ctx, time.Minute, "endpoint", "add", ref, "--labels", "app="+app, "--ip", ip.String(), "-o", "json")
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
	a.endpoints[name] = ep
	return &benchEndpoint{
		Name: name,
		IP:   ip,
		// Through the CLI, as users run commands in endpoints.
		Command: func(ctx context.Context, argv ...string) *exec.Cmd {
			args := append([]string{"--socket", a.socket, "endpoint", "exec", ref, "--"}, argv...)
			return ownGroup(exec.CommandContext(ctx, a.rampart, args...))
		},
	}, nil
}

// policyEntries counts the policy map entries of endpoint name, read from the pinned map
// itself: what the dataplane consults, not what the agent believes it wrote.
func (a *agentProc) policyEntries(name string) (int, error) {
	ep, ok := a.endpoints[name]
	if !ok {
		return 0, fmt.Errorf("unknown endpoint %s", name)
	}
	m, err := ebpf.LoadPinnedMap(filepath.Join(a.bpfDir, "policy"), &ebpf.LoadPinOptions{ReadOnly: true})
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
		if binary.NativeEndian.Uint32(key[4:8]) == ep.EpID {
			n++
		}
	}
	if err := it.Err(); err != nil {
		return 0, fmt.Errorf("iterating policy map: %w", err)
	}
	return n, nil
}

// writeFile writes a policy file into dir.
func writeFile(dir, name string, data []byte) (string, error) {
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		return "", fmt.Errorf("writing %s: %w", name, err)
	}
	return p, nil
}

package cluster

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/endpoint"
)

// Nodes of a two-node cluster.
const (
	NodeA = 0 // the clients' node
	NodeB = 1 // the servers' node: policy is applied here
)

// NodeName is the name of node i (0: node-a, 1: node-b, ...).
func NodeName(i int) string { return "node-" + string(rune('a'+i)) }

// PodSpec is a pod to create.
type PodSpec struct {
	Node            int // NodeA, NodeB, or another node of an agent cluster
	Namespace, Name string
	Labels          []string // k=v
	// Monitor makes the pod a tap monitor endpoint (`rampart endpoint add --monitor`),
	// declared as one on the other nodes (agent clusters only).
	Monitor bool
}

// Pod is a pod the benchmark created.
type Pod struct {
	Name  string // namespace/name
	Node  int
	IP    netip.Addr
	MTU   int    // of the pod's interface
	Netns string // path of the pod's network namespace
	// Command returns a command running argv in the pod's network namespace, in its own
	// process group (benchkit.OwnGroup).
	Command func(ctx context.Context, argv ...string) *exec.Cmd
}

// Cluster is what the benchmark needs of two nodes with pods. The agent cluster below
// makes one with rampartd in node namespaces and declares the nodes and pods through the
// agent API; a cluster whose pods a Kubernetes API server and a pod runner create can
// implement the same.
type Cluster interface {
	// Mode is the tunnel mode between the nodes (native, vxlan, ipip).
	Mode() string
	// AddPods creates pods on their nodes and makes each known to the other node. It is
	// called once, with every pod the benchmark needs.
	AddPods(ctx context.Context, specs []PodSpec) ([]*Pod, error)
	// Apply and Delete apply and delete the policy manifests in file on node.
	Apply(ctx context.Context, node int, file string) error
	Delete(ctx context.Context, node int, file string) error
	// PolicyEntries counts the dataplane's policy entries of pod, read from the node's
	// pinned map: what enforcement uses, not what the control plane believes.
	PolicyEntries(pod *Pod) (int, error)
	// Close removes everything the cluster made.
	Close() error
}

// fabricAddr is node i's address on its fabric veth to node j: each pair of nodes has a
// veth and a /24 of its own, 198.19.255.0/24 for nodes 0 and 1 (198.19.255.1 and .2),
// 198.19.254.0/24 for 0 and 2, and so on down.
func fabricAddr(i, j int) netip.Addr {
	lo, hi := min(i, j), max(i, j)
	link := hi*(hi-1)/2 + lo // 0: (0,1), 1: (0,2), 2: (1,2), ...
	return netip.AddrFrom4([4]byte{198, 19, byte(255 - link), byte(i + 1)})
}

// ErrModeUnavailable wraps an agent's refusal of a tunnel mode it does not implement.
var ErrModeUnavailable = errors.New("tunnel mode not available")

// AgentCluster is rampartd in node namespaces, every two joined by a fabric veth.
type AgentCluster struct {
	mode     string
	agents   []*benchkit.Agent
	cidrs    []netip.Prefix
	daemons  *benchkit.Daemons
	workDir  string
	next     []uint32 // next host number per node
	byName   map[string]*benchkit.Endpoint
	cleanups []func() error
}

// AgentBinaries are the agent and CLI binaries an agent cluster runs.
type AgentBinaries struct{ Rampartd, Rampart string }

// NewAgentCluster starts two agents with --tunnel=mode, each in its own node namespace
// (instance names prefix+"a" and prefix+"b"), joins the namespaces with a fabric veth and
// declares each node on the other. A mode the agent refuses gives ErrModeUnavailable.
func NewAgentCluster(ctx context.Context, bin AgentBinaries, mode, prefix string, d *benchkit.Daemons) (Cluster, error) {
	c, err := NewAgentNodes(ctx, bin, mode, prefix, 2, d)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// NewAgentNodes is NewAgentCluster with n nodes (instance names prefix+"a", +"b", ...),
// every two joined by a fabric veth of their own and declared on each other: the flow tap
// benchmark's three nodes.
func NewAgentNodes(ctx context.Context, bin AgentBinaries, mode, prefix string, n int, d *benchkit.Daemons) (_ *AgentCluster, err error) {
	c := &AgentCluster{mode: mode, daemons: d, byName: map[string]*benchkit.Endpoint{},
		agents: make([]*benchkit.Agent, n), next: make([]uint32, n)}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Close())
		}
	}()
	if c.workDir, err = os.MkdirTemp("", "rp-cluster-"); err != nil {
		return nil, err
	}
	c.cleanups = append(c.cleanups, func() error { return os.RemoveAll(c.workDir) })
	c.cidrs = benchkit.PodCIDRs(n)
	for i := range n {
		inst := prefix + string(rune('a'+i))
		dir := filepath.Join(c.workDir, inst)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		a := benchkit.NewAgent(bin.Rampartd, bin.Rampart, inst, dir, c.cidrs[i])
		a.Flags = []string{"--tunnel", mode}
		c.agents[i] = a
		// Registered before the start, so a half-started agent is uninstalled too.
		c.cleanups = append(c.cleanups, a.Stop)
		if err := a.Start(ctx, d); err != nil {
			// The agent checks its configuration before anything else: a refused
			// mode is named in its last words.
			if strings.Contains(err.Error(), `tunnel "`+mode+`"`) {
				// It stopped before making anything: nothing of it to uninstall.
				c.cleanups = c.cleanups[:len(c.cleanups)-1]
				return nil, fmt.Errorf("%w: %v", ErrModeUnavailable, lastLine(err.Error()))
			}
			return nil, fmt.Errorf("starting the agent of %s: %w", NodeName(i), err)
		}
		c.next[i] = 10
	}
	for i := range n {
		for j := i + 1; j < n; j++ {
			if err := linkFabric(c.agents[i].NodeNetns(), c.agents[j].NodeNetns(), fabricAddr(i, j), fabricAddr(j, i)); err != nil {
				return nil, err
			}
		}
	}
	for i := range n {
		for o := range n {
			if o == i {
				continue
			}
			if _, err := c.agents[i].CLI(ctx, time.Minute, "node", "add", NodeName(o),
				"--address", fabricAddr(o, i).String(), "--pod-cidr", c.cidrs[o].String()); err != nil {
				return nil, fmt.Errorf("declaring %s on %s: %w", NodeName(o), NodeName(i), err)
			}
		}
	}
	return c, nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

func (c *AgentCluster) Mode() string { return c.mode }

// Agent is node i's agent (for commands the Cluster interface does not have).
func (c *AgentCluster) Agent(i int) *benchkit.Agent { return c.agents[i] }

// AddPods creates node A's pods and declares them on the other nodes with the identities
// node A gave them, then node B's, and so on: each node allocates identities on its own
// until identities are allocated cluster-wide, and a node allocates around the identities
// already declared to it (as test/e2e/overlay_test.go does).
func (c *AgentCluster) AddPods(ctx context.Context, specs []PodSpec) ([]*Pod, error) {
	out := make([]*Pod, len(specs))
	for node := range c.agents {
		var made []int
		for i, s := range specs {
			if s.Node != node {
				continue
			}
			if c.next[node] >= 250 {
				return nil, fmt.Errorf("%s: more pods than its /24 holds", NodeName(node))
			}
			ip := benchkit.HostAddr(c.cidrs[node], c.next[node])
			c.next[node]++
			var extra []string
			if s.Monitor {
				extra = []string{"--monitor"}
			}
			ep, err := c.agents[node].AddEndpoint(ctx, s.Namespace, s.Name, s.Labels, ip, extra...)
			if err != nil {
				return nil, err
			}
			mtu, err := podMTU(ep.API.Netns)
			if err != nil {
				return nil, err
			}
			path := ep.API.Netns
			out[i] = &Pod{Name: ep.Name, Node: node, IP: ip, MTU: mtu, Netns: path, Command: nsenterCommand(path)}
			c.byName[ep.Name] = ep
			made = append(made, i)
		}
		for o, other := range c.agents {
			if o == node {
				continue
			}
			for _, i := range made {
				s, p := specs[i], out[i]
				ep := c.byName[p.Name]
				args := []string{"remote", "add", p.Name, "--node", NodeName(node),
					"--ip", p.IP.String(), "--labels", strings.Join(s.Labels, ","),
					"--identity", strconv.FormatUint(uint64(ep.API.Identity), 10)}
				if s.Monitor {
					args = append(args, "--monitor")
				}
				if _, err := other.CLI(ctx, time.Minute, args...); err != nil {
					return nil, fmt.Errorf("declaring %s on %s: %w", p.Name, NodeName(o), err)
				}
			}
		}
	}
	return out, nil
}

func (c *AgentCluster) Apply(ctx context.Context, node int, file string) error {
	if _, err := c.agents[node].CLI(ctx, 10*time.Minute, "apply", "-f", file); err != nil {
		return fmt.Errorf("applying %s on %s: %w", filepath.Base(file), NodeName(node), err)
	}
	return nil
}

func (c *AgentCluster) Delete(ctx context.Context, node int, file string) error {
	if _, err := c.agents[node].CLI(ctx, 10*time.Minute, "delete", "-f", file); err != nil {
		return fmt.Errorf("deleting %s on %s: %w", filepath.Base(file), NodeName(node), err)
	}
	return nil
}

func (c *AgentCluster) PolicyEntries(p *Pod) (int, error) {
	return c.agents[p.Node].PolicyEntries(p.Name)
}

func (c *AgentCluster) Close() error {
	var errs []error
	for i := len(c.cleanups) - 1; i >= 0; i-- {
		errs = append(errs, c.cleanups[i]())
	}
	c.cleanups = nil
	return errors.Join(errs...)
}

// nsenterCommand runs argv in the network namespace at path. Only the network namespace
// is switched (not `ip netns exec`, which remounts /sys).
func nsenterCommand(path string) func(ctx context.Context, argv ...string) *exec.Cmd {
	return func(ctx context.Context, argv ...string) *exec.Cmd {
		args := append([]string{"--net=" + path, "--"}, argv...)
		return benchkit.OwnGroup(exec.CommandContext(ctx, "nsenter", args...))
	}
}

// podMTU reads the MTU of the pod's interface in the namespace at path.
func podMTU(path string) (int, error) {
	ns, err := netns.GetFromPath(path)
	if err != nil {
		return 0, fmt.Errorf("opening %s: %w", path, err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	l, err := h.LinkByName(endpoint.PodIfName)
	if err != nil {
		return 0, fmt.Errorf("pod interface in %s: %w", path, err)
	}
	return l.Attrs().MTU, nil
}

// ip runs the ip command.
func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// linkFabric joins two network namespaces (names under /run/netns) with a veth, the
// fabric between two nodes: addrA (in a /24) on the first side, addrB on the second. The
// veth goes with the namespaces.
func linkFabric(nsA, nsB string, addrA, addrB netip.Addr) error {
	sfx := benchkit.Suffix()[:6]
	a, b := "rpf"+sfx, "rpg"+sfx
	steps := [][]string{
		{"-n", nsA, "link", "add", a, "type", "veth", "peer", "name", b, "netns", nsB},
		{"-n", nsA, "addr", "add", addrA.String() + "/24", "dev", a},
		{"-n", nsB, "addr", "add", addrB.String() + "/24", "dev", b},
		{"-n", nsA, "link", "set", a, "up"},
		{"-n", nsB, "link", "set", b, "up"},
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			return fmt.Errorf("fabric: %w", err)
		}
	}
	return nil
}

// bareFabric is two namespaces joined by a fabric veth, with no agent and no pods: the
// floor the overlay experiment measures every mode against. Its two pods are the
// namespaces themselves, addressed on the fabric.
type bareFabric struct {
	ns   [2]string
	pods [2]*Pod
}

func newBareFabric(prefix string) (_ *bareFabric, err error) {
	f := &bareFabric{}
	defer func() {
		if err != nil {
			err = errors.Join(err, f.Close())
		}
	}()
	for i := range 2 {
		name := prefix + string(rune('a'+i))
		if err := ip("netns", "add", name); err != nil {
			return nil, err
		}
		f.ns[i] = name
		if err := ip("-n", name, "link", "set", "lo", "up"); err != nil {
			return nil, err
		}
	}
	if err := linkFabric(f.ns[0], f.ns[1], fabricAddr(0, 1), fabricAddr(1, 0)); err != nil {
		return nil, err
	}
	for i := range 2 {
		path := filepath.Join("/run/netns", f.ns[i])
		f.pods[i] = &Pod{Name: "fabric/" + f.ns[i], Node: i, IP: fabricAddr(i, 1-i), MTU: 1500, Netns: path,
			Command: nsenterCommand(path)}
	}
	return f, nil
}

func (f *bareFabric) Close() error {
	var errs []error
	for _, n := range f.ns {
		if n != "" {
			errs = append(errs, ip("netns", "delete", n))
		}
	}
	return errors.Join(errs...)
}

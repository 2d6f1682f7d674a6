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

var nodeNames = [2]string{"node-a", "node-b"}

// PodSpec is a pod to create.
type PodSpec struct {
	Node            int // NodeA or NodeB
	Namespace, Name string
	Labels          []string // k=v
}

// Pod is a pod the benchmark created.
type Pod struct {
	Name string // namespace/name
	Node int
	IP   netip.Addr
	MTU  int // of the pod's interface
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

// Fabric addresses of the two nodes, in one /24 on the fabric veth.
var fabricAddrs = [2]netip.Addr{netip.MustParseAddr("198.19.255.1"), netip.MustParseAddr("198.19.255.2")}

// ErrModeUnavailable wraps an agent's refusal of a tunnel mode it does not implement.
var ErrModeUnavailable = errors.New("tunnel mode not available")

// agentCluster is two rampartd in node namespaces joined by a fabric veth.
type agentCluster struct {
	mode     string
	agents   [2]*benchkit.Agent
	cidrs    [2]netip.Prefix
	daemons  *benchkit.Daemons
	workDir  string
	next     [2]uint32 // next host number per node
	byName   map[string]*benchkit.Endpoint
	cleanups []func() error
}

// AgentBinaries are the agent and CLI binaries an agent cluster runs.
type AgentBinaries struct{ Rampartd, Rampart string }

// NewAgentCluster starts two agents with --tunnel=mode, each in its own node namespace
// (instance names prefix+"a" and prefix+"b"), joins the namespaces with a fabric veth and
// declares each node on the other. A mode the agent refuses gives ErrModeUnavailable.
func NewAgentCluster(ctx context.Context, bin AgentBinaries, mode, prefix string, d *benchkit.Daemons) (_ Cluster, err error) {
	c := &agentCluster{mode: mode, daemons: d, byName: map[string]*benchkit.Endpoint{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, c.Close())
		}
	}()
	if c.workDir, err = os.MkdirTemp("", "rp-cluster-"); err != nil {
		return nil, err
	}
	c.cleanups = append(c.cleanups, func() error { return os.RemoveAll(c.workDir) })
	cidrs := benchkit.PodCIDRs(2)
	for i := range 2 {
		c.cidrs[i] = cidrs[i]
		inst := prefix + string(rune('a'+i))
		dir := filepath.Join(c.workDir, inst)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, err
		}
		a := benchkit.NewAgent(bin.Rampartd, bin.Rampart, inst, dir, cidrs[i])
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
			return nil, fmt.Errorf("starting the agent of %s: %w", nodeNames[i], err)
		}
		c.next[i] = 10
	}
	if err := linkFabric(c.agents[0].NodeNetns(), c.agents[1].NodeNetns()); err != nil {
		return nil, err
	}
	for i := range 2 {
		o := 1 - i
		if _, err := c.agents[i].CLI(ctx, time.Minute, "node", "add", nodeNames[o],
			"--address", fabricAddrs[o].String(), "--pod-cidr", c.cidrs[o].String()); err != nil {
			return nil, fmt.Errorf("declaring %s on %s: %w", nodeNames[o], nodeNames[i], err)
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

func (c *agentCluster) Mode() string { return c.mode }

// AddPods creates node A's pods and declares them on node B with the identities node A
// gave them, then node B's, declared on node A: each node allocates identities on its
// own until identities are allocated cluster-wide, and a node allocates around the
// identities already declared to it (as test/e2e/overlay_test.go does).
func (c *agentCluster) AddPods(ctx context.Context, specs []PodSpec) ([]*Pod, error) {
	out := make([]*Pod, len(specs))
	for node := range 2 {
		var made []int
		for i, s := range specs {
			if s.Node != node {
				continue
			}
			if c.next[node] >= 250 {
				return nil, fmt.Errorf("%s: more pods than its /24 holds", nodeNames[node])
			}
			ip := benchkit.HostAddr(c.cidrs[node], c.next[node])
			c.next[node]++
			ep, err := c.agents[node].AddEndpoint(ctx, s.Namespace, s.Name, s.Labels, ip)
			if err != nil {
				return nil, err
			}
			mtu, err := podMTU(ep.API.Netns)
			if err != nil {
				return nil, err
			}
			path := ep.API.Netns
			out[i] = &Pod{Name: ep.Name, Node: node, IP: ip, MTU: mtu, Command: nsenterCommand(path)}
			c.byName[ep.Name] = ep
			made = append(made, i)
		}
		other := c.agents[1-node]
		for _, i := range made {
			s, p := specs[i], out[i]
			ep := c.byName[p.Name]
			if _, err := other.CLI(ctx, time.Minute, "remote", "add", p.Name, "--node", nodeNames[node],
				"--ip", p.IP.String(), "--labels", strings.Join(s.Labels, ","),
				"--identity", strconv.FormatUint(uint64(ep.API.Identity), 10)); err != nil {
				return nil, fmt.Errorf("declaring %s on %s: %w", p.Name, nodeNames[1-node], err)
			}
		}
	}
	return out, nil
}

func (c *agentCluster) Apply(ctx context.Context, node int, file string) error {
	if _, err := c.agents[node].CLI(ctx, 10*time.Minute, "apply", "-f", file); err != nil {
		return fmt.Errorf("applying %s on %s: %w", filepath.Base(file), nodeNames[node], err)
	}
	return nil
}

func (c *agentCluster) Delete(ctx context.Context, node int, file string) error {
	if _, err := c.agents[node].CLI(ctx, 10*time.Minute, "delete", "-f", file); err != nil {
		return fmt.Errorf("deleting %s on %s: %w", filepath.Base(file), nodeNames[node], err)
	}
	return nil
}

func (c *agentCluster) PolicyEntries(p *Pod) (int, error) {
	return c.agents[p.Node].PolicyEntries(p.Name)
}

func (c *agentCluster) Close() error {
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
// fabric between nodes: fabricAddrs[0] on the first side, [1] on the second. The veth goes
// with the namespaces.
func linkFabric(nsA, nsB string) error {
	sfx := benchkit.Suffix()[:6]
	a, b := "rpf"+sfx, "rpg"+sfx
	steps := [][]string{
		{"-n", nsA, "link", "add", a, "type", "veth", "peer", "name", b, "netns", nsB},
		{"-n", nsA, "addr", "add", fabricAddrs[0].String() + "/24", "dev", a},
		{"-n", nsB, "addr", "add", fabricAddrs[1].String() + "/24", "dev", b},
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
	if err := linkFabric(f.ns[0], f.ns[1]); err != nil {
		return nil, err
	}
	for i := range 2 {
		f.pods[i] = &Pod{Name: "fabric/" + f.ns[i], Node: i, IP: fabricAddrs[i], MTU: 1500,
			Command: nsenterCommand(filepath.Join("/run/netns", f.ns[i]))}
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

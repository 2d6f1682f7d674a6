package egress

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/api"
)

// Names the Rampart filter uses: the CIDR group (set) and the policy that denies it.
const (
	cidrGroup  = "egress-blocklist"
	clientApp  = "bench-client"
	policyName = "egress-blocklist"
)

// rampartPolicy denies the client's egress to the group and nothing else: deny-only rules
// would switch egress default deny on (as in Cilium), so enableDefaultDeny keeps the rest
// of the client's egress open, as a blocklist means.
var rampartPolicy = benchkit.CiliumPolicyHead(policyName, benchNamespace, clientApp) + fmt.Sprintf(`  enableDefaultDeny:
    egress: false
  egressDeny:
  - toCIDRSet:
    - cidrGroupRef: %s
`, cidrGroup)

// rampartFilter is Rampart itself: its own agent with the client as its endpoint, the list
// loaded as a CIDR set, and a policy that denies the client's egress to the set. The server
// is a plain namespace behind the agent's node (see addServer).
type rampartFilter struct {
	topo       *topology
	agent      *benchkit.Agent
	timeout    time.Duration
	listPath   string
	policyPath string
}

func (f *rampartFilter) Name() string        { return FilterRampart }
func (f *rampartFilter) daemonPid() int      { return f.agent.Pid() }
func (f *rampartFilter) Topology() *topology { return f.topo }

// startRampart starts an agent for instance, with rampartd flags besides the benchmark's
// own, with the client endpoint, and the server (in serverCIDR) and world namespaces
// behind its node namespace, and returns the filter. The
// agent is stopped and uninstalled by stop, also after a partial failure.
func startRampart(ctx context.Context, cfg *Config, daemons *benchkit.Daemons, instance, workDir string, podCIDR, serverCIDR, worldCIDR netip.Prefix, flags []string) (f *rampartFilter, stop func() error, err error) {
	agent := benchkit.NewAgent(cfg.Rampartd, cfg.Rampart, instance, workDir, podCIDR)
	agent.Flags = append(agent.Flags, flags...)
	if cfg.IPv6 {
		agent.DualStack(range6Of(podCIDR, true))
	}
	f = &rampartFilter{agent: agent, timeout: cfg.Budget, policyPath: filepath.Join(workDir, "egress-policy.yaml")}
	topo := &topology{Name: "agent", IPv6: cfg.IPv6}
	f.topo = topo
	stop = func() error {
		// The server and world first (they live in the agent's node namespace), then the agent, which
		// uninstalls its endpoints, node namespace and pins. Not through f: a failure returns
		// it nil.
		return errors.Join(topo.Close(), agent.Stop())
	}
	if err := agent.Start(ctx, daemons); err != nil {
		return nil, stop, err
	}
	ep, err := agent.AddEndpoint(ctx, benchNamespace, "client", []string{"app=" + clientApp}, benchkit.HostAddr(podCIDR, 10))
	if err != nil {
		return nil, stop, err
	}
	f.topo.Client = &host{Name: "client", IP: ep.IP, IP6: ep.IP6, Netns: ep.API.Netns, HostIf: ep.API.HostInterface}
	if cfg.IPv6 && !ep.IP6.IsValid() {
		return nil, stop, fmt.Errorf("the agent gave the client no IPv6 address (endpoint %+v)", ep.API)
	}
	if err := f.topo.addServer(agent.NodeNetns(), instance, serverCIDR); err != nil {
		return nil, stop, err
	}
	if err := f.topo.addWorld(agent.NodeNetns(), instance, worldCIDR); err != nil {
		return nil, stop, err
	}
	if err := os.WriteFile(f.policyPath, []byte(rampartPolicy), 0o600); err != nil {
		return nil, stop, fmt.Errorf("writing the policy: %w", err)
	}
	return f, stop, nil
}

// rampartAvailable says why the agent cannot run the filter ("" when it can): the CIDR set
// commands are issue 4's, and a checkout from before them has none.
func rampartAvailable(ctx context.Context, rampart string) string {
	out, err := exec.CommandContext(ctx, rampart, "cidrset", "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "load") {
		return "this rampart CLI has no `cidrset load` command (CIDR sets are not implemented in this checkout): " +
			strings.TrimSpace(benchkit.Truncate(string(out), 200))
	}
	return ""
}

func (f *rampartFilter) Prepare(ctx context.Context, list List, listPath, dir string) error {
	f.listPath = listPath
	return nil
}

// cli runs the rampart CLI against the benchmark's agent, timed.
func (f *rampartFilter) cli(ctx context.Context, args ...string) (Command, error) {
	return runTimed(ctx, f.timeout, "", func(ctx context.Context) *exec.Cmd {
		return benchkit.OwnGroup(exec.CommandContext(ctx, f.agent.Rampart, append([]string{"--socket", f.agent.Socket}, args...)...))
	})
}

// Install loads the set, then applies the policy: the whole set-up from nothing, as the
// ipset peer creates its set and then its rule.
func (f *rampartFilter) Install(ctx context.Context) (install, error) {
	in := install{Entries: -1}
	c, err := f.cli(ctx, "cidrset", "load", cidrGroup, "--file", f.listPath)
	in.Commands = append(in.Commands, c)
	if err != nil {
		return in, err
	}
	c, err = f.cli(ctx, "apply", "-f", f.policyPath)
	in.Commands = append(in.Commands, c)
	if err != nil {
		return in, err
	}
	// Not timed: what the agent says it holds.
	out, err := f.agent.CLI(ctx, time.Minute, "cidrset", "get", cidrGroup, "-o", "json")
	if err != nil {
		return in, err
	}
	in.Entries, in.Bytes = parseCIDRSetGet(out)
	in.Report = json.RawMessage(out)
	return in, nil
}

// parseCIDRSetGet reads the prefix count and memory from `rampart cidrset get -o json`
// (-1 and 0 when the output is not a set).
func parseCIDRSetGet(out []byte) (entries int, bytes int64) {
	var set api.CIDRSet
	if err := json.Unmarshal(out, &set); err != nil || set.Name == "" {
		return -1, 0
	}
	return set.Prefixes, int64(set.MemoryBytes)
}

func (f *rampartFilter) Remove(ctx context.Context) error {
	var errs []error
	if _, err := f.cli(ctx, "delete", "-f", f.policyPath); err != nil && !strings.Contains(err.Error(), "not found") {
		errs = append(errs, err)
	}
	if _, err := f.cli(ctx, "cidrset", "delete", cidrGroup); err != nil && !strings.Contains(err.Error(), "not found") && !strings.Contains(err.Error(), "unknown") {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (f *rampartFilter) Version(ctx context.Context) string {
	v := "rampart (this checkout)"
	out, _ := exec.CommandContext(ctx, "git", "describe", "--always", "--dirty").Output()
	if d := strings.TrimSpace(string(out)); d != "" {
		v = "rampart " + d
	}
	if len(f.agent.Flags) > 0 {
		v += ", rampartd " + strings.Join(f.agent.Flags, " ") // e.g. the attach mode
	}
	return v
}

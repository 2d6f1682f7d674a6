package simcluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/k8s/crds"
	"github.com/rampartnet/rampart/internal/testenv/controlplane"
)

// Config says what to start.
type Config struct {
	// Dir is the cluster's directory: the control plane's state, and nodes/<node>/ for each
	// node's agent and pod runner (state, socket, logs). Created if missing.
	Dir string
	// K8sBinDir holds etcd and kube-apiserver (scripts/build-k8s.sh --dir).
	K8sBinDir string
	// BinDir holds rampartd, rampart-cni and rampart-podrunner.
	BinDir string
	// Name prefixes the agents' instance names (<name>n1, <name>n2, ...) and the network
	// namespaces (rp-<name>-fab, rp-<name>n<i>-node), so that clusters can run side by side
	// (default "cluster").
	Name string
	// Nodes is the number of nodes (0: the control plane alone).
	Nodes int
	// Tunnel is every agent's --tunnel ("": native routing).
	Tunnel string
	// Logf, if set, reports progress.
	Logf func(format string, args ...any)
}

// State is what Start leaves in <Dir>/cluster.json for Stop and for the tools that use the
// cluster (the CLI per node, the demo's driver).
type State struct {
	Name       string `json:"name"`
	Dir        string `json:"dir"`
	BinDir     string `json:"binDir"`
	Kubeconfig string `json:"kubeconfig"`
	Tunnel     string `json:"tunnel,omitempty"`
	Fabric     string `json:"fabricNetns,omitempty"`
	// Cgroup is the cgroup v2 directory the pod runners (so every pod) run in and the
	// agents attach their Service translation to: clusters side by side on one host, whose
	// API servers hand out the same cluster IPs, do not translate each other's pods.
	Cgroup string      `json:"cgroup,omitempty"`
	Nodes  []NodeState `json:"nodes"`
}

// NodeState is one node.
type NodeState struct {
	Name     string `json:"name"`
	Instance string `json:"instance"` // the agent's --instance
	Netns    string `json:"netns"`    // the node's network namespace
	Address  string `json:"address"`  // fabric address, the Node's InternalIP
	PodCIDR  string `json:"podCIDR"`
	Dir      string `json:"dir"`    // nodes/<name>
	Socket   string `json:"socket"` // the agent's API socket
	// AgentPID and RunnerPID are rampartd's and rampart-podrunner's processes.
	AgentPID  int `json:"agentPID,omitempty"`
	RunnerPID int `json:"runnerPID,omitempty"`
}

// StatePath is the state file of the cluster in dir.
func StatePath(dir string) string { return filepath.Join(dir, "cluster.json") }

// Load reads the state of the cluster in dir.
func Load(dir string) (*State, error) {
	b, err := os.ReadFile(StatePath(dir))
	if err != nil {
		return nil, fmt.Errorf("reading the cluster's state: %w", err)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("reading the cluster's state: %w", err)
	}
	return &s, nil
}

func (s *State) save() error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := StatePath(s.Dir) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("writing the cluster's state: %w", err)
	}
	return os.Rename(tmp, StatePath(s.Dir))
}

// Node returns the node called name.
func (s *State) Node(name string) (*NodeState, bool) {
	for i := range s.Nodes {
		if s.Nodes[i].Name == name {
			return &s.Nodes[i], true
		}
	}
	return nil, false
}

var validName = regexp.MustCompile(`^[a-z0-9]{1,12}$`)

// Start starts the control plane (detached: it outlives the caller), installs the CRDs,
// links the fabric and starts each node's rampartd and rampart-podrunner as detached
// processes, then waits until every agent has synced with the API server. The state is
// written to <Dir>/cluster.json as it grows; on error Start stops what it started.
func Start(ctx context.Context, cfg Config) (_ *State, err error) {
	if cfg.Name == "" {
		cfg.Name = "cluster"
	}
	if !validName.MatchString(cfg.Name) {
		return nil, fmt.Errorf("cluster name %q: want 1 to 12 lowercase letters and digits", cfg.Name)
	}
	if cfg.Nodes < 0 || cfg.Nodes > MaxNodes {
		return nil, fmt.Errorf("%d nodes: want 0 to %d", cfg.Nodes, MaxNodes)
	}
	logf := cfg.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if _, err := os.Stat(StatePath(cfg.Dir)); err == nil {
		return nil, fmt.Errorf("a cluster runs from %s already (stop it first)", cfg.Dir)
	}
	if cfg.Nodes > 0 {
		for _, b := range []string{"rampartd", "rampart-cni", "rampart-podrunner"} {
			if _, err := os.Stat(filepath.Join(cfg.BinDir, b)); err != nil {
				return nil, fmt.Errorf("binary: %w", err)
			}
		}
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("cluster directory: %w", err)
	}
	s := &State{Name: cfg.Name, Dir: cfg.Dir, BinDir: cfg.BinDir, Tunnel: cfg.Tunnel}
	if err := s.save(); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			if serr := Stop(cfg.Dir); serr != nil {
				err = fmt.Errorf("%w (and stopping what was started: %v)", err, serr)
			}
		}
	}()

	logf("starting etcd and kube-apiserver")
	cp, err := controlplane.Start(ctx, controlplane.Config{BinDir: cfg.K8sBinDir, Dir: cfg.Dir, Detach: true})
	if err != nil {
		return nil, err
	}
	s.Kubeconfig = cp.Kubeconfig
	if err := s.save(); err != nil {
		return nil, err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	if err := crds.Install(ctx, rc); err != nil {
		return nil, err
	}
	if cfg.Nodes == 0 {
		return s, nil
	}

	s.Cgroup = filepath.Join(datapath.DefaultServiceCgroup(), "rampart-"+cfg.Name)
	if err := s.save(); err != nil {
		return nil, err
	}
	if err := os.Mkdir(s.Cgroup, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("creating the cluster's cgroup: %w", err)
	}
	logf("linking %d node namespaces to a fabric in %s", cfg.Nodes, FabricPrefix)
	s.Fabric = "rp-" + cfg.Name + "-fab"
	var names []string
	for i := range cfg.Nodes {
		inst := fmt.Sprintf("%sn%d", cfg.Name, i+1)
		n := NodeState{
			Name:     fmt.Sprintf("node-%d", i+1),
			Instance: inst,
			Netns:    "rp-" + inst + "-node",
			Address:  NodeAddress(i).String(),
			PodCIDR:  NodePodCIDR(i).String(),
		}
		n.Dir = filepath.Join(cfg.Dir, "nodes", n.Name)
		n.Socket = filepath.Join(n.Dir, "rampart.sock")
		s.Nodes = append(s.Nodes, n)
		names = append(names, n.Netns)
	}
	// Recorded before they exist, so that Stop removes them whatever happens next.
	if err := s.save(); err != nil {
		return nil, err
	}
	if _, err := LinkFabric(s.Fabric, names); err != nil {
		return nil, err
	}

	for i := range s.Nodes {
		n := &s.Nodes[i]
		logf("starting %s (%s, pods %s): rampart-podrunner and rampartd --tunnel=%s", n.Name, n.Address, n.PodCIDR, tunnelName(cfg.Tunnel))
		if err := startNode(s, n); err != nil {
			return nil, fmt.Errorf("node %s: %w", n.Name, err)
		}
	}
	for i := range s.Nodes {
		if err := waitSynced(ctx, &s.Nodes[i]); err != nil {
			return nil, err
		}
	}
	return s, nil
}

func tunnelName(t string) string {
	if t == "" {
		return "native"
	}
	return t
}

// agentFlags are rampartd's flags for n, the same for running and for --uninstall.
func agentFlags(s *State, n *NodeState) []string {
	flags := []string{"--instance", n.Instance, "--state-dir", filepath.Join(n.Dir, "agent"),
		"--socket", n.Socket, "--node-netns", n.Netns, "--tunnel", tunnelName(s.Tunnel)}
	if s.Cgroup != "" {
		flags = append(flags, "--service-cgroup", s.Cgroup)
	}
	return flags
}

// runnerFlags are rampart-podrunner's flags for n, apart from the API and the Node's.
func runnerFlags(s *State, n *NodeState) []string {
	return []string{"--cni-conf-dir", filepath.Join(n.Dir, "cni"), "--cni-bin-dir", s.BinDir,
		"--state-dir", filepath.Join(n.Dir, "podrunner"), "--node-netns", n.Netns}
}

// startNode starts n's pod runner and agent, recording each process in the state file as
// soon as it runs, so that Stop finds it whenever Start is interrupted.
func startNode(s *State, n *NodeState) error {
	if err := os.MkdirAll(filepath.Join(n.Dir, "cni"), 0o700); err != nil {
		return err
	}
	conf := fmt.Sprintf(`{"cniVersion": "1.1.0", "name": "rampart", "plugins": [{"type": "rampart-cni", "socket": %q}]}`, n.Socket)
	if err := os.WriteFile(filepath.Join(n.Dir, "cni", "10-rampart.conflist"), []byte(conf+"\n"), 0o600); err != nil {
		return err
	}
	// The runner first: it registers the Node object the agent waits for at start.
	pid, err := startDetached(filepath.Join(s.BinDir, "rampart-podrunner"), filepath.Join(n.Dir, "podrunner.log"), s.Cgroup,
		append([]string{"--kubeconfig", s.Kubeconfig, "--node-name", n.Name, "--address", n.Address, "--pod-cidr", n.PodCIDR}, runnerFlags(s, n)...)...)
	if err != nil {
		return err
	}
	n.RunnerPID = pid
	if err := s.save(); err != nil {
		return err
	}
	pid, err = startDetached(filepath.Join(s.BinDir, "rampartd"), filepath.Join(n.Dir, "rampartd.log"), "",
		append(agentFlags(s, n), "--kubeconfig", s.Kubeconfig, "--node-name", n.Name)...)
	if err != nil {
		return err
	}
	n.AgentPID = pid
	return s.save()
}

// startDetached starts binary in its own session (in the cgroup v2 directory cgroup
// unless ""), stdout and stderr appended to logPath, and returns its PID: nobody waits for
// it, it outlives the caller.
func startDetached(binary, logPath, cgroup string, args ...string) (int, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return 0, err
	}
	defer logf.Close()
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if cgroup != "" {
		cg, err := os.Open(cgroup)
		if err != nil {
			return 0, fmt.Errorf("opening cgroup %s: %w", cgroup, err)
		}
		defer cg.Close()
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, int(cg.Fd())
	}
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("starting %s: %w", filepath.Base(binary), err)
	}
	pid := cmd.Process.Pid
	cmd.Process.Release()
	return pid, nil
}

// waitSynced waits until n's agent has applied a view of the cluster (90 s: a loaded
// machine and a fresh control plane).
func waitSynced(ctx context.Context, n *NodeState) error {
	c := api.NewClient(n.Socket)
	defer c.Close()
	deadline := time.Now().Add(90 * time.Second)
	for {
		if !controlplane.Alive(n.AgentPID) {
			return fmt.Errorf("node %s's rampartd exited:\n%s", n.Name, controlplane.LogTail(filepath.Join(n.Dir, "rampartd.log"), 20))
		}
		if !controlplane.Alive(n.RunnerPID) {
			return fmt.Errorf("node %s's rampart-podrunner exited:\n%s", n.Name, controlplane.LogTail(filepath.Join(n.Dir, "podrunner.log"), 20))
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := c.Status(sctx)
		cancel()
		if err == nil && st.Kubernetes != nil && st.Kubernetes.Synced {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node %s's agent did not sync with the API server within 90 s (status: %v):\n%s",
				n.Name, err, controlplane.LogTail(filepath.Join(n.Dir, "rampartd.log"), 20))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Stop removes the cluster in dir, in the order that lets each part clean up: the pod
// runners stop, then each runs --cleanup (the CNI DEL needs the agent), the agents stop
// and run --uninstall (pins, node set-up, state), the namespaces go, then the control
// plane. It goes on past errors and returns them all; dir itself stays (the caller's).
func Stop(dir string) error {
	s, err := Load(dir)
	if errors.Is(err, os.ErrNotExist) {
		// A control plane started without the state file (or nothing at all).
		return controlplane.StopDetached(dir)
	}
	if err != nil {
		return err
	}
	var errs []error
	run := func(binary string, args ...string) {
		out, err := exec.Command(filepath.Join(s.BinDir, binary), args...).CombinedOutput()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w\n%s", binary, strings.Join(args, " "), err, strings.TrimSpace(string(out))))
		}
	}
	for i := range s.Nodes {
		n := &s.Nodes[i]
		if n.RunnerPID != 0 {
			errs = append(errs, controlplane.StopPid(n.RunnerPID, "rampart-podrunner"))
		}
		if _, err := os.Stat(filepath.Join(n.Dir, "podrunner")); err == nil {
			run("rampart-podrunner", append([]string{"--cleanup"}, runnerFlags(s, n)...)...)
		}
	}
	for i := range s.Nodes {
		n := &s.Nodes[i]
		if n.AgentPID != 0 {
			errs = append(errs, controlplane.StopPid(n.AgentPID, "rampartd"))
		}
		if _, err := os.Stat(filepath.Join(n.Dir, "agent")); err == nil {
			run("rampartd", append(agentFlags(s, n), "--pod-cidr", n.PodCIDR, "--uninstall")...)
		}
	}
	var netns []string
	for _, n := range s.Nodes {
		netns = append(netns, n.Netns)
	}
	errs = append(errs, DeleteNetns(append(netns, s.Fabric)...))
	if s.Cgroup != "" {
		errs = append(errs, removeCgroup(s.Cgroup))
	}
	errs = append(errs, controlplane.StopDetached(dir))
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return os.Remove(StatePath(dir))
}

// removeCgroup removes the cluster's cgroup once the processes that were in it have gone
// (the kernel sees it empty a moment after they exit; on a loaded machine, seconds).
func removeCgroup(dir string) error {
	deadline := time.Now().Add(20 * time.Second)
	for {
		err := os.Remove(dir)
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("removing the cluster's cgroup: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

package agent_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/agent"
	"github.com/rampartnet/rampart/internal/cli"
	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/netns"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

const uninstallL7 = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: l7, namespace: y}
spec:
  endpointSelector: {matchLabels: {app: b}}
  ingress:
  - fromEndpoints: [{matchLabels: {app: a}}]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
      rules: {http: [{method: GET, path: /}]}
`

// TestUninstallRemovesOnlyWhatTheInstanceMade runs a real agent in a node namespace the
// test made (so uninstall has to undo the router address, the proxy routing and the
// sysctls one by one), in a state directory that holds a user's file, with a pin directory
// in which, and beside which, another program keeps its pins. Uninstall refuses a state
// directory and a pin directory that hold no instance, removing nothing; then it removes
// everything the instance made, and leaves the rest as it was.
func TestUninstallRemovesOnlyWhatTheInstanceMade(t *testing.T) {
	testenv.RequireRoot(t)
	inst := "u" + testenv.Suffix(8)
	nodeNs := "rp-" + inst + "-node"
	tmp := t.TempDir()

	// The node namespace is the test's, with its own settings and a user's address on lo.
	if _, err := endpoint.CreateNetns(nodeNs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { endpoint.DeleteNetns(nodeNs) })
	nodePath := endpoint.NetnsPath(nodeNs)
	userAddr := netip.MustParseAddr("198.19.255.7")
	inNode(t, nodePath, func(h *netlink.Handle) error {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := h.LinkSetUp(lo); err != nil {
			return err
		}
		addr, err := netlink.ParseAddr(userAddr.String() + "/32")
		if err != nil {
			return err
		}
		return h.AddrAdd(lo, addr)
	})
	sysctls := map[string]string{
		"net/ipv4/ip_forward":          "0",
		"net/ipv4/tcp_max_tw_buckets":  "4096",
		"net/ipv4/ip_local_port_range": "20000 30000",
	}
	for k, v := range sysctls {
		if err := endpoint.WriteSysctl(nodePath, k, v); err != nil {
			t.Fatal(err)
		}
	}

	// A state directory the user made, with a file of theirs.
	stateDir := filepath.Join(tmp, "state")
	if err := os.Mkdir(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(stateDir, "notes.txt"), "mine")
	// A pin directory under a directory of another program's pins.
	bpfParent := "/sys/fs/bpf/rp-test-" + inst
	if err := os.Mkdir(bpfParent, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(bpfParent) })
	bpfDir := filepath.Join(bpfParent, inst)
	pinForeign(t, filepath.Join(bpfParent, "other_map"))

	sockDir, err := os.MkdirTemp("", "rp-sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	cfg := agent.Config{
		Instance:      inst,
		StateDir:      stateDir,
		Socket:        filepath.Join(sockDir, "r.sock"),
		BPFDir:        bpfDir,
		NodeNetns:     nodeNs,
		PodCIDR:       netip.MustParsePrefix("198.18.0.0/24"),
		CIDRHostSlots: 1 << 16,
		Logger:        slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	uninstalled := false
	t.Cleanup(func() {
		if !uninstalled {
			agent.Uninstall(cfg)
		}
	})

	a, err := agent.New(cfg)
	if err != nil {
		t.Fatalf("starting agent: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			if err := <-done; err != nil {
				t.Errorf("agent stopped with error: %v", err)
			}
		}
	}
	t.Cleanup(stop)
	rampart := func(args ...string) string {
		t.Helper()
		var out, errb bytes.Buffer
		code := cli.Run(context.Background(), append([]string{"--socket", cfg.Socket}, args...), cli.IO{In: strings.NewReader(""), Out: &out, Err: &errb})
		if code != 0 {
			t.Fatalf("rampart %v: exit %d: %s%s", args, code, out.String(), errb.String())
		}
		return out.String()
	}
	rampart("endpoint", "add", "y/a", "--labels", "app=a")
	rampart("endpoint", "add", "y/b", "--labels", "app=b")
	list := filepath.Join(tmp, "threats.txt")
	writeFile(t, list, "198.51.100.0/24\n203.0.113.7/32\n")
	rampart("cidrset", "load", "threats", "--file", list)
	policy := filepath.Join(tmp, "l7.yaml")
	writeFile(t, policy, uninstallL7)
	rampart("apply", "-f", policy)
	if !testenv.Eventually(10*time.Second, func() bool {
		for _, l := range strings.Split(rampart("status"), "\n") {
			if strings.HasPrefix(l, "L7 proxy:") && strings.Contains(l, "running") {
				return true
			}
		}
		return false
	}) {
		t.Fatalf("the L7 proxy did not start:\n%s", rampart("status"))
	}
	// Another program's pin inside the instance's pin directory, and a file of the user's
	// in the instance's CIDR set directory whose name looks like a journal.
	pinForeign(t, filepath.Join(bpfDir, "other_inside"))
	writeFile(t, filepath.Join(stateDir, "cidrsets", "mine.log"), "not a journal")

	// What the instance made, to be gone after uninstall.
	node := endpoint.Node{Instance: inst, Netns: nodeNs, PodCIDR: cfg.PodCIDR}
	router := node.Router()
	hostIfs := []string{node.HostIfName("y", "a"), node.HostIfName("y", "b")}
	epNetns := []string{node.EndpointNetns("y", "a"), node.EndpointNetns("y", "b")}
	if has, err := node.HasLoAddress(router); err != nil || !has {
		t.Fatalf("router address on the node's lo: %v, %v", has, err)
	}
	if on, err := datapath.ProxyRouting(nodePath); err != nil || !on {
		t.Fatalf("proxy routing in the node namespace: %v, %v", on, err)
	}
	if v, _ := endpoint.ReadSysctl(nodePath, "net/ipv4/ip_forward"); v != "1" {
		t.Fatalf("ip_forward in the node namespace = %q, want 1 while the agent runs", v)
	}
	pins, err := agent.FindPins(bpfDir)
	if err != nil || len(pins) < 10 {
		t.Fatalf("the instance's pins: %d, %v", len(pins), err)
	}
	stop()

	// Refusals: nothing is removed.
	empty := filepath.Join(tmp, "empty")
	os.Mkdir(empty, 0o700)
	writeFile(t, filepath.Join(empty, "keep.txt"), "x")
	wrong := cfg
	wrong.StateDir = empty
	if err := agent.Uninstall(wrong); err == nil || !strings.Contains(err.Error(), "--state-dir "+empty+": no Rampart instance \""+inst+"\" here") {
		t.Fatalf("uninstall of a state directory without the instance: %v, want a refusal naming it", err)
	}
	if names := dirNames(t, empty); !slices.Equal(names, []string{"keep.txt"}) {
		t.Fatalf("refused uninstall changed %s: %v", empty, names)
	}
	wrong = cfg
	wrong.BPFDir = bpfParent
	if err := agent.Uninstall(wrong); err == nil || !strings.Contains(err.Error(), "--bpf-dir "+bpfParent) {
		t.Fatalf("uninstall with another pin directory: %v, want a refusal naming it", err)
	}
	wrong.BPFDir = "/sys/fs/bpf"
	if err := agent.Uninstall(wrong); err == nil || !strings.Contains(err.Error(), "--bpf-dir /sys/fs/bpf") {
		t.Fatalf("uninstall with --bpf-dir /sys/fs/bpf: %v, want a refusal naming it", err)
	}
	if now, _ := agent.FindPins(bpfDir); len(now) != len(pins) {
		t.Fatalf("refused uninstalls removed pins: %d left of %d", len(now), len(pins))
	}
	if _, err := os.Stat(filepath.Join(stateDir, "state.json")); err != nil {
		t.Fatalf("refused uninstalls removed the state: %v", err)
	}
	for _, ns := range epNetns {
		if !endpoint.NetnsExists(ns) {
			t.Fatalf("refused uninstalls removed endpoint namespace %s", ns)
		}
	}

	if err := agent.Uninstall(cfg); err != nil {
		t.Fatalf("uninstall: %v", err)
	}
	uninstalled = true

	// Everything the instance made is gone.
	if left, err := agent.FindPins(bpfDir); err != nil || len(left) > 0 {
		t.Errorf("pins left: %v (%v)", left, err)
	}
	for _, ns := range epNetns {
		if _, err := os.Lstat(endpoint.NetnsPath(ns)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("endpoint namespace %s left (%v)", ns, err)
		}
	}
	inNode(t, nodePath, func(h *netlink.Handle) error {
		for _, name := range hostIfs {
			if _, err := h.LinkByName(name); err == nil {
				t.Errorf("veth %s left in the node namespace", name)
			}
		}
		return nil
	})
	if has, err := node.HasLoAddress(router); err != nil || has {
		t.Errorf("router address %v left on the node's lo (%v)", router, err)
	}
	if on, err := datapath.ProxyRouting(nodePath); err != nil || on {
		t.Errorf("proxy rule left in the node namespace (%v)", err)
	}
	inNode(t, nodePath, func(h *netlink.Handle) error {
		routes, err := h.RouteListFiltered(unix.AF_INET, &netlink.Route{Table: datapath.ProxyRouteTable}, netlink.RT_FILTER_TABLE)
		if err != nil {
			return err
		}
		if len(routes) > 0 {
			t.Errorf("proxy routes left in table %d: %v", datapath.ProxyRouteTable, routes)
		}
		return nil
	})
	for k, want := range sysctls {
		if got, err := endpoint.ReadSysctl(nodePath, k); err != nil || got != want {
			t.Errorf("%s = %q after uninstall (%v), want %q as before the agent", k, got, err, want)
		}
	}
	if _, err := os.Lstat(cfg.Socket); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left (%v)", err)
	}
	// The proxy's run directory, in the state directory or (for a long path) in /run.
	for _, p := range []string{filepath.Join(stateDir, "proxy"), "/run/rampart/proxy-" + inst} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("proxy run directory %s left (%v)", p, err)
		}
	}

	// What was not the instance's is as it was.
	if has, err := node.HasLoAddress(userAddr); err != nil || !has {
		t.Errorf("the user's address %v on the node's lo was removed (%v)", userAddr, err)
	}
	if !endpoint.NetnsExists(nodeNs) {
		t.Errorf("the test's node namespace was removed")
	}
	if got := dirNames(t, stateDir); !slices.Equal(got, []string{"cidrsets", "notes.txt"}) {
		t.Errorf("state directory holds %v after uninstall, want only the user's notes.txt and cidrsets (holding mine.log)", got)
	}
	if got := dirNames(t, filepath.Join(stateDir, "cidrsets")); !slices.Equal(got, []string{"mine.log"}) {
		t.Errorf("CIDR set directory holds %v after uninstall, want only the user's mine.log", got)
	}
	if got := dirNames(t, bpfDir); !slices.Equal(got, []string{"other_inside"}) {
		t.Errorf("pin directory holds %v after uninstall, want only the other program's pin", got)
	}
	if got := dirNames(t, bpfParent); !slices.Equal(got, []string{"other_map", inst}) {
		t.Errorf("%s holds %v after uninstall, want the other program's pin and the kept pin directory", bpfParent, got)
	}
	for _, p := range []string{filepath.Join(bpfParent, "other_map"), filepath.Join(bpfDir, "other_inside")} {
		m, err := ebpf.LoadPinnedMap(p, nil)
		if err != nil {
			t.Errorf("the other program's pin %s: %v", p, err)
			continue
		}
		m.Close()
	}

	// Uninstalling again finds no instance.
	if err := agent.Uninstall(cfg); err == nil || !strings.Contains(err.Error(), "no Rampart instance") {
		t.Errorf("second uninstall: %v, want no instance found", err)
	}
}

type testLog struct{ t testing.TB }

func (w testLog) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func inNode(t *testing.T, nsPath string, fn func(h *netlink.Handle) error) {
	t.Helper()
	if err := netns.Do(nsPath, func() error {
		h, err := netlink.NewHandle()
		if err != nil {
			return err
		}
		defer h.Close()
		return fn(h)
	}); err != nil {
		t.Fatal(err)
	}
}

// pinForeign pins a map of another program at path.
func pinForeign(t *testing.T, path string) {
	t.Helper()
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Pin(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(path) })
}

func writeFile(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		t.Fatal(err)
	}
}

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatalf("reading %s: %v", dir, err)
	}
	var out []string
	for _, e := range ents {
		out = append(out, e.Name())
	}
	slices.Sort(out)
	return out
}

// TestUninstallAfterNodeNamespaceGone: when the node namespace the instance made is gone
// (as after a reboot), uninstall still removes the endpoints' namespaces and the state.
func TestUninstallAfterNodeNamespaceGone(t *testing.T) {
	e := agenttest.StartAgent(t, agenttest.Options{NoServers: true})
	e.MustCLI("endpoint", "add", "x/a")
	e.Stop()
	if err := endpoint.DeleteNetns(e.Config.NodeNetns); err != nil {
		t.Fatal(err)
	}
	if err := agent.Uninstall(e.Config); err != nil {
		t.Fatalf("uninstall: %v", err)
	}
	for _, p := range []string{agenttest.NetnsPathOf(e.Config.Instance, "x", "a"), e.Config.StateDir, e.Config.BPFDir} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left after uninstall (%v)", p, err)
		}
	}
	e.Start() // for the harness's own uninstall when the test ends
}

package services

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

// Client kinds: where a measured connection starts. Each has its own network namespace
// joined to the backend's by a veth, and its own cgroup v2 directory.
const (
	Direct    = "direct"     // no Service: connects to the backend's address (the baseline)
	Control   = "control"    // the A/A control: direct again, measured like a case
	Rampart   = "rampart"    // Rampart's socket-level translation on this client's cgroup
	KubeProxy = "kube-proxy" // kube-proxy (nftables) in this client's network namespace
)

// clientKinds are the namespaces; the control shares the direct client's.
var clientKinds = []string{Direct, Rampart, KubeProxy}

// topology is the benchmark's namespaces and cgroups: a backend namespace with the
// server's address on its loopback, one namespace per client kind with a /32 route to it,
// and for kube-proxy's namespace a link to the host, on which the API server listens.
type topology struct {
	prefix  string // namespace and cgroup name prefix, unique to the run
	net     netip.Prefix
	backend netip.Addr
	clients map[string]netip.Addr
	// apiAddr is the host's end of the link into kube-proxy's namespace.
	apiAddr netip.Addr
	cgroups map[string]string
	cleanup benchkit.Cleanups
}

// cgroup2Root is where this project's machines mount cgroup v2 (hybrid hosts).
func cgroup2Root() string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return "/sys/fs/cgroup"
	}
	return "/sys/fs/cgroup/unified"
}

func (t *topology) netns(kind string) string { return t.prefix + "-" + short(kind) }

func short(kind string) string {
	switch kind {
	case KubeProxy:
		return "kp"
	case Rampart:
		return "rp"
	case Direct, Control:
		return "dc"
	}
	return "be"
}

// newTopology builds the namespaces in net (a /24 of 198.18.0.0/15). On an error it removes
// what it made.
func newTopology(ctx context.Context, prefix string, net netip.Prefix) (_ *topology, err error) {
	t := &topology{prefix: prefix, net: net, backend: benchkit.HostAddr(net, 1), clients: map[string]netip.Addr{},
		apiAddr: benchkit.HostAddr(net, 100), cgroups: map[string]string{}}
	defer func() {
		if err != nil {
			err = errors.Join(err, t.Close())
		}
	}()
	be := t.netns("backend")
	if err := t.addNetns(ctx, be); err != nil {
		return nil, err
	}
	if err := ipRun(ctx, "-n", be, "addr", "add", t.backend.String()+"/32", "dev", "lo"); err != nil {
		return nil, err
	}
	for i, kind := range clientKinds {
		ns := t.netns(kind)
		addr := benchkit.HostAddr(net, uint32(10*(i+1)))
		t.clients[kind] = addr
		if err := t.addNetns(ctx, ns); err != nil {
			return nil, err
		}
		// The client end is "c", the backend's end "b<kind>", as veth names are short.
		peer := "b" + short(kind)
		if err := ipRun(ctx, "link", "add", "c", "netns", ns, "type", "veth", "peer", "name", peer, "netns", be); err != nil {
			return nil, err
		}
		for _, cmd := range [][]string{
			{"-n", ns, "addr", "add", addr.String() + "/32", "dev", "c"},
			{"-n", ns, "link", "set", "c", "up"},
			{"-n", be, "link", "set", peer, "up"},
			{"-n", be, "route", "add", addr.String() + "/32", "dev", peer},
			// A device route for everything: the backend, and the Service addresses,
			// which must have a route before kube-proxy's DNAT (in the output hook, after
			// routing) can rewrite them; untranslated, they reach nobody.
			{"-n", ns, "route", "add", "default", "dev", "c"},
		} {
			if err := ipRun(ctx, cmd...); err != nil {
				return nil, err
			}
		}
		if err := t.addCgroup(kind); err != nil {
			return nil, err
		}
	}
	// kube-proxy's link to the host (its API server).
	kp, host := t.netns(KubeProxy), t.prefix+"-h"
	kpAddr := benchkit.HostAddr(net, 101)
	if err := ipRun(ctx, "link", "add", host, "type", "veth", "peer", "name", "api", "netns", kp); err != nil {
		return nil, err
	}
	t.cleanup.Add(func() error { return ipRun(context.Background(), "link", "del", host) })
	for _, cmd := range [][]string{
		{"addr", "add", t.apiAddr.String() + "/32", "dev", host},
		{"link", "set", host, "up"},
		{"route", "add", kpAddr.String() + "/32", "dev", host},
		{"-n", kp, "addr", "add", kpAddr.String() + "/32", "dev", "api"},
		{"-n", kp, "link", "set", "api", "up"},
		{"-n", kp, "route", "add", t.apiAddr.String() + "/32", "dev", "api"},
	} {
		if err := ipRun(ctx, cmd...); err != nil {
			return nil, err
		}
	}
	return t, nil
}

func (t *topology) addNetns(ctx context.Context, ns string) error {
	if err := ipRun(ctx, "netns", "add", ns); err != nil {
		return err
	}
	t.cleanup.Add(func() error { return ipRun(context.Background(), "netns", "del", ns) })
	for _, cmd := range [][]string{
		{"-n", ns, "link", "set", "lo", "up"},
	} {
		if err := ipRun(ctx, cmd...); err != nil {
			return err
		}
	}
	// Fresh connections by the thousand: the whole port range, in this namespace only.
	return nsRun(ctx, ns, "sysctl", "-qw", "net.ipv4.ip_local_port_range=1024 65000")
}

func (t *topology) addCgroup(kind string) error {
	dir := filepath.Join(cgroup2Root(), t.prefix+"-"+short(kind))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return fmt.Errorf("creating cgroup %s: %w", dir, err)
	}
	t.cgroups[kind] = dir
	t.cleanup.Add(func() error {
		// The kernel may take a moment to see the directory empty after its processes exit.
		var err error
		for range 100 {
			if err = os.Remove(dir); err == nil {
				return nil
			}
			time.Sleep(50 * time.Millisecond)
		}
		return fmt.Errorf("removing cgroup %s: %w", dir, err)
	})
	return nil
}

// Close removes the namespaces (and with them the links) and cgroups.
func (t *topology) Close() error {
	return errors.Join(t.cleanup.Run()...)
}

// nsCmd is argv run in network namespace ns (nsenter --net: ip netns exec would remount
// /sys, which the helpers do not need).
func nsCmd(ctx context.Context, ns string, argv ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "nsenter", append([]string{"--net=/run/netns/" + ns, "--"}, argv...)...)
}

func nsRun(ctx context.Context, ns string, argv ...string) error {
	out, err := nsCmd(ctx, ns, argv...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s in %s: %w: %s", strings.Join(argv, " "), ns, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func ipRun(ctx context.Context, args ...string) error {
	out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

package e2e

import (
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/testenv"
)

// hostLockDown is node A's host policy: SSH (22) from the other nodes only, 9100 from the
// pods labelled pod=a, 2223 from the fabric's IPv6 prefix, and out only to the other nodes
// on TCP 80 and to the fabric's IPv6 prefix on TCP 81.
const hostLockDown = `apiVersion: cilium.io/v2
kind: CiliumClusterwideNetworkPolicy
metadata: {name: lock-down-workers}
spec:
  nodeSelector: {matchLabels: {role: worker}}
  ingress:
  - fromEntities: [remote-node]
    toPorts: [{ports: [{port: "22", protocol: TCP}]}]
  - fromEndpoints: [{matchLabels: {pod: a}}]
    toPorts: [{ports: [{port: "9100", protocol: TCP}]}]
  - fromCIDR: ["2001:2:0:fab::/64"]
    toPorts: [{ports: [{port: "2223", protocol: TCP}]}]
  egress:
  - toEntities: [remote-node]
    toPorts: [{ports: [{port: "80", protocol: TCP}]}]
  - toCIDR: ["2001:2:0:fab::/64"]
    toPorts: [{ports: [{port: "81", protocol: TCP}]}]
`

// The nodes' IPv6 addresses on the fabric (in hostLockDown's CIDR), which the agents know
// only as host device addresses: node B's is no node address to node A (remote-node is
// IPv4 here), so host policy judges it by CIDR.
var (
	fab6A = netip.MustParseAddr("2001:2:0:fab::a")
	fab6B = netip.MustParseAddr("2001:2:0:fab::b")
)

// Host policy in each overlay mode: node A, with --host-firewall on its fabric interface
// and the label role=worker, enforces a CiliumClusterwideNetworkPolicy with a nodeSelector
// on its own traffic, from the other node, from its pods and to the other node, while the
// pods' traffic between the nodes (through the overlay) keeps working; drops are the
// host's in flows and trace; the policy survives a restart; node B, without the host
// firewall, refuses it by name; uninstall takes the host programs off the interface.
func TestHostPolicyVXLAN(t *testing.T)  { testHostPolicy(t, overlay.VXLAN) }
func TestHostPolicyIPIP(t *testing.T)   { testHostPolicy(t, overlay.IPIP) }
func TestHostPolicyNative(t *testing.T) { testHostPolicy(t, overlay.Native) }

func testHostPolicy(t *testing.T, mode overlay.Mode) {
	n := startTwoNodes(t, mode, false, overlay.UnderlayIPv4)
	a, _, b := n.pods(t)
	nodeA, nodeB := endpoint.NetnsPath(n.a.Config.NodeNetns), endpoint.NetnsPath(n.b.Config.NodeNetns)
	// Host processes: servers on both nodes' own namespaces.
	for _, ns := range []string{nodeA, nodeB} {
		s, err := testenv.Serve(ns, []uint16{22, 80, 81, 2222, 2223, 9100}, nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Close)
	}
	fabA := linkHolding(t, nodeA, n.addrA)
	addAddr6(t, nodeA, fabA, fab6A)
	addAddr6(t, nodeB, linkHolding(t, nodeB, n.addrB), fab6B)

	if _, errs, code := n.b.CLIStdin(hostLockDown, "apply", "-f", "-"); code == 0 || !strings.Contains(errs, "spec.nodeSelector: host policy needs rampartd --host-firewall") {
		t.Errorf("node B (no host firewall) applying a host policy: exit %d, %s", code, errs)
	}

	n.a.Stop()
	n.a.Config.HostFirewall = true
	n.a.Config.HostDevices = []string{fabA}
	n.a.Config.NodeLabels = labels.Labels{"role": "worker"}
	n.a.Start()
	if _, errs, code := n.a.CLIStdin(hostLockDown, "apply", "-f", "-"); code != 0 {
		t.Fatalf("apply on node A: %s", errs)
	}
	router := n.a.Config.PodCIDR.Addr().Next()

	type probe struct {
		name string
		from string // an endpoint ns/name, or a node namespace path
		to   netip.Addr
		port uint16
		want bool
	}
	probes := []probe{
		{"node B to node A:22", nodeB, n.addrA, 22, true},
		{"node B to node A:2222", nodeB, n.addrA, 2222, false},
		{"pod x/b on node B to node A:22 (not a node)", "x/b", n.addrA, 22, false},
		{"pod x/a to its node's router address:9100", "x/a", router, 9100, true},
		{"pod x/a to its node's address:9100", "x/a", n.addrA, 9100, true},
		{"pod x/c to its node:9100", "x/c", router, 9100, false},
		{"node A to node B:80", nodeA, n.addrB, 80, true},
		{"node A to node B:81", nodeA, n.addrB, 81, false},
		{"node A to its pod x/a:80 (egress to pods not allowed)", nodeA, netip.MustParseAddr(a.IP), 80, false},
		// Over IPv6 on the fabric: the same host policy, by CIDR.
		{"node B to node A:2223 over IPv6", nodeB, fab6A, 2223, true},
		{"node B to node A:2222 over IPv6", nodeB, fab6A, 2222, false},
		{"node B to node A:22 over IPv6 (no node address)", nodeB, fab6A, 22, false},
		{"node A to node B:81 over IPv6", nodeA, fab6B, 81, true},
		{"node A to node B:80 over IPv6 (no node address)", nodeA, fab6B, 80, false},
		// Through the overlay, untouched by host policy.
		{"pod x/a to pod x/b:80 across nodes", "x/a", netip.MustParseAddr(b.IP), 80, true},
		{"pod x/c to pod x/b:80 across nodes (B's policy)", "x/c", netip.MustParseAddr(b.IP), 80, false},
	}
	check := func(when string) {
		t.Helper()
		got := make([]bool, len(probes))
		var wg sync.WaitGroup
		for i, p := range probes {
			wg.Add(1)
			go func() {
				defer wg.Done()
				to := netip.AddrPortFrom(p.to, p.port)
				switch {
				case strings.HasPrefix(p.from, "/"):
					got[i] = testenv.Probe(p.from, to, "tcp", 2*time.Second)
				case strings.Contains(p.name, "on node B"):
					got[i] = n.b.Probe(p.from, p.to, p.port, "tcp", 2*time.Second)
				default:
					got[i] = n.a.Probe(p.from, p.to, p.port, "tcp", 2*time.Second)
				}
			}()
		}
		wg.Wait()
		for i, p := range probes {
			if got[i] != p.want {
				t.Errorf("%s (%s): %s: connected %v, want %v", mode, when, p.name, got[i], p.want)
			}
		}
	}
	check("host policy")
	if st := n.a.MustCLI("status"); !strings.Contains(st, "Host policy:") || !strings.Contains(st, "on "+fabA+", ingress and egress enforced (labels role=worker)") {
		t.Errorf("%s: status does not show host policy on %s:\n%s", mode, fabA, st)
	}

	// The drops are the host's.
	var hostDrop *api.Flow
	for _, f := range flowsOf(t, n.a) {
		if f.Endpoint == "host" && f.Verdict == "DROPPED" && f.Dest.Port == 2222 {
			hostDrop = &f
			break
		}
	}
	if hostDrop == nil {
		t.Errorf("%s: no host drop of node B's connection to port 2222 in node A's flows", mode)
	} else if hostDrop.Reason != "policy-default-deny" || hostDrop.Direction != "ingress" {
		t.Errorf("%s: host drop %+v, want policy-default-deny on ingress", mode, *hostDrop)
	}
	out := n.a.MustCLI("policy", "trace", "--from", n.addrB.String(), "--to", "host", "--port", "22/TCP")
	if !strings.Contains(out, "lock-down-workers") || !strings.Contains(strings.ToLower(out), "allowed") {
		t.Errorf("%s: trace node B -> host:22 does not name the host policy or allow:\n%s", mode, out)
	}
	out = n.a.MustCLI("policy", "trace", "--from", n.addrB.String(), "--to", "host", "--port", "2222/TCP")
	if !strings.Contains(strings.ToLower(out), "denied") {
		t.Errorf("%s: trace node B -> host:2222 does not deny:\n%s", mode, out)
	}

	var hostDrop6 *api.Flow
	for _, f := range flowsOf(t, n.a) {
		if f.Endpoint == "host" && f.Verdict == "DROPPED" && f.Dest.Port == 2222 && f.Source.IP == fab6B.String() {
			hostDrop6 = &f
			break
		}
	}
	if hostDrop6 == nil {
		t.Errorf("%s: no host drop of node B's IPv6 connection to port 2222 in node A's flows", mode)
	}
	out = n.a.MustCLI("policy", "trace", "--from", fab6B.String(), "--to", "host", "--port", "2223/TCP")
	if !strings.Contains(out, "lock-down-workers") || !strings.Contains(strings.ToLower(out), "allowed") {
		t.Errorf("%s: trace node B's IPv6 -> host:2223 does not name the host policy or allow:\n%s", mode, out)
	}
	out = n.a.MustCLI("policy", "trace", "--from", fab6B.String(), "--to", "host", "--port", "22/TCP")
	if !strings.Contains(strings.ToLower(out), "denied") {
		t.Errorf("%s: trace node B's IPv6 -> host:22 does not deny:\n%s", mode, out)
	}

	n.a.Restart()
	check("after a restart")

	// Without the host firewall the programs leave the interface, and the node is open.
	h := testenv.NetlinkHandle(t, nodeA)
	if names := testenv.BPFFilterNames(t, h, fabA); !slices.Contains(names, "rampart_to_host") || !slices.Contains(names, "rampart_from_host") {
		t.Errorf("%s: host programs on %s: %v", mode, fabA, names)
	}
	n.a.Stop()
	n.a.Config.HostFirewall = false
	n.a.Start()
	if names := testenv.BPFFilterNames(t, h, fabA); slices.Contains(names, "rampart_to_host") || slices.Contains(names, "rampart_from_host") {
		t.Errorf("%s: host programs left on %s without the host firewall: %v", mode, fabA, names)
	}
	if !testenv.Probe(nodeB, netip.AddrPortFrom(n.addrA, 2222), "tcp", 2*time.Second) {
		t.Errorf("%s: node B cannot reach node A:2222 without the host firewall", mode)
	}
	if !testenv.Probe(nodeB, netip.AddrPortFrom(fab6A, 2222), "tcp", 2*time.Second) {
		t.Errorf("%s: node B cannot reach node A:2222 over IPv6 without the host firewall", mode)
	}
}

// addAddr6 puts addr (/64, no duplicate address detection: usable at once) on the interface
// ifname of the namespace at nsPath, which goes with the namespace.
func addAddr6(t *testing.T, nsPath, ifname string, addr netip.Addr) {
	t.Helper()
	h := testenv.NetlinkHandle(t, nsPath)
	l, err := h.LinkByName(ifname)
	if err != nil {
		t.Fatal(err)
	}
	ipn := netip.PrefixFrom(addr, 64)
	if err := h.AddrAdd(l, &netlink.Addr{IPNet: &net.IPNet{IP: addr.AsSlice(), Mask: net.CIDRMask(ipn.Bits(), 128)}, Flags: unix.IFA_F_NODAD}); err != nil {
		t.Fatalf("adding %v to %s: %v", addr, ifname, err)
	}
}

// delAddr4 takes the IPv4 address addr off the interface of the namespace at nsPath that
// holds it.
func delAddr4(t *testing.T, nsPath string, addr netip.Addr) {
	t.Helper()
	h := testenv.NetlinkHandle(t, nsPath)
	l, err := h.LinkByName(linkHolding(t, nsPath, addr))
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	for _, ad := range addrs {
		if ip, ok := netip.AddrFromSlice(ad.IP); ok && ip.Unmap() == addr {
			if err := h.AddrDel(l, &ad); err != nil {
				t.Fatalf("removing %v from %s: %v", ad.IPNet, l.Attrs().Name, err)
			}
		}
	}
}

// linkHolding is the name of the interface of the namespace at nsPath holding addr.
func linkHolding(t *testing.T, nsPath string, addr netip.Addr) string {
	t.Helper()
	h := testenv.NetlinkHandle(t, nsPath)
	links, err := h.LinkList()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range links {
		addrs, _ := h.AddrList(l, netlink.FAMILY_V4)
		for _, ad := range addrs {
			if ip, ok := netip.AddrFromSlice(ad.IP); ok && ip.Unmap() == addr {
				return l.Attrs().Name
			}
		}
	}
	t.Fatalf("no interface in %s holds %v", nsPath, addr)
	return ""
}

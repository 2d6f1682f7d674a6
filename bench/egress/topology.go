package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/podaddr"
)

// benchNamespace is the Kubernetes-style namespace of every endpoint the benchmark creates.
const benchNamespace = "bench"

// host is one network namespace of a topology: the client, the server or the world.
type host struct {
	Name   string
	IP     netip.Addr
	IP6    netip.Addr // in a topology over IPv6
	Netns  string     // path, for nsenter --net and endpoint.Do
	HostIf string     // the host-side veth in the node namespace
}

// Command returns a command running argv inside the host's network namespace, in its own
// process group. Only the network namespace is switched (never `ip netns exec`, which
// remounts /sys and hides bpffs).
func (h *host) Command(ctx context.Context, argv ...string) *exec.Cmd {
	args := append([]string{"--net=" + h.Netns, "--"}, argv...)
	return benchkit.OwnGroup(exec.CommandContext(ctx, "nsenter", args...))
}

// topology is a client and a server joined through a node namespace, as two machines
// through a network, plus a "world" namespace behind the same node that answers on a
// listed address (the probe target of the set-up time) and on an unlisted neighbour. The
// world is not an endpoint of any agent: to Rampart its addresses are world, as the
// internet's are.
type topology struct {
	Name                  string
	Client, Server, World *host
	// NodeNetns is the node namespace's path (plain topologies only; "" for the agent's).
	NodeNetns string
	// Neighbour is the world's second address, never listed: reachable through every filter.
	Neighbour netip.Addr
	// IPv6 makes the topology dual-stack (every range paired with one in 2001:2::/48, see
	// range6Of) and its traffic go to the IPv6 addresses (Neighbour6, the hosts' IP6).
	IPv6       bool
	Neighbour6 netip.Addr
	cleanup    []func() error
}

// addr is h's address of the topology's family: where traffic to h goes.
func (t *topology) addr(h *host) netip.Addr {
	if t.IPv6 {
		return h.IP6
	}
	return h.IP
}

// neighbour is the unlisted neighbour's address of the topology's family.
func (t *topology) neighbour() netip.Addr {
	if t.IPv6 {
		return t.Neighbour6
	}
	return t.Neighbour
}

// range6Of is the IPv6 range paired with the benchmark's IPv4 range p (198.18.N.0/24 ->
// 2001:2:0:N::/64, as benchkit.PodCIDR6Of; 198.19.N.0/24 -> 2001:2:0:1NN::/64), all in
// benchRange6 and none overlapping another; the zero prefix when ipv6 is false, which
// leaves an endpoint.Node IPv4-only.
func range6Of(p netip.Prefix, ipv6 bool) netip.Prefix {
	if !ipv6 {
		return netip.Prefix{}
	}
	b := p.Masked().Addr().As4()
	return netip.PrefixFrom(netip.AddrFrom16([16]byte{0x20, 0x01, 0, 2, 0, 0, b[1] - 18, b[2]}), 64)
}

// Close removes everything the topology created, newest first.
func (t *topology) Close() error {
	var errs []error
	for i := len(t.cleanup) - 1; i >= 0; i-- {
		errs = append(errs, t.cleanup[i]())
	}
	t.cleanup = nil
	return errors.Join(errs...)
}

// worldAddrs are the world namespace's addresses: the listed probe address and its never
// listed neighbour, both in 198.19.0.0/16 (inside the benchmark range, which no drawn
// prefix overlaps), in a /24 of their own.
func worldAddrs(worldCIDR netip.Prefix) (probe, neighbour netip.Addr) {
	return benchkit.HostAddr(worldCIDR, 10), benchkit.HostAddr(worldCIDR, 11)
}

// worldAddrs6 are the world's IPv6 addresses, each paired with its IPv4 one (worldAddrs)
// as an endpoint's is, in range6Of(worldCIDR).
func worldAddrs6(worldCIDR netip.Prefix) (probe, neighbour netip.Addr) {
	p4, n4 := worldAddrs(worldCIDR)
	cidr6 := range6Of(worldCIDR, true)
	// No error: the ranges are the benchmark's own, a /24 and a /64.
	probe, _, _ = podaddr.Addrs(worldCIDR, cidr6, p4)
	neighbour, _, _ = podaddr.Addrs(worldCIDR, cidr6, n4)
	return probe, neighbour
}

// buildPlain creates a topology with no agent: node namespace, client and server, built
// with internal/endpoint, the very code the agent uses to create endpoints (veth pairs,
// /32 addresses and routes, sysctls), so that the path differs from the agent's only by
// the agent's programs. The peers' filters are installed in its client namespace, as the
// original benchmark filters on the client machine. With ipv6 it is dual-stack.
func buildPlain(name, instance string, podCIDR, worldCIDR netip.Prefix, ipv6 bool) (t *topology, err error) {
	node := endpoint.Node{Instance: instance, Netns: "rp-" + instance + "-node", PodCIDR: podCIDR, PodCIDR6: range6Of(podCIDR, ipv6)}
	t = &topology{Name: name, NodeNetns: node.NetnsPath(), IPv6: ipv6}
	defer func() {
		if err != nil {
			err = errors.Join(err, t.Close())
		}
	}()
	t.cleanup = append(t.cleanup, node.Teardown)
	if err := node.Setup(); err != nil {
		return nil, fmt.Errorf("setting up node namespace of %s: %w", name, err)
	}
	for _, e := range []struct {
		name string
		n    uint32
		dst  **host
	}{{"client", 10, &t.Client}, {"server", 11, &t.Server}} {
		t.cleanup = append(t.cleanup, func() error { return node.Delete(benchNamespace, e.name) })
		ep, err := node.Create(benchNamespace, e.name, benchkit.HostAddr(podCIDR, e.n))
		if err != nil {
			return nil, fmt.Errorf("creating %s of %s: %w", e.name, name, err)
		}
		*e.dst = &host{Name: e.name, IP: ep.IP, IP6: ep.IP6, Netns: ep.NetnsPath, HostIf: ep.HostIfName}
	}
	if err := t.addWorld(node.Netns, instance, worldCIDR); err != nil {
		return nil, err
	}
	return t, nil
}

// addWorld creates the world namespace behind node namespace nodeNetns (a plain
// topology's or an agent's). It is an endpoint-shaped namespace made with internal/endpoint
// under a node description of its own whose range is the world's /24: its router address
// goes on the node's lo beside the agent's, so the world routes back through the node like
// an endpoint does, but no agent knows of it.
func (t *topology) addWorld(nodeNetns, instance string, worldCIDR netip.Prefix) error {
	probe, neighbour := worldAddrs(worldCIDR)
	world, ep, err := t.addPlainHost(nodeNetns, instance+"-w", "world", worldCIDR, probe)
	if err != nil {
		return err
	}
	t.World = &host{Name: "world", IP: probe, IP6: ep.IP6, Netns: ep.NetnsPath, HostIf: ep.HostIfName}
	t.Neighbour = neighbour
	if err := addNeighbour(nodeNetns, ep, neighbour, world.Router(), 0); err != nil {
		return err
	}
	if !t.IPv6 {
		return nil
	}
	_, t.Neighbour6 = worldAddrs6(worldCIDR)
	// No duplicate address detection (it would hold the address for a second) and no
	// prefix route, as internal/endpoint adds an endpoint's IPv6 address.
	return addNeighbour(nodeNetns, ep, t.Neighbour6, world.Router6(), unix.IFA_F_NODAD|unix.IFA_F_NOPREFIXROUTE)
}

// addNeighbour puts the neighbour address a on the world's eth0 (with address flags) and
// routes it to the world from the node namespace, from the node's address src.
func addNeighbour(nodeNetns string, world endpoint.Endpoint, a, src netip.Addr, flags int) error {
	host := netip.PrefixFrom(a, a.BitLen())
	err := endpoint.Do(world.NetnsPath, func() error {
		eth, err := netlink.LinkByName(endpoint.PodIfName)
		if err != nil {
			return err
		}
		return netlink.AddrAdd(eth, &netlink.Addr{IPNet: netipNet(host), Flags: flags})
	})
	if err != nil {
		return fmt.Errorf("adding %v to the world: %w", a, err)
	}
	err = endpoint.Do(endpoint.NetnsPath(nodeNetns), func() error {
		return netlink.RouteReplace(&netlink.Route{
			LinkIndex: world.HostIfIndex,
			Dst:       netipNet(host),
			Scope:     netlink.SCOPE_LINK,
			Src:       src.AsSlice(),
		})
	})
	if err != nil {
		return fmt.Errorf("routing %v to the world: %w", a, err)
	}
	return nil
}

// addPlainHost creates a namespace named name with address ip behind node namespace
// nodeNetns, made with internal/endpoint under a node description of its own (instance,
// range cidr, whose router address goes on the node's lo), so it routes through the node
// like an endpoint but no agent knows of it.
func (t *topology) addPlainHost(nodeNetns, instance, name string, cidr netip.Prefix, ip netip.Addr) (endpoint.Node, endpoint.Endpoint, error) {
	node := endpoint.Node{Instance: instance, Netns: nodeNetns, PodCIDR: cidr, PodCIDR6: range6Of(cidr, t.IPv6)}
	if err := node.Setup(); err != nil {
		return node, endpoint.Endpoint{}, fmt.Errorf("adding the %s's router address: %w", name, err)
	}
	t.cleanup = append(t.cleanup, func() error { return node.Delete(name, name) })
	ep, err := node.Create(name, name, ip)
	if err != nil {
		return node, ep, fmt.Errorf("creating the %s namespace: %w", name, err)
	}
	return node, ep, nil
}

// addServer creates the measured server of an agent topology: a plain namespace behind the
// agent's node namespace at the 11th address of cidr, not an endpoint. The original
// benchmark's server is another machine that the client's filter does not touch; as an
// endpoint it would add the agent's ingress program to every packet, which no peer pays.
func (t *topology) addServer(nodeNetns, instance string, cidr netip.Prefix) error {
	ip := benchkit.HostAddr(cidr, 11)
	_, ep, err := t.addPlainHost(nodeNetns, instance+"-s", "server", cidr, ip)
	if err != nil {
		return err
	}
	t.Server = &host{Name: "server", IP: ip, IP6: ep.IP6, Netns: ep.NetnsPath, HostIf: ep.HostIfName}
	return nil
}

func netipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

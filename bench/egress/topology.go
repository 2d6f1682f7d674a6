package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"

	"github.com/vishvananda/netlink"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/endpoint"
)

// benchNamespace is the Kubernetes-style namespace of every endpoint the benchmark creates.
const benchNamespace = "bench"

// host is one network namespace of a topology: the client, the server or the world.
type host struct {
	Name   string
	IP     netip.Addr
	Netns  string // path, for nsenter --net and endpoint.Do
	HostIf string // the host-side veth in the node namespace
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
	cleanup   []func() error
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

// buildPlain creates a topology with no agent: node namespace, client and server, built
// with internal/endpoint, the very code the agent uses to create endpoints (veth pairs,
// /32 addresses and routes, sysctls), so that the path differs from the agent's only by
// the agent's programs. The peers' filters are installed in its client namespace, as the
// original benchmark filters on the client machine.
func buildPlain(name, instance string, podCIDR, worldCIDR netip.Prefix) (t *topology, err error) {
	node := endpoint.Node{Instance: instance, Netns: "rp-" + instance + "-node", PodCIDR: podCIDR}
	t = &topology{Name: name, NodeNetns: node.NetnsPath()}
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
		*e.dst = &host{Name: e.name, IP: ep.IP, Netns: ep.NetnsPath, HostIf: ep.HostIfName}
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
	t.World = &host{Name: "world", IP: probe, Netns: ep.NetnsPath, HostIf: ep.HostIfName}
	t.Neighbour = neighbour
	// The neighbour: a second address on the world's eth0 and a route to it in the node.
	err = endpoint.Do(ep.NetnsPath, func() error {
		eth, err := netlink.LinkByName(endpoint.PodIfName)
		if err != nil {
			return err
		}
		return netlink.AddrAdd(eth, &netlink.Addr{IPNet: netipNet(netip.PrefixFrom(neighbour, 32))})
	})
	if err != nil {
		return fmt.Errorf("adding %v to the world: %w", neighbour, err)
	}
	err = endpoint.Do(endpoint.NetnsPath(nodeNetns), func() error {
		return netlink.RouteReplace(&netlink.Route{
			LinkIndex: ep.HostIfIndex,
			Dst:       netipNet(netip.PrefixFrom(neighbour, 32)),
			Scope:     netlink.SCOPE_LINK,
			Src:       world.Router().AsSlice(),
		})
	})
	if err != nil {
		return fmt.Errorf("routing %v to the world: %w", neighbour, err)
	}
	return nil
}

// addPlainHost creates a namespace named name with address ip behind node namespace
// nodeNetns, made with internal/endpoint under a node description of its own (instance,
// range cidr, whose router address goes on the node's lo), so it routes through the node
// like an endpoint but no agent knows of it.
func (t *topology) addPlainHost(nodeNetns, instance, name string, cidr netip.Prefix, ip netip.Addr) (endpoint.Node, endpoint.Endpoint, error) {
	node := endpoint.Node{Instance: instance, Netns: nodeNetns, PodCIDR: cidr}
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
	t.Server = &host{Name: "server", IP: ip, Netns: ep.NetnsPath, HostIf: ep.HostIfName}
	return nil
}

func netipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

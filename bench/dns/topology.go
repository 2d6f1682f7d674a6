package dns

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
)

// world is the namespace behind the agent's node namespace that stands for the internet:
// its own address in a /24 of its own, made with internal/endpoint under a node
// description of its own (so it routes back through the node like an endpoint, but no
// agent knows of it), and every address of WorldRange local on its lo (one route), which
// the node routes to it through its address (one route).
type world struct {
	node    endpoint.Node
	ep      endpoint.Endpoint
	cleanup []func() error
}

// addWorld creates the world behind node namespace nodeNetns (the agent's), for an
// instance, with its own address in cidr.
func addWorld(nodeNetns, instance string, cidr netip.Prefix) (w *world, err error) {
	w = &world{node: endpoint.Node{Instance: instance + "-w", Netns: nodeNetns, PodCIDR: cidr}}
	defer func() {
		if err != nil {
			err = errors.Join(err, w.Close())
		}
	}()
	if err := w.node.Setup(); err != nil {
		return w, fmt.Errorf("adding the world's router address: %w", err)
	}
	w.cleanup = append(w.cleanup, func() error { return w.node.Delete("world", "world") })
	if w.ep, err = w.node.Create("world", "world", benchkit.HostAddr(cidr, 10)); err != nil {
		return w, fmt.Errorf("creating the world namespace: %w", err)
	}
	rng := &net.IPNet{IP: WorldRange.Addr().AsSlice(), Mask: net.CIDRMask(WorldRange.Bits(), 32)}
	err = endpoint.Do(w.ep.NetnsPath, func() error {
		lo, err := netlink.LinkByName("lo")
		if err != nil {
			return err
		}
		// AnyIP: the whole range is local, so one listener on 0.0.0.0 answers on each.
		return netlink.RouteReplace(&netlink.Route{LinkIndex: lo.Attrs().Index, Dst: rng,
			Type: unix.RTN_LOCAL, Table: unix.RT_TABLE_LOCAL, Scope: unix.RT_SCOPE_HOST})
	})
	if err != nil {
		return w, fmt.Errorf("making %v local in the world: %w", WorldRange, err)
	}
	// Through the world's own address, not on-link: on-link, the node would keep a
	// neighbour entry per address of the range and, past gc_thresh3 (1,024), drop packets
	// to new ones ("neighbor table overflow"), which would count as first packets dropped.
	err = endpoint.Do(endpoint.NetnsPath(nodeNetns), func() error {
		return netlink.RouteReplace(&netlink.Route{LinkIndex: w.ep.HostIfIndex, Dst: rng,
			Gw: w.ep.IP.AsSlice(), Src: w.node.Router().AsSlice()})
	})
	if err != nil {
		return w, fmt.Errorf("routing %v to the world: %w", WorldRange, err)
	}
	return w, nil
}

// Command runs argv in the world's network namespace (only the network namespace is
// switched), in its own process group.
func (w *world) Command(ctx context.Context, argv ...string) *exec.Cmd {
	args := append([]string{"--net=" + w.ep.NetnsPath, "--"}, argv...)
	return benchkit.OwnGroup(exec.CommandContext(ctx, "nsenter", args...))
}

// Close removes the world namespace and its veth.
func (w *world) Close() error {
	var errs []error
	for i := len(w.cleanup) - 1; i >= 0; i-- {
		errs = append(errs, w.cleanup[i]())
	}
	w.cleanup = nil
	return errors.Join(errs...)
}

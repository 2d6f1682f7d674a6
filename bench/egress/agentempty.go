package egress

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/endpoint"
)

// agentEmptyFilter is Rampart's own topology with Rampart's programs taken out of the
// path: an agent of its own with the client as its endpoint, and while measured, the two
// TCX links of the client's host-side veth (the agent's pinned links) run empty programs
// instead of rampart_from_ep and rampart_to_ep. It blocks nothing and is measured like the
// A/A control. Where tcx-empty measures empty hooks on the peers' topology, this measures
// everything of Rampart's path except the programs' work (the agent's endpoint, node
// namespace and server placement, the agent process running beside the traffic), so that
// Rampart's ratio minus this one is what its programs cost. It loads no CIDR set and
// applies no policy: neither is consulted by a packet of an established flow.
type agentEmptyFilter struct {
	topo  *topology
	agent *benchkit.Agent
	empty *ebpf.Program
	links []link.Link     // the agent's two links, while swapped
	orig  []*ebpf.Program // their programs, put back by Remove
}

func (f *agentEmptyFilter) Name() string        { return FilterAgentEmpty }
func (f *agentEmptyFilter) Topology() *topology { return f.topo }
func (f *agentEmptyFilter) Prepare(context.Context, List, string, string) error {
	return nil
}

// Install swaps the programs of the agent's two links for the empty program (a link
// update: the hook never goes without a program).
func (f *agentEmptyFilter) Install(ctx context.Context) (install, error) {
	in := install{Entries: -1}
	var err error
	if f.empty, err = loadEmptyTC(); err != nil {
		return in, err
	}
	pins, err := clientLinkPins(f.agent, f.topo)
	if err != nil {
		return in, err
	}
	for i, pin := range pins {
		dir := linkDirs[i]
		l, err := link.LoadPinnedLink(pin, nil)
		if err != nil {
			return in, fmt.Errorf("opening the agent's %s link: %w", dir, err)
		}
		info, err := l.Info()
		var orig *ebpf.Program
		if err == nil {
			orig, err = ebpf.NewProgramFromID(info.Program)
		}
		if err == nil {
			err = l.Update(f.empty)
		}
		if err != nil {
			l.Close()
			if orig != nil {
				orig.Close()
			}
			return in, fmt.Errorf("swapping the agent's %s program: %w", dir, err)
		}
		f.links = append(f.links, l)
		f.orig = append(f.orig, orig)
	}
	return in, nil
}

// Remove puts the agent's programs back.
func (f *agentEmptyFilter) Remove(ctx context.Context) error {
	var errs []error
	for i, l := range f.links {
		errs = append(errs, l.Update(f.orig[i]), l.Close(), f.orig[i].Close())
	}
	f.links, f.orig = nil, nil
	if f.empty != nil {
		errs = append(errs, f.empty.Close())
		f.empty = nil
	}
	return errors.Join(errs...)
}

func (f *agentEmptyFilter) Version(ctx context.Context) string {
	return "Rampart's agent and topology, its two TCX links running programs that return TC_ACT_OK"
}

// linkDirs are the hooks of the agent's links, in the order clientLinkPins returns them.
var linkDirs = []string{"ingress", "egress"}

// agentEmptyFlags are the rampartd flags of the agent-empty filter's agent: its programs
// go on as TCX links, whose programs Install swaps.
var agentEmptyFlags = []string{"--attach=tcx"}

// clientLinkPins returns the pin paths of the agent's TCX links on the client's host-side
// veth (ingress: rampart_from_ep, egress: rampart_to_ep). The agent pins its links as
// <pin dir>/tcx/<ifindex>-<ingress|egress>.
func clientLinkPins(agent *benchkit.Agent, topo *topology) ([]string, error) {
	var ifindex int
	err := endpoint.Do(endpoint.NetnsPath(agent.NodeNetns()), func() error {
		veth, err := netlink.LinkByName(topo.Client.HostIf)
		if err == nil {
			ifindex = veth.Attrs().Index
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("finding the client's veth %s: %w", topo.Client.HostIf, err)
	}
	var pins []string
	for _, dir := range linkDirs {
		pins = append(pins, filepath.Join(agent.BPFDir, "tcx", fmt.Sprintf("%d-%s", ifindex, dir)))
	}
	return pins, nil
}

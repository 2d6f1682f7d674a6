package churn

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/endpoint"
)

// baseline makes and removes endpoints the plain way: what `ip netns add`, `ip link add
// ... type veth`, `ip addr`, `ip route` and `tc qdisc add ... clsact` do, through netlink
// from Go, with no agent. Its host-side veths live in a node namespace of its own, so it
// never touches the agent's.
type baseline struct {
	prefix   string // of every namespace it makes: <prefix>node, <prefix><n>
	nodePath string
	node     netns.NsHandle
	// empty is a program that passes every packet on, attached by addTCX as Rampart's
	// two programs are (TCX ingress and egress of the host-side veth).
	empty  *ebpf.Program
	h      *netlink.Handle
	router netip.Addr
	cidr   netip.Prefix
	next   uint32
	// peers is the namespace holding the other ends of the population's veths (populate);
	// -1 until then.
	peers   netns.NsHandle
	present int
}

func newBaseline(prefix string, cidr netip.Prefix) (*baseline, error) {
	b := &baseline{prefix: prefix, cidr: cidr, router: cidr.Masked().Addr().Next(), node: -1, peers: -1}
	empty, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type:         ebpf.SchedCLS,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, -1), asm.Return()}, // TCX_NEXT
		License:      "GPL",
	})
	if err != nil {
		return nil, fmt.Errorf("loading the baseline's empty program: %w", err)
	}
	b.empty = empty
	path, err := endpoint.CreateNetns(prefix + "node")
	if err != nil {
		empty.Close()
		return nil, fmt.Errorf("baseline node namespace: %w", err)
	}
	b.nodePath = path
	if b.node, err = netns.GetFromPath(path); err != nil {
		endpoint.DeleteNetns(prefix + "node")
		return nil, fmt.Errorf("opening baseline node namespace: %w", err)
	}
	if b.h, err = netlink.NewHandleAt(b.node); err != nil {
		b.close()
		return nil, fmt.Errorf("netlink in baseline node namespace: %w", err)
	}
	lo, err := b.h.LinkByName("lo")
	if err == nil {
		err = b.h.LinkSetUp(lo)
	}
	if err == nil {
		err = b.h.AddrAdd(lo, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(b.router, 32))})
	}
	if err != nil {
		b.close()
		return nil, fmt.Errorf("baseline node lo: %w", err)
	}
	return b, nil
}

// populate grows the baseline node namespace to n endpoints' worth of node-side state, as
// the agent's node namespace holds for its endpoints: a host-side veth and a /32 route
// each. The other ends share one namespace (a namespace per endpoint would double the
// run's thousands of namespaces, and they are not on the path of a change).
func (b *baseline) populate(n int) error {
	if !b.peers.IsOpen() {
		path, err := endpoint.CreateNetns(b.prefix + "peers")
		if err != nil {
			return fmt.Errorf("baseline peers namespace: %w", err)
		}
		if b.peers, err = netns.GetFromPath(path); err != nil {
			return err
		}
	}
	for ; b.present < n; b.present++ {
		host := fmt.Sprintf("rpbp%d", b.present)
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: host}, PeerName: fmt.Sprintf("p%d", b.present), PeerNamespace: netlink.NsFd(int(b.peers))}
		if err := b.h.LinkAdd(veth); err != nil {
			return fmt.Errorf("population veth %s: %w", host, err)
		}
		l, err := b.h.LinkByName(host)
		if err != nil {
			return err
		}
		if err := b.h.LinkSetUp(l); err != nil {
			return err
		}
		// Addresses past the churned endpoints' (the first 250 of the range): only routes
		// of this namespace, which nothing sends to.
		ip := benchkit.AddAddr(b.cidr.Masked().Addr(), uint32(256+b.present))
		if err := b.h.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Dst: ipNet(netip.PrefixFrom(ip, 32)), Scope: netlink.SCOPE_LINK}); err != nil {
			return fmt.Errorf("population route %v: %w", ip, err)
		}
	}
	return nil
}

// ep is one baseline endpoint.
type ep struct {
	netns  string
	hostIf string
	links  []link.Link // addTCX's
}

// add makes one endpoint: namespace, veth pair with its peer in it, the address, both
// links up, the routes on both sides and a clsact qdisc on the host side.
func (b *baseline) add() (e ep, err error) {
	n := b.next
	b.next++
	ip := netip.AddrFrom4(b.router.As4())
	for range n%250 + 1 {
		ip = ip.Next()
	}
	e = ep{netns: fmt.Sprintf("%s%d", b.prefix, n), hostIf: fmt.Sprintf("rpb%d", n)}
	path, err := endpoint.CreateNetns(e.netns)
	if err != nil {
		return e, err
	}
	defer func() {
		if err != nil {
			b.delete(e)
		}
	}()
	podNs, err := netns.GetFromPath(path)
	if err != nil {
		return e, err
	}
	defer podNs.Close()
	pod, err := netlink.NewHandleAt(podNs)
	if err != nil {
		return e, err
	}
	defer pod.Close()
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: e.hostIf}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(podNs))}
	if err := b.h.LinkAdd(veth); err != nil {
		return e, fmt.Errorf("veth: %w", err)
	}
	lo, err := pod.LinkByName("lo")
	if err != nil {
		return e, err
	}
	if err := pod.LinkSetUp(lo); err != nil {
		return e, err
	}
	eth, err := pod.LinkByName("eth0")
	if err != nil {
		return e, err
	}
	if err := pod.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(ip, 32))}); err != nil {
		return e, fmt.Errorf("address: %w", err)
	}
	if err := pod.LinkSetUp(eth); err != nil {
		return e, err
	}
	if err := pod.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Dst: ipNet(netip.PrefixFrom(b.router, 32)), Scope: netlink.SCOPE_LINK}); err != nil {
		return e, fmt.Errorf("route to router: %w", err)
	}
	if err := pod.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: b.router.AsSlice()}); err != nil {
		return e, fmt.Errorf("default route: %w", err)
	}
	host, err := b.h.LinkByName(e.hostIf)
	if err != nil {
		return e, err
	}
	if err := b.h.LinkSetUp(host); err != nil {
		return e, err
	}
	if err := b.h.RouteAdd(&netlink.Route{LinkIndex: host.Attrs().Index, Dst: ipNet(netip.PrefixFrom(ip, 32)), Scope: netlink.SCOPE_LINK}); err != nil {
		return e, fmt.Errorf("route: %w", err)
	}
	q := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: host.Attrs().Index, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := b.h.QdiscAdd(q); err != nil {
		return e, fmt.Errorf("clsact: %w", err)
	}
	return e, nil
}

// addTCX is add, and then attaches the empty program to the TCX ingress and egress hooks
// of the host-side veth, as Rampart attaches its programs: the kernel's cost of the
// objects an agent makes, attach included.
func (b *baseline) addTCX() (ep, error) {
	e, err := b.add()
	if err != nil {
		return e, err
	}
	// The index by a netlink request for the name (net.InterfaceByName lists every link).
	l, err := b.h.LinkByName(e.hostIf)
	if err != nil {
		return e, errors.Join(err, b.delete(e))
	}
	// The index is resolved in the calling thread's namespace.
	err = endpoint.Do(b.nodePath, func() error {
		for _, at := range []ebpf.AttachType{ebpf.AttachTCXEgress, ebpf.AttachTCXIngress} {
			lk, err := link.AttachTCX(link.TCXOptions{Interface: l.Attrs().Index, Program: b.empty, Attach: at})
			if err != nil {
				return fmt.Errorf("TCX attach: %w", err)
			}
			e.links = append(e.links, lk)
		}
		return nil
	})
	if err != nil {
		return e, errors.Join(err, b.delete(e))
	}
	return e, nil
}

// addClsBPF is add, and then puts the empty program on the clsact qdisc's ingress and
// egress as tc cls_bpf filters (direct action): the attach Rampart used before TCX.
func (b *baseline) addClsBPF() (ep, error) {
	e, err := b.add()
	if err != nil {
		return e, err
	}
	host, err := b.h.LinkByName(e.hostIf)
	if err == nil {
		for _, parent := range []uint32{netlink.HANDLE_MIN_EGRESS, netlink.HANDLE_MIN_INGRESS} {
			f := &netlink.BpfFilter{
				FilterAttrs:  netlink.FilterAttrs{LinkIndex: host.Attrs().Index, Parent: parent, Handle: 1, Priority: 1, Protocol: unix.ETH_P_ALL},
				Fd:           b.empty.FD(),
				Name:         "empty",
				DirectAction: true,
			}
			if err = b.h.FilterAdd(f); err != nil {
				err = fmt.Errorf("cls_bpf filter: %w", err)
				break
			}
		}
	}
	if err != nil {
		return e, errors.Join(err, b.delete(e))
	}
	return e, nil
}

// delete removes an endpoint: the veth (its peer, route, qdisc and programs go with it),
// then the namespace.
func (b *baseline) delete(e ep) error {
	defer func() {
		for _, l := range e.links { // already detached with the veth
			l.Close()
		}
	}()
	var errs []error
	if l, err := b.h.LinkByName(e.hostIf); err == nil {
		if err := b.h.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("deleting %s: %w", e.hostIf, err))
		}
	}
	if err := endpoint.DeleteNetns(e.netns); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// close removes the node namespace and every namespace left under the prefix.
func (b *baseline) close() error {
	if b.empty != nil {
		b.empty.Close()
	}
	if b.h != nil {
		b.h.Close()
	}
	if b.node.IsOpen() {
		b.node.Close()
	}
	if b.peers.IsOpen() {
		b.peers.Close()
	}
	return removeNamespaces(b.prefix)
}

// removeNamespaces deletes every named network namespace whose name starts with prefix
// (the prefix carries the run's instance name, so only this run's).
func removeNamespaces(prefix string) error {
	ents, err := os.ReadDir(endpoint.NetnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var errs []error
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), prefix) {
			errs = append(errs, endpoint.DeleteNetns(e.Name()))
		}
	}
	return errors.Join(errs...)
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

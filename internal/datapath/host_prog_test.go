package datapath

import (
	"net/netip"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/testenv"
)

// actUnspec is TC_ACT_UNSPEC, what the host programs return for a packet they pass: the
// device's next filter (the IP-in-IP overlay's) runs.
const actUnspec = 0xffffffff

var (
	ipHost  = addr("198.18.0.1")   // a host address (the router's)
	ipNode2 = addr("198.19.254.2") // another node
)

// hostFixture is the fixture world with the host addresses and another node in the
// ipcache.
func hostFixture(t *testing.T) *fixture {
	f := newFixture(t, Config{})
	ipc := fixtureIPCache()
	ipc[netip.PrefixFrom(ipHost, 32)] = mapstate.IPCacheEntry{Identity: identity.Host}
	ipc[netip.PrefixFrom(ipNode2, 32)] = mapstate.IPCacheEntry{Identity: identity.RemoteNode}
	if err := f.d.ApplyIPCache(ipc); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *fixture) applyHost(ifindex uint32, enforceIn, enforceOut bool, es ...entry) {
	f.t.Helper()
	err := f.d.ApplyEndpoint(ifindex, EndpointInfo{EpID: hostEpID, Identity: identity.Host, Addr: ipHost, Host: true},
		mapstate.EndpointPolicy{EnforceIngress: enforceIn, EnforceEgress: enforceOut, Entries: entries(es...)})
	if err != nil {
		f.t.Fatalf("ApplyEndpoint(host): %v", err)
	}
}

func (f *fixture) expectHostPass(name string, ret uint32) {
	f.t.Helper()
	if ret != actUnspec {
		f.t.Errorf("%s: verdict %d, want TC_ACT_UNSPEC (passed on)", name, ret)
	}
	f.drain()
}

func (f *fixture) expectHostDrop(name string, ret uint32, reason flow.Reason, dir uint8) {
	f.t.Helper()
	ev, ok := f.dropped(name, ret)
	if !ok {
		return
	}
	if ev.EpID != hostEpID || ev.Reason != reason || uint8(ev.Direction) != dir {
		f.t.Errorf("%s: dropped by endpoint %d (%v, direction %v), want the host's %v in direction %d", name, ev.EpID, ev.Reason, ev.Direction, reason, dir)
	}
}

// TestHostPolicy: on a host device, the node's own traffic is the host endpoint's, judged
// by its policy with conntrack; forwarded packets, ARP and the overlay between nodes pass
// on unjudged; host_safe flows pass whatever the policy. Between a local endpoint and the
// node, the endpoint's veth judges the node's side by the host's policy.
func TestHostPolicy(t *testing.T) {
	f := hostFixture(t)
	toHost := func(p packet) uint32 { return run(t, f.d.objs.RampartToHost, p.bytes(), epIfindex) }
	fromHost := func(p packet) uint32 { return run(t, f.d.objs.RampartFromHost, p.bytes(), epIfindex) }
	syn := func(src, dst netip.Addr, dport uint16) packet {
		return packet{src: src, dst: dst, proto: uint8(tcp), sport: f.port(), dport: dport, tcpFlags: 0x02}
	}

	// Ingress enforced: SSH from anyone; egress enforced: nothing allowed.
	f.applyHost(epIfindex, true, true, e(allow(identity.Any, in, tcp, 22, 16, 1)))
	f.expectHostPass("world to host:22", toHost(syn(ipOut, ipHost, 22)))
	f.expectHostDrop("world to host:23", toHost(syn(ipOut, ipHost, 23)), flow.ReasonPolicyDefaultDeny, uint8(in))
	f.expectHostPass("forwarded to a pod", toHost(syn(ipOut, epIP, 23)))
	f.expectHostPass("forwarded from a pod", fromHost(syn(epIP, ipOut, 443)))
	f.expectHostPass("VXLAN from a node", toHost(packet{src: ipNode2, dst: ipHost, proto: uint8(udp), sport: 50000, dport: vxlanPort}))
	f.expectHostPass("VXLAN to a node", fromHost(packet{src: ipHost, dst: ipNode2, proto: uint8(udp), sport: 50000, dport: vxlanPort}))
	f.expectHostDrop("VXLAN port from the world", toHost(packet{src: ipOut, dst: ipHost, proto: uint8(udp), sport: 50000, dport: vxlanPort}),
		flow.ReasonPolicyDefaultDeny, uint8(in))
	f.expectHostPass("ARP", toHost(packet{ethType: 0x0806, src: ipOut, dst: ipHost}))
	f.expectHostDrop("host to the world:443", fromHost(syn(ipHost, ipOut, 443)), flow.ReasonPolicyDefaultDeny, uint8(out))
	f.expectHostDrop("a host address from outside is not the host", toHost(syn(ipHost, ipHost, 22+1)), flow.ReasonPolicyDefaultDeny, uint8(in))

	// The API server's address and port: allowed both ways, the reply by conntrack.
	if err := f.d.SetHostSafe([]HostSafe{{Addr: netip.AddrPortFrom(ipOut, 443), Proto: uint8(tcp)}}); err != nil {
		t.Fatal(err)
	}
	s := syn(ipHost, ipOut, 443)
	if ret := fromHost(s); ret != actUnspec {
		t.Errorf("host to the API server: verdict %d, want passed on", ret)
	} else if ev := nextEvent(t, f.ev); ev.RuleID != hostSafeRuleID {
		t.Errorf("host to the API server: rule %d, want HOST_SAFE_RULE_ID", ev.RuleID)
	}
	f.drain()
	f.expectHostPass("the API server's reply", toHost(packet{src: ipOut, dst: ipHost, proto: uint8(tcp), sport: 443, dport: s.sport, tcpFlags: 0x12}))
	f.expectHostDrop("host to the API server's address, another port", fromHost(syn(ipHost, ipOut, 444)), flow.ReasonPolicyDefaultDeny, uint8(out))
	if err := f.d.SetHostSafe(nil); err != nil {
		t.Fatal(err)
	}
	f.expectHostDrop("host to the API server, once no longer safe", fromHost(syn(ipHost, ipOut, 443)), flow.ReasonPolicyDefaultDeny, uint8(out))

	// Between the endpoint (on ifindex 1) and the node: the host endpoint on another
	// device admits TCP 9100 from the endpoint and may open TCP 80 to it.
	const hostDev = 77
	if err := f.d.RemoveEndpoint(epIfindex, hostEpID); err != nil {
		t.Fatal(err)
	}
	f.apply(false, false)
	f.applyHost(hostDev, true, true, e(allow(epIdent, in, tcp, 9100, 16, 2)), e(allow(epIdent, out, tcp, 80, 16, 3)))
	est := syn(epIP, ipHost, 9100)
	f.expectPass("endpoint to host:9100", f.fromEp(est))
	f.expectHostDrop("endpoint to host:9200", f.fromEp(syn(epIP, ipHost, 9200)), flow.ReasonPolicyDefaultDeny, uint8(in))
	f.expectPass("endpoint to the world (not the host's)", f.fromEp(syn(epIP, ipOut, 9200)))
	f.expectPass("host to endpoint:80", f.toEp(syn(ipHost, epIP, 80)))
	f.expectHostDrop("host to endpoint:81", f.toEp(syn(ipHost, epIP, 81)), flow.ReasonPolicyDefaultDeny, uint8(out))
	// A deny entry the host's policy gains reaches the established flow once flows are
	// checked again (the agent asks for it with every host policy change).
	ack := est
	ack.tcpFlags = 0x10
	f.expectPass("endpoint to host:9100, established", f.fromEp(ack))
	f.applyHost(hostDev, true, true, e(allow(epIdent, in, tcp, 9100, 16, 2)), e(allow(epIdent, out, tcp, 80, 16, 3)),
		e(deny(epIdent, in, tcp, 9100, 16, 4)))
	if err := f.d.RecheckFlows(); err != nil {
		t.Fatal(err)
	}
	f.expectHostDrop("endpoint to host:9100, established, after a host deny", f.fromEp(ack), flow.ReasonPolicyDeny, uint8(in))
	if err := f.d.RemoveEndpoint(hostDev, hostEpID); err != nil {
		t.Fatal(err)
	}
	f.expectPass("host to endpoint:81 without a host endpoint", f.toEp(syn(ipHost, epIP, 81)))
}

// AttachHost puts the host programs on a device beside the IP-in-IP overlay's, before
// them in priority order; a device that leaves the list loses them; DetachHost leaves the
// overlay's alone.
func TestHostAttach(t *testing.T) {
	testenv.RequireRoot(t)
	d := openTest(t, Config{})
	ns := testenv.NewNetns(t, "rphost-"+testenv.Suffix(6))
	h := testenv.NetlinkHandle(t, ns)
	for _, pair := range [][2]string{{"fab0", "peer0"}, {"fab1", "peer1"}} {
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: pair[0]}, PeerName: pair[1]}); err != nil {
			t.Fatal(err)
		}
	}
	filters := func(name string) []string { return testenv.BPFFilterNames(t, h, name) }
	if err := d.AttachIPIP(ns, addr("198.19.0.1"), []string{"fab0"}); err != nil {
		t.Fatal(err)
	}
	idxs, err := d.AttachHost(ns, []string{"fab0", "fab1"})
	if err != nil {
		t.Fatal(err)
	}
	fab0, _ := h.LinkByName("fab0")
	if len(idxs) != 2 || idxs[0] != uint32(fab0.Attrs().Index) {
		t.Errorf("AttachHost returned %v, want fab0's index %d first", idxs, fab0.Attrs().Index)
	}
	both := []string{filterFromHost, filterFromIPIP, filterToHost, filterToIPIP}
	if got := filters("fab0"); !slices.Equal(got, both) {
		t.Errorf("fab0: filters %v, want %v", got, both)
	}
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		fs, err := h.FilterList(fab0, parent)
		if err != nil {
			t.Fatal(err)
		}
		slices.SortFunc(fs, func(a, b netlink.Filter) int { return int(a.Attrs().Priority) - int(b.Attrs().Priority) })
		if first := fs[0].(*netlink.BpfFilter).Name; first != filterToHost && first != filterFromHost {
			t.Errorf("fab0 parent %x: %s runs first, want the host program", parent, first)
		}
	}
	if _, err := d.AttachHost(ns, []string{"fab0"}); err != nil {
		t.Fatal(err)
	}
	if got := filters("fab1"); len(got) != 0 {
		t.Errorf("fab1 after it left the host devices: filters %v", got)
	}
	if _, err := DetachHost(ns); err != nil {
		t.Fatal(err)
	}
	if got, want := filters("fab0"), []string{filterFromIPIP, filterToIPIP}; !slices.Equal(got, want) {
		t.Errorf("fab0 after DetachHost: filters %v, want %v", got, want)
	}
}

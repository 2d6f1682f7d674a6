package datapath

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/testenv"
)

// The fixture world. The endpoint under test sits on ifindex 1: BPF_PROG_RUN runs a tc
// program on the loopback device unless the __sk_buff context names another interface
// (see skbContext), so ifindex 1 needs no device setup.
const (
	epIfindex = 1
	epID      = 7
	epIdent   = identity.Identity(1000)
	idA       = identity.Identity(2000)
	idB       = identity.Identity(3000)
	idPod     = identity.Identity(4000)
	cidrID    = identity.FirstCIDR + 1
	flagged   = identity.EndpointCIDRFlag | cidrID
)

var (
	epIP   = addr("198.18.0.10")
	ipA    = addr("198.18.0.20")
	ipB    = addr("198.18.0.30")
	ipPod  = addr("198.18.1.5")  // an endpoint inside the policy CIDR
	ipCIDR = addr("198.18.1.6")  // a plain address inside the policy CIDR
	ipOut  = addr("203.0.113.9") // world
)

const (
	tcp  = policy.ProtoTCP
	udp  = policy.ProtoUDP
	icmp = policy.ProtoICMP
	in   = policy.Ingress
	out  = policy.Egress
)

type fixture struct {
	t     *testing.T
	d     *Datapath
	ev    *EventReader
	sport uint16
}

// fixtureIPCache is the fixture world's ipcache.
func fixtureIPCache() map[netip.Prefix]mapstate.IPCacheEntry {
	return map[netip.Prefix]mapstate.IPCacheEntry{
		netip.MustParsePrefix("0.0.0.0/0"):       {Identity: identity.World},
		netip.MustParsePrefix("198.18.0.10/32"):  {Identity: epIdent, EndpointID: epID},
		netip.MustParsePrefix("198.18.0.20/32"):  {Identity: idA},
		netip.MustParsePrefix("198.18.0.30/32"):  {Identity: idB},
		netip.MustParsePrefix("198.18.1.0/24"):   {Identity: cidrID},
		netip.MustParsePrefix("198.18.1.5/32"):   {Identity: idPod, Secondary: flagged},
		netip.MustParsePrefix("198.18.255.0/24"): {Identity: identity.FirstCIDR + 2},
	}
}

func newFixture(t *testing.T, cfg Config) *fixture {
	t.Helper()
	d := openTest(t, cfg)
	if err := d.IPCache.ApplyIPCache(fixtureIPCache()); err != nil {
		t.Fatal(err)
	}
	return &fixture{t: t, d: d, ev: eventsOf(t, d), sport: 40000}
}

func (f *fixture) apply(enforceIn, enforceOut bool, es ...entry) {
	f.t.Helper()
	err := f.d.Endpoints.ApplyEndpoint(epIfindex, EndpointInfo{EpID: epID, Identity: epIdent, Addr: epIP},
		mapstate.EndpointPolicy{EnforceIngress: enforceIn, EnforceEgress: enforceOut, Entries: entries(es...)})
	if err != nil {
		f.t.Fatalf("ApplyEndpoint: %v", err)
	}
}

// toEp runs the tc egress program (packet entering the endpoint: ingress policy).
func (f *fixture) toEp(p packet) uint32 {
	f.t.Helper()
	return run(f.t, f.d.objs.RampartToEp, p.bytes(), epIfindex)
}

// fromEp runs the tc ingress program (packet sent by the endpoint: egress policy).
func (f *fixture) fromEp(p packet) uint32 {
	f.t.Helper()
	return run(f.t, f.d.objs.RampartFromEp, p.bytes(), epIfindex)
}

// port returns a source port not used before in this fixture (a new flow).
func (f *fixture) port() uint16 { f.sport++; return f.sport }

func (f *fixture) synIn(src netip.Addr, dport uint16) packet {
	return packet{src: src, dst: epIP, proto: uint8(tcp), sport: f.port(), dport: dport, tcpFlags: 0x02}
}

func (f *fixture) drain() {
	f.t.Helper()
	for {
		f.ev.SetDeadline(time.Now().Add(20 * time.Millisecond))
		if _, err := f.ev.Read(); err != nil {
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				f.t.Fatalf("draining events: %v", err)
			}
			return
		}
	}
}

// dropped checks a drop verdict and returns its event (ok false, reported, when ret is
// not a drop).
func (f *fixture) dropped(name string, ret uint32) (ev flow.Event, ok bool) {
	f.t.Helper()
	if ret != actShot {
		f.t.Errorf("%s: verdict %d, want drop", name, ret)
		f.drain()
		return ev, false
	}
	return nextEvent(f.t, f.ev), true
}

// expectDrop checks a drop verdict and its event's reason.
func (f *fixture) expectDrop(name string, ret uint32, reason flow.Reason) {
	f.t.Helper()
	ev, ok := f.dropped(name, ret)
	if !ok {
		return
	}
	if ev.Type != flow.EventDrop || ev.Verdict != flow.VerdictDropped || ev.Reason != reason {
		f.t.Errorf("%s: event %v/%v/%v, want drop/dropped/%v", name, ev.Type, ev.Verdict, ev.Reason, reason)
	}
}

func (f *fixture) expectPass(name string, ret uint32) {
	f.t.Helper()
	if ret != actOK {
		f.t.Errorf("%s: verdict %d, want pass", name, ret)
	}
	f.drain()
}

func TestTCPByIdentityAndPort(t *testing.T) {
	f := newFixture(t, Config{})
	f.apply(true, false, e(allow(idA, in, tcp, 80, 16, 11)))

	f.expectPass("A:80", f.toEp(f.synIn(ipA, 80)))
	f.expectDrop("A:81", f.toEp(f.synIn(ipA, 81)), flow.ReasonPolicyDefaultDeny)
	f.expectDrop("B:80", f.toEp(f.synIn(ipB, 80)), flow.ReasonPolicyDefaultDeny)
	f.expectDrop("world:80", f.toEp(f.synIn(ipOut, 80)), flow.ReasonPolicyDefaultDeny)
	// UDP to the same port is another protocol.
	f.expectDrop("A:80/udp", f.toEp(packet{src: ipA, dst: epIP, proto: uint8(udp), sport: f.port(), dport: 80}), flow.ReasonPolicyDefaultDeny)

	// Egress is not enforced: anything leaving passes.
	f.expectPass("egress unenforced", f.fromEp(packet{src: epIP, dst: ipOut, proto: uint8(tcp), sport: f.port(), dport: 443, tcpFlags: 0x02}))

	// Deny entries beat the unenforced default too.
	f.apply(false, false, e(deny(idA, in, tcp, 80, 16, 12)))
	f.expectDrop("deny without enforcement", f.toEp(f.synIn(ipA, 80)), flow.ReasonPolicyDeny)
	f.expectPass("no entry without enforcement", f.toEp(f.synIn(ipB, 80)))
}

func TestPortRangePrefix(t *testing.T) {
	f := newFixture(t, Config{})
	// 8080/13 covers 8080-8087.
	f.apply(true, false, e(allow(idA, in, tcp, 8080, 13, 1)))
	for _, c := range []struct {
		port uint16
		pass bool
	}{{8079, false}, {8080, true}, {8083, true}, {8087, true}, {8088, false}, {80, false}} {
		ret := f.toEp(f.synIn(ipA, c.port))
		if c.pass {
			f.expectPass("port", ret)
		} else {
			f.expectDrop("port", ret, flow.ReasonPolicyDefaultDeny)
		}
	}
	// Any port of a protocol (prefix length 0) and any protocol.
	f.apply(true, false, e(allow(idA, in, udp, 0, 0, 2)), e(allow(idB, in, policy.ProtoAny, 0, 0, 3)))
	f.expectPass("udp any port", f.toEp(packet{src: ipA, dst: epIP, proto: uint8(udp), sport: f.port(), dport: 9999}))
	f.expectDrop("tcp not allowed for A", f.toEp(f.synIn(ipA, 9999)), flow.ReasonPolicyDefaultDeny)
	f.expectPass("any proto B tcp", f.toEp(f.synIn(ipB, 1)))
	f.expectPass("any proto B sctp", f.toEp(packet{src: ipB, dst: epIP, proto: uint8(policy.ProtoSCTP), sport: f.port(), dport: 5}))
	f.expectPass("any proto B icmp", f.toEp(packet{src: ipB, dst: epIP, proto: uint8(icmp), icmpType: 13}))
}

func TestAnyAndSecondaryIdentity(t *testing.T) {
	f := newFixture(t, Config{})
	f.apply(true, false,
		e(allow(identity.Any, in, udp, 53, 16, 1)),
		e(allow(flagged, in, tcp, 443, 16, 2)),
		e(allow(cidrID, in, tcp, 8443, 16, 3)),
	)
	f.expectPass("any identity, A", f.toEp(packet{src: ipA, dst: epIP, proto: uint8(udp), sport: f.port(), dport: 53}))
	f.expectPass("any identity, world", f.toEp(packet{src: ipOut, dst: epIP, proto: uint8(udp), sport: f.port(), dport: 53}))
	f.expectPass("flagged CIDR identity of a pod", f.toEp(f.synIn(ipPod, 443)))
	f.expectDrop("plain address in CIDR is not a pod", f.toEp(f.synIn(ipCIDR, 443)), flow.ReasonPolicyDefaultDeny)
	f.expectPass("plain CIDR identity", f.toEp(f.synIn(ipCIDR, 8443)))
	f.expectDrop("pod does not carry the plain CIDR identity", f.toEp(f.synIn(ipPod, 8443)), flow.ReasonPolicyDefaultDeny)
}

func TestDenyWinsAcrossLookups(t *testing.T) {
	f := newFixture(t, Config{})
	f.apply(true, false,
		// peer allow, any-identity deny
		e(allow(idA, in, tcp, 80, 16, 1)),
		e(deny(identity.Any, in, tcp, 80, 16, 2)),
		// any-identity allow, peer deny
		e(allow(identity.Any, in, tcp, 81, 16, 3)),
		e(deny(idA, in, tcp, 81, 16, 4)),
		// peer allow all, flagged-CIDR deny on 22
		e(allow(idPod, in, policy.ProtoAny, 0, 0, 5)),
		e(deny(flagged, in, tcp, 22, 16, 6)),
		// flagged allow, peer deny
		e(allow(flagged, in, tcp, 23, 16, 7)),
		e(deny(idPod, in, tcp, 23, 16, 8)),
	)
	check := func(name string, src netip.Addr, port uint16, rule uint32) {
		t.Helper()
		ret := f.toEp(f.synIn(src, port))
		if ret != actShot {
			t.Errorf("%s: verdict %d, want drop", name, ret)
			f.drain()
			return
		}
		ev := nextEvent(t, f.ev)
		if ev.Reason != flow.ReasonPolicyDeny || ev.RuleID != rule {
			t.Errorf("%s: reason %v rule %d, want policy-deny rule %d", name, ev.Reason, ev.RuleID, rule)
		}
	}
	check("any deny over peer allow", ipA, 80, 2)
	check("peer deny over any allow", ipA, 81, 4)
	check("flagged deny over peer allow", ipPod, 22, 6)
	check("peer deny over flagged allow", ipPod, 23, 8)
	f.expectDrop("B:80 denied by any", f.toEp(f.synIn(ipB, 80)), flow.ReasonPolicyDeny)
	f.expectPass("B:81 allowed by any", f.toEp(f.synIn(ipB, 81)))
}

func TestConntrackEstablishedAndReply(t *testing.T) {
	f := newFixture(t, Config{})
	f.apply(true, true, e(allow(idA, in, tcp, 80, 16, 1)))

	syn := f.synIn(ipA, 80)
	f.expectPass("syn", f.toEp(syn))
	reply := packet{src: epIP, dst: ipA, proto: uint8(tcp), sport: 80, dport: syn.sport, tcpFlags: 0x12}
	f.expectPass("syn-ack (reply, egress enforced)", f.fromEp(reply))

	// Remove the allow: the flow continues, new flows are dropped.
	f.apply(true, true)
	ack := syn
	ack.tcpFlags = 0x10
	f.expectPass("established after removal", f.toEp(ack))
	reply.tcpFlags = 0x10
	f.expectPass("reply after removal", f.fromEp(reply))
	f.expectDrop("new flow after removal", f.toEp(f.synIn(ipA, 80)), flow.ReasonPolicyDefaultDeny)
	// A packet from the endpoint with the flow's forward tuple in the other direction is
	// no reply either: its source is not the endpoint's address.
	f.expectDrop("same tuple, other direction", f.fromEp(packet{src: ipA, dst: epIP, proto: uint8(tcp), sport: syn.sport, dport: 80, tcpFlags: 0x02}), flow.ReasonSpoofedSource)

	// RST then a fresh SYN on the same tuple: evaluated again (and dropped).
	rst := syn
	rst.tcpFlags = 0x04
	f.expectPass("rst", f.toEp(rst))
	f.expectDrop("syn reusing a closed tuple", f.toEp(syn), flow.ReasonPolicyDefaultDeny)
	// So is a SYN from the other side reusing it reversed: a new connection, not a reply
	// of the closed one (the endpoint's egress allows nothing).
	f.expectDrop("syn from the endpoint reusing the closed tuple reversed",
		f.fromEp(packet{src: epIP, dst: ipA, proto: uint8(tcp), sport: 80, dport: syn.sport, tcpFlags: 0x02}), flow.ReasonPolicyDefaultDeny)
}

func TestConntrackTimeout(t *testing.T) {
	// A 1ns timeout for non-TCP (less than a tick: expired at the next tick): every UDP
	// packet a tick later is a new flow again.
	f := newFixture(t, Config{CTTimeouts: CTTimeouts{Other: time.Nanosecond}})
	f.apply(true, true, e(allow(idA, out, udp, 53, 16, 1)))
	q := packet{src: epIP, dst: ipA, proto: uint8(udp), sport: f.port(), dport: 53}
	before, err := jiffiesNow()
	if err != nil {
		t.Fatal(err)
	}
	f.expectPass("query", f.fromEp(q))
	for deadline := time.Now().Add(time.Second); ; {
		now, err := jiffiesNow()
		if err != nil {
			t.Fatal(err)
		}
		if now > before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the kernel's tick did not advance in 1 s")
		}
		runtime.Gosched()
	}
	a := packet{src: ipA, dst: epIP, proto: uint8(udp), sport: 53, dport: q.sport}
	f.expectDrop("answer after the entry expired", f.toEp(a), flow.ReasonPolicyDefaultDeny)
}

// Conntrack times are kernel ticks: with a 1 s timeout, a flow last seen half a second ago
// is live (its answer passes), one last seen two seconds ago has expired (its answer is a
// new flow, which ingress policy refuses).
func TestConntrackTimeoutTicks(t *testing.T) {
	f := newFixture(t, Config{CTTimeouts: CTTimeouts{Other: time.Second}})
	f.apply(true, true, e(allow(idA, out, udp, 53, 16, 1)))
	tick, err := kernelTick()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		ago  time.Duration
		live bool
	}{{500 * time.Millisecond, true}, {2 * time.Second, false}} {
		q := packet{src: epIP, dst: ipA, proto: uint8(udp), sport: f.port(), dport: 53}
		now, err := jiffiesNow()
		if err != nil {
			t.Fatal(err)
		}
		k := ct4Key(q, epID, uint8(policy.Egress))
		then := now - toJiffies(c.ago, tick)
		v := rampartCtValue{Created: then, LastSeen: then, Flags: ctFSeenReply, Direction: uint8(policy.Egress)}
		if err := f.d.objs.Conntrack4Peer.Update(&k, &v, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
		a := packet{src: ipA, dst: epIP, proto: uint8(udp), sport: 53, dport: q.sport}
		if c.live {
			f.expectPass(fmt.Sprintf("answer, flow last seen %v ago", c.ago), f.toEp(a))
		} else {
			f.expectDrop(fmt.Sprintf("answer, flow last seen %v ago", c.ago), f.toEp(a), flow.ReasonPolicyDefaultDeny)
		}
	}
}

func TestUDP(t *testing.T) {
	f := newFixture(t, Config{})
	f.apply(true, true, e(allow(idA, out, udp, 53, 16, 1)))
	q := packet{src: epIP, dst: ipA, proto: uint8(udp), sport: f.port(), dport: 53}
	f.expectPass("query", f.fromEp(q))
	f.expectPass("answer", f.toEp(packet{src: ipA, dst: epIP, proto: uint8(udp), sport: 53, dport: q.sport}))
	f.expectPass("second query, same flow", f.fromEp(q))
	f.expectDrop("answer from another port", f.toEp(packet{src: ipA, dst: epIP, proto: uint8(udp), sport: 54, dport: q.sport}), flow.ReasonPolicyDefaultDeny)
	f.expectDrop("query to another port", f.fromEp(packet{src: epIP, dst: ipA, proto: uint8(udp), sport: f.port(), dport: 54}), flow.ReasonPolicyDefaultDeny)
	f.expectDrop("query to another peer", f.fromEp(packet{src: epIP, dst: ipB, proto: uint8(udp), sport: f.port(), dport: 53}), flow.ReasonPolicyDefaultDeny)
}

func TestICMP(t *testing.T) {
	f := newFixture(t, Config{})
	f.apply(true, true,
		e(allow(idA, out, icmp, 8, 16, 1)), // echo request to A
		e(allow(idA, out, tcp, 80, 16, 2)),
	)
	req := packet{src: epIP, dst: ipA, proto: uint8(icmp), icmpType: 8, icmpID: 77}
	f.expectPass("echo request", f.fromEp(req))
	f.expectPass("echo reply", f.toEp(packet{src: ipA, dst: epIP, proto: uint8(icmp), icmpType: 0, icmpID: 77}))
	f.expectDrop("echo reply, other id", f.toEp(packet{src: ipA, dst: epIP, proto: uint8(icmp), icmpType: 0, icmpID: 78}), flow.ReasonPolicyDefaultDeny)
	f.expectDrop("echo request from A, same id", f.toEp(packet{src: ipA, dst: epIP, proto: uint8(icmp), icmpType: 8, icmpID: 77}), flow.ReasonPolicyDefaultDeny)
	f.expectDrop("echo request to B", f.fromEp(packet{src: epIP, dst: ipB, proto: uint8(icmp), icmpType: 8, icmpID: 77}), flow.ReasonPolicyDefaultDeny)
	// Port in the policy key is the ICMP type: timestamp (13) is not echo (8).
	f.expectDrop("timestamp request to A", f.fromEp(packet{src: epIP, dst: ipA, proto: uint8(icmp), icmpType: 13}), flow.ReasonPolicyDefaultDeny)

	// ICMP errors are related to the flow they quote (who may send them:
	// TestICMPErrorSender).
	syn := packet{src: epIP, dst: ipA, proto: uint8(tcp), sport: f.port(), dport: 80, tcpFlags: 0x02}
	f.expectPass("syn to A", f.fromEp(syn))
	quoted := syn.ipv4()[:28]
	f.expectPass("unreachable about the flow", f.toEp(packet{src: ipA, dst: epIP, proto: uint8(icmp), icmpType: 3, quoted: quoted}))
	other := syn
	other.sport++
	f.expectDrop("unreachable about another flow", f.toEp(packet{src: ipOut, dst: epIP, proto: uint8(icmp), icmpType: 3, quoted: other.ipv4()[:28]}), flow.ReasonPolicyDefaultDeny)
	f.expectDrop("unreachable quoting too little", f.toEp(packet{src: ipOut, dst: epIP, proto: uint8(icmp), icmpType: 3, quoted: quoted[:22]}), flow.ReasonPolicyDefaultDeny)
}

func TestIPOptions(t *testing.T) {
	f := newFixture(t, Config{})
	f.apply(true, false, e(allow(idA, in, tcp, 80, 16, 1)))
	// 8 bytes of options (router alert + NOPs): ihl 7. Ports come after them.
	opts := []byte{0x94, 0x04, 0x00, 0x00, 0x01, 0x01, 0x01, 0x00}
	p := f.synIn(ipA, 80)
	p.ipOptions = opts
	f.expectPass("options, allowed port", f.toEp(p))
	p = f.synIn(ipA, 81)
	p.ipOptions = opts
	f.expectDrop("options, other port", f.toEp(p), flow.ReasonPolicyDefaultDeny)
	// Maximum header (ihl 15, 40 bytes of options).
	p = f.synIn(ipA, 80)
	p.ipOptions = make([]byte, 40)
	for i := range p.ipOptions {
		p.ipOptions[i] = 1 // NOP
	}
	f.expectPass("40 bytes of options", f.toEp(p))
}

func TestMalformedAndOtherL3(t *testing.T) {
	f := newFixture(t, Config{})
	f.apply(false, false) // nothing enforced: any drop below is the parser's

	syn := f.synIn(ipA, 80)
	cases := []struct {
		name string
		data []byte
	}{
		// BPF_PROG_RUN refuses (EINVAL) IPv4 frames shorter than Ethernet + 20 bytes, so
		// truncated IPv4 headers are sent over a real veth in TestRealTraffic instead.
		{"truncated TCP header", func() []byte {
			p := syn
			p.l4 = syn.l4Bytes()[:10]
			return p.bytes()
		}()},
		{"TCP header cut by tot_len", func() []byte {
			p := syn
			p.totLen = 20 + 12
			return p.bytes()
		}()},
		{"tot_len beyond the packet", func() []byte {
			p := syn
			p.totLen = 400
			return p.bytes()
		}()},
		{"tot_len below ihl", func() []byte {
			p := syn
			p.totLen = 16
			return p.bytes()
		}()},
		{"ihl 4", func() []byte {
			p := syn
			p.ihl = 4
			return p.bytes()
		}()},
		{"ihl 0", func() []byte {
			p := syn
			p.ihl = 0xf0 // low nibble 0
			return p.bytes()
		}()},
		{"ihl beyond tot_len", func() []byte {
			p := syn
			p.ihl = 15
			return p.bytes()
		}()},
		{"TCP data offset 2", func() []byte {
			p := syn
			l4 := syn.l4Bytes()
			l4[12] = 2 << 4
			p.l4 = l4
			return p.bytes()
		}()},
		{"short UDP", packet{src: ipA, dst: epIP, proto: uint8(udp), l4: []byte{0, 1, 0, 2}}.bytes()},
		{"short ICMP", packet{src: ipA, dst: epIP, proto: uint8(icmp), l4: []byte{8, 0, 0, 0}}.bytes()},
		{"short SCTP", packet{src: ipA, dst: epIP, proto: uint8(policy.ProtoSCTP), l4: make([]byte, 8)}.bytes()},
		{"IP version 6 in an IPv4 frame", func() []byte {
			b := syn.bytes()
			b[14] = 6<<4 | 5
			return b
		}()},
		{"tiny first fragment", func() []byte {
			p := syn
			p.mf = true
			p.l4 = syn.l4Bytes()[:8]
			return p.bytes()
		}()},
	}
	for _, c := range cases {
		t.Logf("case %s (%d bytes)", c.name, len(c.data))
		f.expectDrop(c.name, run(t, f.d.objs.RampartToEp, c.data, epIfindex), flow.ReasonMalformed)
		f.expectDrop(c.name+" (egress)", run(t, f.d.objs.RampartFromEp, c.data, epIfindex), flow.ReasonMalformed)
	}

	// Ethernet padding after tot_len is fine.
	padded := append(f.synIn(ipA, 80).bytes(), make([]byte, 30)...)
	f.expectPass("trailing padding", run(t, f.d.objs.RampartToEp, padded, epIfindex))

	f.expectPass("ARP", f.toEp(arpFrame(1, ipRouter, epIP)))
	f.expectDrop("ARP for no protocol", f.toEp(packet{ethType: 0x0806, payload: make([]byte, 28)}), flow.ReasonMalformed)
	f.expectDrop("IPv6 of an endpoint without an IPv6 address", f.toEp6(packet6{src: ipA6, dst: epIP6, proto: uint8(udp), dport: 53}), flow.ReasonUnsupportedL3)
	f.expectDrop("IPv6 header of zeros", f.toEp(packet{ethType: 0x86dd, payload: make([]byte, 60)}), flow.ReasonMalformed)
	f.expectDrop("VLAN", f.toEp(packet{ethType: 0x8100, payload: make([]byte, 60)}), flow.ReasonUnsupportedL3)
	// Other IP protocols have no ports and pass when not enforced.
	f.expectPass("GRE", f.toEp(packet{src: ipA, dst: epIP, proto: 47, payload: make([]byte, 8)}))
}

func TestFragments(t *testing.T) {
	f := newFixture(t, Config{})
	f.apply(true, false, e(allow(idA, in, udp, 53, 16, 1)))

	first := func(id uint16, dport uint16) packet {
		return packet{src: ipA, dst: epIP, proto: uint8(udp), sport: 5353, dport: dport, ipID: id, mf: true, payload: make([]byte, 16)}
	}
	later := func(id uint16, more bool) packet {
		return packet{src: ipA, dst: epIP, proto: uint8(udp), ipID: id, mf: more, fragOffset: 3, payload: make([]byte, 24)}
	}
	f.expectPass("first fragment, allowed", f.toEp(first(100, 53)))
	f.expectPass("middle fragment of allowed", f.toEp(later(100, true)))
	f.expectPass("last fragment of allowed", f.toEp(later(100, false)))

	f.expectDrop("first fragment, denied", f.toEp(first(101, 54)), flow.ReasonPolicyDefaultDeny)
	ret := f.toEp(later(101, false))
	if ret != actShot {
		t.Fatalf("later fragment of denied datagram: verdict %d", ret)
	}
	ev := nextEvent(t, f.ev)
	if ev.Reason != flow.ReasonPolicyDefaultDeny || ev.DestinationPort != 54 || ev.SourcePort != 5353 {
		t.Errorf("later fragment of denied datagram: event %+v, want default deny with the first fragment's ports", ev)
	}

	f.expectDrop("unknown later fragment", f.toEp(later(102, false)), flow.ReasonFragmentUnknown)
	// Same IP id from another source is another datagram.
	other := later(100, false)
	other.src = ipB
	f.expectDrop("later fragment, other source", f.toEp(other), flow.ReasonFragmentUnknown)
	// The same fragment leaving the endpoint does not carry its address.
	f.expectDrop("later fragment, other direction", f.fromEp(later(100, false)), flow.ReasonSpoofedSource)

	// Allowed later fragments pass even after the policy is removed (they belong to a
	// datagram already allowed).
	f.expectPass("first fragment 103", f.toEp(first(103, 53)))
	f.apply(true, false)
	f.expectPass("later fragment after removal", f.toEp(later(103, false)))
	fresh := first(104, 53)
	fresh.sport = 5354 // not the conntrack flow of the datagrams above
	f.expectDrop("new first fragment after removal", f.toEp(fresh), flow.ReasonPolicyDefaultDeny)
}

func TestUnknownEndpoint(t *testing.T) {
	f := newFixture(t, Config{})
	// No ApplyEndpoint yet: ifindex 1 has no endpoint info.
	f.expectDrop("before apply", f.toEp(f.synIn(ipA, 80)), flow.ReasonUnknownEndpoint)
	f.expectDrop("ARP before apply", f.fromEp(packet{ethType: 0x0806, payload: make([]byte, 28)}), flow.ReasonUnknownEndpoint)
	f.apply(false, false)
	f.expectPass("after apply", f.toEp(f.synIn(ipA, 80)))
	if err := f.d.Endpoints.RemoveEndpoint(epIfindex, epID); err != nil {
		t.Fatal(err)
	}
	f.expectDrop("after remove", f.toEp(f.synIn(ipA, 80)), flow.ReasonUnknownEndpoint)
}

func TestEventsAndCounters(t *testing.T) {
	f := newFixture(t, Config{})
	f.apply(true, true, e(allow(idA, in, tcp, 80, 16, 41)), e(deny(idB, out, udp, 0, 0, 42)))

	syn := f.synIn(ipA, 80)
	if ret := f.toEp(syn); ret != actOK {
		t.Fatalf("syn: %d", ret)
	}
	ev := nextEvent(t, f.ev)
	want := flow.Event{
		Type: flow.EventNew, Verdict: flow.VerdictForwarded, Reason: flow.ReasonNone, Direction: in,
		Protocol: tcp, Source: ipA, Destination: epIP, SourcePort: syn.sport, DestinationPort: 80,
		EpID: epID, SrcIdentity: idA, DstIdentity: epIdent, RuleID: 41, MatchIdentity: idA,
		IfIndex: epIfindex, Length: uint32(len(syn.bytes())),
	}
	if ev.Time.IsZero() || time.Since(ev.Time).Abs() > time.Minute {
		t.Errorf("event time %v, want about now", ev.Time)
	}
	ev.Time, ev.Monotonic = time.Time{}, 0
	if ev != want {
		t.Errorf("new flow event\n got %+v\nwant %+v", ev, want)
	}
	// Established packets send no event.
	ack := syn
	ack.tcpFlags = 0x10
	if ret := f.toEp(ack); ret != actOK {
		t.Fatalf("ack: %d", ret)
	}
	noEvent(t, f.ev)

	q := packet{src: epIP, dst: ipB, proto: uint8(udp), sport: 1234, dport: 53, payload: make([]byte, 10)}
	if ret := f.fromEp(q); ret != actShot {
		t.Fatalf("denied udp: %d", ret)
	}
	ev = nextEvent(t, f.ev)
	ev.Time, ev.Monotonic = time.Time{}, 0
	want = flow.Event{
		Type: flow.EventDrop, Verdict: flow.VerdictDropped, Reason: flow.ReasonPolicyDeny, Direction: out,
		Protocol: udp, Source: epIP, Destination: ipB, SourcePort: 1234, DestinationPort: 53,
		EpID: epID, SrcIdentity: epIdent, DstIdentity: idB, RuleID: 42, MatchIdentity: idB,
		IfIndex: epIfindex, Length: uint32(len(q.bytes())),
	}
	if ev != want {
		t.Errorf("drop event\n got %+v\nwant %+v", ev, want)
	}
	if ev.Reason.String() != "policy-deny" || ev.Verdict.String() != "DROPPED" || ev.Type.String() != "drop" {
		t.Errorf("names: %v %v %v", ev.Reason, ev.Verdict, ev.Type)
	}

	// The programs count drops only (forwarded packets are the interface's count, which
	// BPF_PROG_RUN does not touch: TestCountersFromInterface).
	c, err := f.d.Endpoints.drops(epID)
	if err != nil {
		t.Fatal(err)
	}
	if want := (drops{egress: 1, egressBytes: uint64(len(q.bytes()))}); c != want {
		t.Errorf("counters %+v, want %+v", c, want)
	}
	synB := f.synIn(ipB, 22)
	f.expectDrop("ingress default deny", f.toEp(synB), flow.ReasonPolicyDefaultDeny)
	c, _ = f.d.Endpoints.drops(epID)
	if c.ingress != 1 || c.ingressBytes != uint64(len(synB.bytes())) {
		t.Errorf("ingress drops %d (%d bytes), want 1 (%d)", c.ingress, c.ingressBytes, len(synB.bytes()))
	}
	if lost, err := f.d.Events.Lost(); err != nil || lost != 0 {
		t.Errorf("lost events %d (%v), want 0", lost, err)
	}

	// Removing the endpoint resets its counters.
	if err := f.d.Endpoints.RemoveEndpoint(epIfindex, epID); err != nil {
		t.Fatal(err)
	}
	if c, _ := f.d.Endpoints.drops(epID); c != (drops{}) {
		t.Errorf("counters after remove %+v, want zero", c)
	}
}

// TestEventsWakeReaderOnlyWhenQuarterFull: a flow event does not wake a reader waiting on
// the ring (the agent polls, EventPoll), except the one that fills a quarter of the ring.
// Checked through epoll on the ring: without a wakeup, a record written after the ring
// was registered does not make it ready.
func TestEventsWakeReaderOnlyWhenQuarterFull(t *testing.T) {
	f := newFixture(t, Config{})
	f.apply(true, false) // every new ingress flow is dropped, with an event
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ep)
	fd := f.d.objs.Events.FD()
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(fd)}); err != nil {
		t.Fatal(err)
	}
	woken := func() bool {
		t.Helper()
		evs := make([]unix.EpollEvent, 1)
		n, err := unix.EpollWait(ep, evs, 0)
		if err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	if woken() {
		t.Fatal("the ring is ready before any event")
	}
	record := (int(unsafe.Sizeof(rampartFlowEvent{})) + 8 + 7) &^ 7 // with the ring's 8-byte header
	const ring, wake = 1 << 20, 1 << 18
	p := f.synIn(ipA, 80)
	for i := 1; i*record <= ring/2; i++ {
		p.sport = uint16(i)
		if ret := f.toEp(p); ret != actShot {
			t.Fatalf("packet %d: verdict %d", i, ret)
		}
		if !woken() {
			continue
		}
		if i*record < wake || i*record >= wake+2*record {
			t.Fatalf("woken by event %d (%d bytes in the ring), want the one that fills %d bytes", i, i*record, wake)
		}
		return
	}
	t.Fatalf("half the ring (%d bytes) filled without a wakeup", ring/2)
}

func TestLostEvents(t *testing.T) {
	f := newFixture(t, Config{})
	f.apply(true, false)
	// Fill the 1 MiB ring without reading it: a record takes more than 64 bytes (8-byte
	// header and the event).
	n := (1 << 20) / 64
	p := f.synIn(ipA, 80)
	for i := 0; i < n; i++ {
		p.sport = uint16(i)
		if ret := f.toEp(p); ret != actShot {
			t.Fatalf("packet %d: verdict %d", i, ret)
		}
	}
	lost, err := f.d.Events.Lost()
	if err != nil {
		t.Fatal(err)
	}
	if lost == 0 {
		t.Fatalf("no lost events after %d drops into a 1 MiB ring", n)
	}
	c, _ := f.d.Endpoints.drops(epID)
	if c.ingress != uint64(n) {
		t.Errorf("drops %d, want %d (losing events must not lose counts)", c.ingress, n)
	}
}

// Endpoints whose interfaces fall in one endpoint_slots slot: the first takes the slot,
// the second is found in the endpoints hash, and takes the slot when the first goes. An
// endpoint with only its hash entry (pins from before the slots) is found too, and a
// second Open on the same pins fills its slot.
func TestEndpointSlots(t *testing.T) {
	f := newFixture(t, Config{})
	ns := testenv.NewNetns(t, "rp-slot-"+testenv.Suffix(8))
	n := f.d.objs.EndpointSlots.MaxEntries()
	a, b := uint32(3*n+5), uint32(70*n+5) // the same slot; b beyond any array of old
	err := testenv.InNetns(ns, func() error {
		for _, idx := range []uint32{a, b} {
			name := fmt.Sprintf("slot%d", idx)
			if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name, Index: int(idx)}, PeerName: name + "p"}); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatalf("creating veths with indexes %d and %d: %v", a, b, err)
	}
	syn := f.synIn(ipA, 80)
	runOn := func(idx uint32) uint32 {
		var ret uint32
		if err := testenv.InNetns(ns, func() error {
			ret, _ = runCtx(t, f.d.objs.RampartToEp, syn.bytes(), skbContext{Ifindex: idx})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return ret
	}
	slotHolds := func(want uint32) {
		t.Helper()
		var v rampartEndpointSlot
		slot := a & (n - 1)
		if err := f.d.objs.EndpointSlots.Lookup(&slot, &v); err != nil {
			t.Fatal(err)
		}
		if v.Ifindex != want {
			t.Errorf("slot %d holds ifindex %d, want %d", slot, v.Ifindex, want)
		}
	}
	apply := func(idx, id uint32) {
		t.Helper()
		if err := f.d.Endpoints.ApplyEndpoint(idx, EndpointInfo{EpID: id, Identity: epIdent, Addr: epIP}, mapstate.EndpointPolicy{}); err != nil {
			t.Fatal(err)
		}
	}

	f.expectDrop("unknown", runOn(b), flow.ReasonUnknownEndpoint)
	apply(a, epID)
	apply(b, epID+1)
	slotHolds(a)
	f.expectPass("in its slot", runOn(a))
	f.expectPass("in the hash (slot taken)", runOn(b))
	if err := f.d.Endpoints.RemoveEndpoint(a, epID); err != nil {
		t.Fatal(err)
	}
	slotHolds(b)
	f.expectDrop("removed", runOn(a), flow.ReasonUnknownEndpoint)
	f.expectPass("moved into the freed slot", runOn(b))

	// Only the hash entry, as pins from before the slots have it.
	slot := b & (n - 1)
	if err := f.d.objs.EndpointSlots.Update(&slot, &rampartEndpointSlot{}, ebpf.UpdateAny); err != nil {
		t.Fatal(err)
	}
	f.expectPass("hash entry only", runOn(b))
	// The array of old by interface index, pinned as an earlier version left it.
	legacy, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 16, MaxEntries: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer legacy.Close()
	legacyPin := filepath.Join(f.d.pinDir, "endpoints_ifx")
	if err := legacy.Pin(legacyPin); err != nil {
		t.Fatal(err)
	}
	again, err := Open(Config{PinDir: f.d.pinDir})
	if err != nil {
		t.Fatalf("second Open on the same pins: %v", err)
	}
	defer again.Close()
	slotHolds(b)
	if _, err := os.Stat(legacyPin); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("legacy pin endpoints_ifx still there after Open: %v", err)
	}
	if err := f.d.Endpoints.RemoveEndpoint(b, epID+1); err != nil {
		t.Fatal(err)
	}
	f.expectDrop("both removed", runOn(b), flow.ReasonUnknownEndpoint)
}

package datapath

import (
	"errors"
	"math/rand/v2"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"

	"github.com/rampartnet/rampart/internal/cidrtable"
	"github.com/rampartnet/rampart/internal/cidrtable/cidrtest"
	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/testenv"
)

// CIDR set tests through the kernel: the maps read back (CIDRSetMembership), the BPF
// program on crafted packets (BPF_PROG_RUN), and real traffic between namespaces.

// setPort is the UDP port whose packets set i denies in the fixtures below, so that one
// packet per set tells whether an address is in it.
func setPort(i uint8) uint16 { return 1000 + uint16(i) }

// applySetDenies gives the fixture endpoint an egress policy that allows everything except
// UDP to setPort(i) for an address in set i (rule id 100+i).
func (f *fixture) applySetDenies(sets []uint8) {
	f.t.Helper()
	es := []entry{e(allow(identity.Any, out, policy.ProtoAny, 0, 0, 1))}
	for _, i := range sets {
		es = append(es, e(deny(identity.CIDRSet(i), out, udp, setPort(i), 16, 100+uint32(i))))
	}
	f.apply(false, true, es...)
}

// udpOut runs the egress program on a UDP packet from the endpoint to dst:port.
func (f *fixture) udpOut(dst netip.Addr, port uint16) uint32 {
	f.t.Helper()
	return f.fromEp(packet{src: epIP, dst: dst, proto: uint8(udp), sport: f.port(), dport: port})
}

// TestCIDRSetPolicy: set identities in deny and allow entries, both directions, the
// identity that decided in flow events, and deny precedence across set and peer lookups.
func TestCIDRSetPolicy(t *testing.T) {
	f := newFixture(t, Config{})
	ct := cidrOf(t, f.d, 0)
	listed := addr("203.0.113.9")  // ipOut, world, in set 3 through its /24
	host := addr("192.0.2.77")     // in set 7 through a /32
	both := addr("192.0.2.200")    // in sets 3 and 7
	outside := addr("192.0.2.202") // in no set
	_, err := ct.ReplaceCIDRSets(map[uint8][]netip.Prefix{
		3: {netip.MustParsePrefix("203.0.113.0/24"), netip.MustParsePrefix("192.0.2.200/31")},
		7: {netip.MustParsePrefix("192.0.2.77/32"), netip.MustParsePrefix("192.0.2.200/32")},
	})
	if err != nil {
		t.Fatal(err)
	}

	// Egress deny on a set: dropped, and the event names the set's identity.
	f.apply(false, true, e(allow(identity.Any, out, policy.ProtoAny, 0, 0, 1)),
		e(deny(identity.CIDRSet(3), out, tcp, 443, 16, 33)))
	f.drain()
	ret := f.fromEp(packet{src: epIP, dst: listed, proto: uint8(tcp), sport: f.port(), dport: 443, tcpFlags: 0x02})
	if ret != actShot {
		t.Fatalf("listed destination: verdict %d, want drop", ret)
	}
	ev := nextEvent(t, f.ev)
	if ev.Reason != flow.ReasonPolicyDeny || ev.RuleID != 33 || ev.MatchIdentity != identity.CIDRSet(3) ||
		ev.DstIdentity != identity.World || ev.Destination != listed {
		t.Errorf("drop event: %+v", ev)
	}
	f.expectPass("port not denied", f.fromEp(packet{src: epIP, dst: listed, proto: uint8(tcp), sport: f.port(), dport: 80, tcpFlags: 0x02}))
	f.expectPass("address not listed", f.fromEp(packet{src: epIP, dst: outside, proto: uint8(tcp), sport: f.port(), dport: 443, tcpFlags: 0x02}))

	// Allow by set under enforcement: the set's identity decided the new flow.
	f.apply(false, true, e(allow(identity.CIDRSet(7), out, udp, 53, 16, 77)))
	f.drain()
	if ret := f.udpOut(host, 53); ret != actOK {
		t.Fatalf("allowed by set 7: verdict %d", ret)
	}
	ev = nextEvent(t, f.ev)
	if ev.Type != flow.EventNew || ev.RuleID != 77 || ev.MatchIdentity != identity.CIDRSet(7) {
		t.Errorf("new flow event: %+v", ev)
	}
	f.expectDrop("not in set 7", f.udpOut(listed, 53), flow.ReasonPolicyDefaultDeny)

	// Deny wins across lookups: the peer's own identity allows, a set denies; and a deny of
	// one set beats the allow of another set the address is also in.
	f.apply(false, true, e(allow(identity.World, out, udp, 0, 0, 2)),
		e(allow(identity.CIDRSet(7), out, udp, 0, 0, 3)), e(deny(identity.CIDRSet(3), out, udp, 0, 0, 4)))
	f.expectDrop("world allowed, set 3 denies", f.udpOut(both, 9), flow.ReasonPolicyDeny)
	f.expectPass("only set 7", f.udpOut(host, 9))

	// Ingress: the source address's sets.
	f.apply(true, false, e(allow(identity.Any, in, policy.ProtoAny, 0, 0, 5)),
		e(deny(identity.CIDRSet(7), in, tcp, 22, 16, 6)))
	f.expectDrop("ingress from a listed source", f.toEp(f.synIn(host, 22)), flow.ReasonPolicyDeny)
	f.expectPass("ingress from an unlisted source", f.toEp(f.synIn(outside, 22)))
}

// TestCIDRSetEdgesKernel: the edge cases of TestCIDRSetsEdges through the kernel's maps and,
// for IPv4, the program (one denied port per set).
func TestCIDRSetEdgesKernel(t *testing.T) {
	f := newFixture(t, Config{})
	ct := cidrOf(t, f.d, 0)
	used := []uint8{0, 1, 2, 3, 5, 31}
	f.applySetDenies(used)
	cidrtest.Edges(t, cidrtest.Backend{
		Replace: func(sets map[uint8][]netip.Prefix) error { _, err := ct.ReplaceCIDRSets(sets); return err },
		Change: func(i uint8, ps []netip.Prefix, add bool) error {
			if add {
				return ct.AddCIDRs(i, ps)
			}
			return ct.RemoveCIDRs(i, ps)
		},
		Member: func(a netip.Addr) uint32 {
			m, err := ct.CIDRSetMembership(a)
			if err != nil {
				t.Fatal(err)
			}
			return m
		},
		Packets: func(a netip.Addr, want uint32) {
			for _, i := range used {
				if dropped := f.udpOut(a, setPort(i)) == actShot; dropped != (want&(1<<i) != 0) {
					t.Errorf("packet to %v:%d dropped=%v, want in set %d = %v", a, setPort(i), dropped, i, !dropped)
				}
			}
		},
	})
}

// TestCIDRSetKernelMembership: random reloads, additions and removals of overlapping IPv4
// and IPv6 prefixes, checked against the reference through the maps and, for IPv4, through
// the program with one denied port per set.
func TestCIDRSetKernelMembership(t *testing.T) {
	f := newFixture(t, Config{})
	ct := cidrOf(t, f.d, 0)
	r := rand.New(rand.NewPCG(21, 22))
	used := []uint8{0, 1, 5, 31}
	f.applySetDenies(used)
	ref := cidrtest.Sets{}
	for step := range 25 {
		switch op := r.IntN(3); {
		case op == 0 || step == 0:
			ref = cidrtest.Sets{}
			for _, i := range used {
				if r.IntN(4) == 0 {
					continue
				}
				for range r.IntN(400) {
					if r.IntN(5) == 0 {
						ref.Add(i, cidrtest.RandPrefix6(r))
					} else {
						ref.Add(i, cidrtest.RandPrefix4(r))
					}
				}
			}
			if _, err := ct.ReplaceCIDRSets(ref.Lists()); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
		default:
			i := used[r.IntN(len(used))]
			var ps []netip.Prefix
			if op == 1 {
				for range 1 + r.IntN(30) {
					if r.IntN(4) == 0 {
						ps = append(ps, cidrtest.RandPrefix6(r))
					} else {
						ps = append(ps, cidrtest.RandPrefix4(r))
					}
				}
				ref.Add(i, ps...)
				if err := ct.AddCIDRs(i, ps); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
			} else {
				for p := range ref[i] {
					if r.IntN(3) == 0 {
						ps = append(ps, p)
					}
				}
				ref.Remove(i, ps...)
				if err := ct.RemoveCIDRs(i, ps); err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
			}
		}
		addrs := cidrtest.Samples(ref, r, 100)
		for _, a := range addrs {
			got, err := ct.CIDRSetMembership(a)
			if err != nil {
				t.Fatal(err)
			}
			if want := ref.Mask(a); got != want {
				t.Fatalf("step %d: %v in %032b, want %032b", step, a, got, want)
			}
		}
		// The program: one packet per set for a sample of the IPv4 addresses.
		r.Shuffle(len(addrs), func(i, j int) { addrs[i], addrs[j] = addrs[j], addrs[i] })
		checked := 0
		for _, a := range addrs {
			if !a.Is4() || checked == 150 {
				continue
			}
			checked++
			want := ref.Mask(a)
			for _, i := range used {
				dropped := f.udpOut(a, setPort(i)) == actShot
				if dropped != (want&(1<<i) != 0) {
					t.Fatalf("step %d: packet to %v:%d dropped=%v, want in set %d = %v", step, a, setPort(i), dropped, i, !dropped)
				}
			}
		}
	}
}

// TestCIDRSetReloadNoLeak: while sets are reloaded over and over (each reload a new layout
// and hash seed) and changed in place, packets to listed addresses (one in the host table,
// one through a /24 in the top table) are always dropped and packets to their unlisted
// neighbours always pass.
func TestCIDRSetReloadNoLeak(t *testing.T) {
	f := newFixture(t, Config{})
	ct := cidrOf(t, f.d, 1<<17)
	f.apply(false, true, e(allow(identity.Any, out, policy.ProtoAny, 0, 0, 1)),
		e(deny(identity.CIDRSet(4), out, policy.ProtoAny, 0, 0, 2)))
	listedHost, neighbourHost := addr("203.0.113.7"), addr("203.0.113.8")
	listedTop, neighbourTop := addr("198.51.100.77"), addr("198.51.101.1")
	r := rand.New(rand.NewPCG(31, 32))
	load := func() []netip.Prefix {
		ps := []netip.Prefix{netip.MustParsePrefix("203.0.113.7/32"), netip.MustParsePrefix("198.51.100.0/24")}
		for _, p := range cidrtest.BenchPrefixes(20000+r.IntN(20000), r.Uint64()) {
			if !p.Contains(neighbourHost) && !p.Contains(neighbourTop) {
				ps = append(ps, p)
			}
		}
		return ps
	}
	if _, err := ct.ReplaceCIDRSets(map[uint8][]netip.Prefix{4: load()}); err != nil {
		t.Fatal(err)
	}

	var (
		stop   atomic.Bool
		probes atomic.Int64
		wg     sync.WaitGroup
		mu     sync.Mutex
		bad    []string
	)
	prog := f.d.objs.RampartFromEp
	wg.Go(func() {
		sport := uint16(1)
		for !stop.Load() {
			for _, c := range []struct {
				dst  netip.Addr
				drop bool
			}{{listedHost, true}, {listedTop, true}, {neighbourHost, false}, {neighbourTop, false}} {
				sport++
				p := packet{src: epIP, dst: c.dst, proto: uint8(udp), sport: sport, dport: 53}
				ret, err := prog.Run(&ebpf.RunOptions{Data: p.bytes(), Context: skbContext{}, ContextOut: make([]byte, 256)})
				if err != nil || (ret == actShot) != c.drop {
					mu.Lock()
					bad = append(bad, c.dst.String()+": verdict "+verdictName(ret)+errString(err))
					mu.Unlock()
				}
				probes.Add(1)
			}
		}
	})
	for range 15 {
		before := probes.Load()
		if _, err := ct.ReplaceCIDRSets(map[uint8][]netip.Prefix{4: load()}); err != nil {
			t.Fatal(err)
		}
		extra := load()[2:100]
		if err := ct.AddCIDRs(4, extra); err != nil {
			t.Fatal(err)
		}
		if err := ct.RemoveCIDRs(4, extra); err != nil {
			t.Fatal(err)
		}
		// Keep the reloads and the probes overlapping: wait for some probes each round.
		deadline := time.Now().Add(5 * time.Second)
		for probes.Load() < before+50 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
	}
	stop.Store(true)
	wg.Wait()
	if len(bad) > 0 {
		t.Fatalf("%d wrong verdicts during reloads (of %d probes), first: %v", len(bad), probes.Load(), bad[0])
	}
	if probes.Load() < 15*50 {
		t.Fatalf("only %d probes ran during the reloads", probes.Load())
	}
	t.Logf("%d probes during 15 reloads, none wrong", probes.Load())
}

func verdictName(ret uint32) string {
	if ret == actShot {
		return "drop"
	}
	return "pass"
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return " (" + err.Error() + ")"
}

// TestCIDRSetReopen: a datapath reopened on pinned maps finds the tables in force and keeps
// enforcing the sets, refuses in-place changes until the sets are given again, takes a new
// host table bound, and a reload after reopening keeps IPv6 addresses listed before and
// after listed.
func TestCIDRSetReopen(t *testing.T) {
	d := openTest(t, Config{})
	ct := cidrOf(t, d, 0)
	v4, v6 := netip.MustParsePrefix("192.0.2.0/25"), netip.MustParsePrefix("2001:db8::/48")
	if _, err := ct.ReplaceCIDRSets(map[uint8][]netip.Prefix{2: {v4, v6}}); err != nil {
		t.Fatal(err)
	}
	ct.Close()
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	dd, err := Open(Config{PinDir: d.Pins.PinDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer dd.Close()
	d2, err := cidrtable.Open(cidrtable.Maps(dd.Pins.CIDRMaps()), 2*testHostSlots)
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	for _, a := range []string{"192.0.2.1", "2001:db8::5"} {
		if m, err := d2.CIDRSetMembership(addr(a)); err != nil || m != 1<<2 {
			t.Errorf("after reopening: %s in %b (%v), want set 2", a, m, err)
		}
	}
	if err := d2.AddCIDRs(2, []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}); !errors.Is(err, cidrtable.ErrCIDRSetsNotLoaded) {
		t.Errorf("add before reload: %v, want ErrCIDRSetsNotLoaded", err)
	}
	st, err := d2.ReplaceCIDRSets(map[uint8][]netip.Prefix{2: {v6, netip.MustParsePrefix("2001:db8::/64")}, 3: {v4}})
	if err != nil {
		t.Fatal(err)
	}
	if st.HostCapacity != 2*testHostSlots {
		t.Errorf("host table bound %d after reopening with another, want the new %d", st.HostCapacity, 2*testHostSlots)
	}
	for a, want := range map[string]uint32{"192.0.2.1": 1 << 3, "2001:db8::5": 1 << 2, "2001:db8:0:1::": 1 << 2, "2001:db9::": 0} {
		if m, err := d2.CIDRSetMembership(addr(a)); err != nil || m != want {
			t.Errorf("after the reload: %s in %b (%v), want %b", a, m, err, want)
		}
	}
	if err := d2.RemoveCIDRs(2, []netip.Prefix{v6}); err != nil {
		t.Fatal(err)
	}
	if m, _ := d2.CIDRSetMembership(addr("2001:db8::5")); m != 1<<2 {
		t.Errorf("the /64 left: %b, want set 2", m)
	}
	if m, _ := d2.CIDRSetMembership(addr("2001:db8:0:1::")); m != 0 {
		t.Errorf("outside the /64 after removing the /48: %b", m)
	}
}

// TestCIDRSetTraffic: real TCP between namespaces: a destination listed in a set of 100k
// prefixes that the client's egress policy denies is unreachable, its neighbour address on
// the same server is reachable; removing and adding prefixes in place takes effect.
func TestCIDRSetTraffic(t *testing.T) {
	testenv.RequireRoot(t)
	suffix := testenv.Suffix(8)
	node := testenv.NewNetns(t, "rpc-"+suffix+"-node")
	if err := writeSysctl(node, "net/ipv4/ip_forward", "1"); err != nil {
		t.Fatal(err)
	}
	disableIPv6(t, node)
	a := addEndpoint(t, node, "rpc-"+suffix+"-a", "rca"+suffix, addr("198.18.40.2"), addr("198.18.40.1"))
	b := addEndpoint(t, node, "rpc-"+suffix+"-b", "rcb"+suffix, addr("198.18.50.2"), addr("198.18.50.1"))
	denied, neighbour := addr("198.18.50.3"), b.ip
	// The denied address is a second address of the server. The server stands for hosts
	// outside the node: it is no endpoint (an endpoint may send from its one address only).
	he := nlHandle(t, b.ns)
	eth0, err := he.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	if err := he.AddrAdd(eth0, &netlink.Addr{IPNet: prefixNet(netip.PrefixFrom(denied, 24))}); err != nil {
		t.Fatal(err)
	}

	d := openTest(t, Config{})
	ct := cidrOf(t, d, 1<<20)
	attachAll(t, d, node, a)
	const idEpA, idEpB = identity.Identity(1001), identity.Identity(1002)
	if err := d.IPCache.ApplyIPCache(map[netip.Prefix]mapstate.IPCacheEntry{
		netip.MustParsePrefix("0.0.0.0/0"): {Identity: identity.World},
		netip.PrefixFrom(a.ip, 32):         {Identity: idEpA, EndpointID: 1},
		netip.PrefixFrom(b.ip, 32):         {Identity: idEpB},
		netip.PrefixFrom(a.gw, 32):         {Identity: identity.Host},
		netip.PrefixFrom(b.gw, 32):         {Identity: identity.Host},
	}); err != nil {
		t.Fatal(err)
	}
	polA := mapstate.EndpointPolicy{EnforceEgress: true, Entries: entries(
		e(allow(identity.Any, out, policy.ProtoAny, 0, 0, 1)),
		e(deny(identity.CIDRSet(0), out, policy.ProtoAny, 0, 0, 9)),
	)}
	if err := d.Endpoints.ApplyEndpoint(a.ifindex, EndpointInfo{EpID: 1, Identity: idEpA, Addr: a.ip}, polA); err != nil {
		t.Fatal(err)
	}

	// A threat list of 100k prefixes (as the benchmark draws them) with the denied address.
	list := []netip.Prefix{netip.PrefixFrom(denied, 32)}
	for _, p := range cidrtest.BenchPrefixes(100000, 7) {
		if !p.Contains(neighbour) && !p.Contains(a.ip) && !p.Contains(denied) {
			list = append(list, p)
		}
	}
	st, err := ct.ReplaceCIDRSets(map[uint8][]netip.Prefix{0: list})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("loaded %d prefixes: build %v, write %v", st.Prefixes, st.Build, st.Write)
	ev := eventsOf(t, d)

	const port = 8080
	echoServer(t, b.ns, netip.AddrPortFrom(netip.IPv4Unspecified(), port))

	reach := func(dst netip.Addr, timeout time.Duration) error {
		c, err := dial(a.ns, netip.AddrPortFrom(dst, port), timeout)
		if err != nil {
			return err
		}
		defer c.Close()
		return roundTrip(c, "hello")
	}
	if err := reach(neighbour, 5*time.Second); err != nil {
		t.Fatalf("neighbour %v unreachable: %v", neighbour, err)
	}
	if err := reach(denied, time.Second); err == nil {
		t.Fatalf("listed %v reachable", denied)
	}
	drop := waitEvent(t, ev, "drop of the listed destination", func(e flow.Event) bool {
		return e.Type == flow.EventDrop && e.Destination == denied
	})
	if drop.Reason != flow.ReasonPolicyDeny || drop.RuleID != 9 || drop.MatchIdentity != identity.CIDRSet(0) || drop.EpID != 1 {
		t.Errorf("drop event: %+v", drop)
	}

	// Unlisted in place: reachable.
	if err := ct.RemoveCIDRs(0, []netip.Prefix{netip.PrefixFrom(denied, 32)}); err != nil {
		t.Fatal(err)
	}
	if err := reach(denied, 5*time.Second); err != nil {
		t.Fatalf("%v unreachable after its removal: %v", denied, err)
	}
	// The server's /24 listed in place: both addresses unreachable (the top table).
	if err := ct.AddCIDRs(0, []netip.Prefix{netip.MustParsePrefix("198.18.50.0/24")}); err != nil {
		t.Fatal(err)
	}
	for _, dst := range []netip.Addr{denied, neighbour} {
		if err := reach(dst, time.Second); err == nil {
			t.Errorf("%v reachable with its /24 listed", dst)
		}
	}
}

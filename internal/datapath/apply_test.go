package datapath

import (
	"encoding/binary"
	"fmt"
	"maps"
	"net/netip"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

// dumpPolicy reads the whole policy map, by endpoint.
func dumpPolicy(t *testing.T, d *Datapath) map[uint32]map[mapstate.Key]mapstate.Value {
	t.Helper()
	out := map[uint32]map[mapstate.Key]mapstate.Value{}
	var (
		k rampartPolicyKey
		v rampartPolicyValue
	)
	it := d.objs.Policy.Iterate()
	for it.Next(&k, &v) {
		ep, key, ok := mapstateKey(k)
		if !ok {
			t.Fatalf("unexpected key in policy map: %+v", k)
		}
		if out[ep] == nil {
			out[ep] = map[mapstate.Key]mapstate.Value{}
		}
		out[ep][key] = mapstate.Value{Deny: v.Action == policyDeny, RuleID: v.RuleId}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestApplyEndpointDiff(t *testing.T) {
	d := openTest(t, Config{})
	other := mapstate.EndpointPolicy{EnforceIngress: true, Entries: entries(e(allow(idA, in, tcp, 22, 16, 99)))}
	if err := d.Endpoints.ApplyEndpoint(20, EndpointInfo{EpID: 2, Identity: idB, Addr: ipB}, other); err != nil {
		t.Fatal(err)
	}

	steps := []mapstate.EndpointPolicy{
		{EnforceIngress: true, Entries: entries(
			e(allow(idA, in, tcp, 80, 16, 1)),
			e(allow(identity.Any, in, udp, 53, 16, 2)),
			e(deny(idB, out, policy.ProtoAny, 0, 0, 3)),
		)},
		// rule id change, allow -> deny, deny -> allow, new range, removal
		{EnforceIngress: true, EnforceEgress: true, Entries: entries(
			e(allow(idA, in, tcp, 80, 16, 7)),
			e(deny(identity.Any, in, udp, 53, 16, 2)),
			e(allow(idB, out, policy.ProtoAny, 0, 0, 3)),
			e(allow(flagged, out, tcp, 8080, 13, 4)),
		)},
		{EnforceEgress: true, Entries: entries(
			e(allow(flagged, out, tcp, 8080, 13, 4)),
			e(deny(idA, in, icmp, 8, 16, 5)),
		)},
		{}, // nothing at all
		{EnforceIngress: true, Entries: entries(e(allow(idA, in, tcp, 443, 16, 6)))},
	}
	for i, want := range steps {
		if err := d.Endpoints.ApplyEndpoint(10, EndpointInfo{EpID: 1, Identity: epIdent, Addr: epIP}, want); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		got := dumpPolicy(t, d)
		wantEntries := want.Entries
		if wantEntries == nil {
			wantEntries = map[mapstate.Key]mapstate.Value{}
		}
		if g := got[1]; !maps.Equal(g, wantEntries) && !(len(g) == 0 && len(wantEntries) == 0) {
			t.Errorf("step %d: map holds\n %v\nwant\n %v", i, g, wantEntries)
		}
		if !maps.Equal(got[2], other.Entries) {
			t.Errorf("step %d: other endpoint's entries changed: %v", i, got[2])
		}
		if mem := d.Endpoints.InstalledPolicy(1); !maps.Equal(mem, wantEntries) {
			t.Errorf("step %d: in-memory copy %v, want %v", i, mem, wantEntries)
		}
		var info rampartEndpointInfo
		if err := d.objs.Endpoints.Lookup(uint32(10), &info); err != nil {
			t.Fatalf("step %d: endpoint info: %v", i, err)
		}
		var flags uint32
		if want.EnforceIngress {
			flags |= enforceIngress
		}
		if want.EnforceEgress {
			flags |= enforceEgress
		}
		if info.EpId != 1 || info.Identity != epIdent || info.Flags != flags {
			t.Errorf("step %d: endpoint info %+v, want flags %d", i, info, flags)
		}
	}

	// A second Datapath on the same pins rebuilds the same picture.
	if err := d.IPCache.ApplyIPCache(map[netip.Prefix]mapstate.IPCacheEntry{
		netip.MustParsePrefix("198.18.0.0/15"): {Identity: cidrID},
		netip.MustParsePrefix("198.18.1.5/32"): {Identity: idPod, Secondary: flagged},
		// A pod on another node: its node's address is the tunnel endpoint.
		netip.MustParsePrefix("198.18.2.7/32"): {Identity: idPod, TunnelEndpoint: addr("198.19.0.2")},
	}); err != nil {
		t.Fatal(err)
	}
	var tv rampartIpcacheValue
	tk, err := ipcacheKey(netip.MustParsePrefix("198.18.2.7/32"))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.objs.Ipcache.Lookup(&tk, &tv); err != nil {
		t.Fatal(err)
	}
	if want := [4]byte{198, 19, 0, 2}; tv.TunnelEndpoint != binary.NativeEndian.Uint32(want[:]) {
		t.Errorf("tunnel_endpoint %#x, want 198.19.0.2 in network order", tv.TunnelEndpoint)
	}
	d2, err := Open(Config{PinDir: d.Pins.PinDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer d2.Close()
	if got := d2.Endpoints.InstalledPolicy(1); !maps.Equal(got, steps[len(steps)-1].Entries) {
		t.Errorf("reopened: policy %v", got)
	}
	if got := d2.Endpoints.InstalledPolicy(2); !maps.Equal(got, other.Entries) {
		t.Errorf("reopened: other policy %v", got)
	}
	wantEps := map[uint32]InstalledEndpoint{
		10: {EndpointInfo: EndpointInfo{EpID: 1, Identity: epIdent, Addr: epIP}, EnforceIngress: true},
		20: {EndpointInfo: EndpointInfo{EpID: 2, Identity: idB, Addr: ipB}, EnforceIngress: true},
	}
	if got := d2.Endpoints.InstalledEndpoints(); !maps.Equal(got, wantEps) {
		t.Errorf("reopened: endpoints %v", got)
	}
	if got := d2.IPCache.InstalledIPCache(); !maps.Equal(got, d.IPCache.InstalledIPCache()) || len(got) != 3 ||
		got[netip.MustParsePrefix("198.18.2.7/32")].TunnelEndpoint != addr("198.19.0.2") {
		t.Errorf("reopened: ipcache %v", got)
	}

	// Moving an endpoint to a new ifindex drops the old one; removing it clears everything.
	if err := d2.Endpoints.ApplyEndpoint(11, EndpointInfo{EpID: 1, Identity: epIdent, Addr: epIP}, steps[0]); err != nil {
		t.Fatal(err)
	}
	if _, ok := d2.Endpoints.InstalledEndpoints()[10]; ok {
		t.Error("old ifindex of a moved endpoint still installed")
	}
	if err := d2.Endpoints.RemoveEndpoint(11, 1); err != nil {
		t.Fatal(err)
	}
	got := dumpPolicy(t, d2)
	if len(got[1]) != 0 || !maps.Equal(got[2], other.Entries) {
		t.Errorf("after remove: %v", got)
	}
	if _, ok := d2.Endpoints.InstalledEndpoints()[11]; ok {
		t.Error("removed endpoint still installed")
	}

	// Invalid input is refused before anything is written.
	bad := mapstate.EndpointPolicy{Entries: entries(e(allow(idA, 0, tcp, 80, 16, 1)))}
	if err := d2.Endpoints.ApplyEndpoint(12, EndpointInfo{EpID: 3, Addr: ipA}, bad); err == nil {
		t.Error("invalid direction accepted")
	}
	if err := d2.Endpoints.ApplyEndpoint(12, EndpointInfo{EpID: 0, Addr: ipA}, mapstate.EndpointPolicy{}); err == nil {
		t.Error("endpoint ID 0 accepted")
	}
	// Without its IPv4 address the dataplane could not check the endpoint's sources.
	for _, a := range []netip.Addr{{}, addr("0.0.0.0"), addr("2001:db8::1")} {
		if err := d2.Endpoints.ApplyEndpoint(12, EndpointInfo{EpID: 3, Addr: a}, mapstate.EndpointPolicy{}); err == nil {
			t.Errorf("endpoint address %v accepted", a)
		}
	}
	if _, ok := d2.Endpoints.InstalledEndpoints()[12]; ok {
		t.Error("refused endpoint installed")
	}
}

func TestApplyIPCacheDiff(t *testing.T) {
	d := openTest(t, Config{})
	steps := []map[netip.Prefix]mapstate.IPCacheEntry{
		{
			netip.MustParsePrefix("0.0.0.0/0"):     {Identity: identity.World},
			netip.MustParsePrefix("198.18.0.1/32"): {Identity: identity.Host, Secondary: flagged},
			netip.MustParsePrefix("198.18.0.0/24"): {Identity: cidrID},
		},
		{
			netip.MustParsePrefix("0.0.0.0/0"):      {Identity: identity.World},
			netip.MustParsePrefix("198.18.0.1/32"):  {Identity: identity.Host},
			netip.MustParsePrefix("198.18.0.99/32"): {Identity: idA},
		},
		{},
	}
	for i, want := range steps {
		if err := d.IPCache.ApplyIPCache(want); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if got := pinnedIPCache(t, d); !maps.Equal(got, want) {
			t.Errorf("step %d: map %v, want %v", i, got, want)
		}
	}
}

// UpdateIPCache writes a difference: the entries to add or change, then the prefixes to
// delete; what it is not told about stays.
func TestUpdateIPCache(t *testing.T) {
	d := openTest(t, Config{})
	base := map[netip.Prefix]mapstate.IPCacheEntry{
		netip.MustParsePrefix("0.0.0.0/0"):      {Identity: identity.World},
		netip.MustParsePrefix("198.18.0.1/32"):  {Identity: identity.Host},
		netip.MustParsePrefix("198.18.0.10/32"): {Identity: idA, EndpointID: 3},
	}
	if err := d.IPCache.ApplyIPCache(base); err != nil {
		t.Fatal(err)
	}
	upsert := map[netip.Prefix]mapstate.IPCacheEntry{
		netip.MustParsePrefix("198.18.0.11/32"): {Identity: idA, EndpointID: 4},
		netip.MustParsePrefix("198.18.0.1/32"):  {Identity: identity.Host, Secondary: flagged},
	}
	if err := d.IPCache.UpdateIPCache(upsert, []netip.Prefix{netip.MustParsePrefix("198.18.0.10/32"), netip.MustParsePrefix("198.18.0.77/32")}); err != nil {
		t.Fatal(err)
	}
	want := map[netip.Prefix]mapstate.IPCacheEntry{
		netip.MustParsePrefix("0.0.0.0/0"):      {Identity: identity.World},
		netip.MustParsePrefix("198.18.0.1/32"):  {Identity: identity.Host, Secondary: flagged},
		netip.MustParsePrefix("198.18.0.11/32"): {Identity: idA, EndpointID: 4},
	}
	if got := pinnedIPCache(t, d); !maps.Equal(got, want) {
		t.Errorf("map %v, want %v", got, want)
	}
	if got := d.IPCache.InstalledIPCache(); !maps.Equal(got, want) {
		t.Errorf("datapath copy %v, want %v", got, want)
	}
}

// pinnedIPCache reads the ipcache map itself.
func pinnedIPCache(t *testing.T, d *Datapath) map[netip.Prefix]mapstate.IPCacheEntry {
	t.Helper()
	got := map[netip.Prefix]mapstate.IPCacheEntry{}
	var (
		k rampartIpcacheKey
		v rampartIpcacheValue
	)
	it := d.objs.Ipcache.Iterate()
	for it.Next(&k, &v) {
		p, ok := ipcachePrefix(k)
		if !ok {
			t.Fatalf("bad key %+v", k)
		}
		got[p] = mapstate.IPCacheEntry{Identity: v.Identity, Secondary: v.CidrIdentity, EndpointID: v.EpId}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

// probe is a new flow used to observe the verdict of a policy at one moment.
type probe struct {
	src, dst netip.Addr
	proto    policy.Protocol
	dport    uint16
	dir      policy.Direction
}

func (p probe) String() string {
	return fmt.Sprintf("%v %v->%v %v/%d", p.dir, p.src, p.dst, p.proto, p.dport)
}

// allowedNow runs every probe as a new flow (fresh source port) and returns the verdicts.
func allowedNow(t *testing.T, f *fixture, probes []probe) []bool {
	t.Helper()
	out := make([]bool, len(probes))
	for i, p := range probes {
		pkt := packet{src: p.src, dst: p.dst, proto: uint8(p.proto), sport: f.port(), dport: p.dport, tcpFlags: 0x02}
		if p.proto == icmp {
			pkt.icmpType = uint8(p.dport)
			pkt.icmpID = f.port()
		}
		var ret uint32
		if p.dir == in {
			ret = run(t, f.d.objs.RampartToEp, pkt.bytes(), epIfindex)
		} else {
			ret = run(t, f.d.objs.RampartFromEp, pkt.bytes(), epIfindex)
		}
		out[i] = ret == actOK
	}
	return out
}

func probesFor() []probe {
	var ps []probe
	for _, src := range []netip.Addr{ipA, ipB, ipPod, ipCIDR, ipOut} {
		for _, pp := range []struct {
			proto policy.Protocol
			port  uint16
		}{{tcp, 80}, {tcp, 81}, {tcp, 8080}, {tcp, 8087}, {tcp, 8088}, {udp, 53}, {udp, 80}, {icmp, 8}, {policy.ProtoSCTP, 80}} {
			ps = append(ps, probe{src: src, dst: epIP, proto: pp.proto, dport: pp.port, dir: in})
			ps = append(ps, probe{src: epIP, dst: src, proto: pp.proto, dport: pp.port, dir: out})
		}
	}
	return ps
}

// TestApplyEndpointNoWindow checks, after every step of ApplyEndpoint, that each probe flow
// passes only if the old or the new policy lets it pass.
func TestApplyEndpointNoWindow(t *testing.T) {
	pol := func(enfIn, enfOut bool, es ...entry) mapstate.EndpointPolicy {
		return mapstate.EndpointPolicy{EnforceIngress: enfIn, EnforceEgress: enfOut, Entries: entries(es...)}
	}
	policies := map[string]mapstate.EndpointPolicy{
		"open":        pol(false, false),
		"open-denies": pol(false, false, e(deny(idA, in, tcp, 0, 0, 1)), e(deny(identity.Any, out, udp, 53, 16, 2))),
		"closed":      pol(true, true),
		"l3":          pol(true, true, e(allow(idA, in, policy.ProtoAny, 0, 0, 3)), e(allow(idB, out, policy.ProtoAny, 0, 0, 4))),
		"l4": pol(true, true,
			e(allow(idA, in, tcp, 80, 16, 5)), e(allow(identity.Any, in, udp, 53, 16, 6)),
			e(allow(flagged, out, tcp, 8080, 13, 7)), e(allow(idB, out, icmp, 8, 16, 8))),
		"mixed": pol(true, false,
			e(allow(idA, in, tcp, 0, 0, 9)), e(deny(idA, in, tcp, 81, 16, 10)),
			e(allow(identity.Any, in, tcp, 8080, 13, 11)), e(deny(flagged, in, tcp, 8080, 16, 12)),
			e(deny(cidrID, out, policy.ProtoAny, 0, 0, 13))),
		"swap": pol(true, false,
			e(deny(idA, in, tcp, 0, 0, 9)), e(allow(idA, in, tcp, 81, 16, 10)),
			e(deny(identity.Any, in, tcp, 8080, 13, 11)), e(allow(flagged, in, tcp, 8080, 16, 12)),
			e(allow(cidrID, out, policy.ProtoAny, 0, 0, 13))),
	}
	names := make([]string, 0, len(policies))
	for n := range policies {
		names = append(names, n)
	}
	probes := probesFor()

	f := newFixture(t, Config{})
	ep := EndpointInfo{EpID: epID, Identity: epIdent, Addr: epIP}
	verdicts := map[string][]bool{}
	for _, n := range names {
		if err := f.d.Endpoints.ApplyEndpoint(epIfindex, ep, policies[n]); err != nil {
			t.Fatal(err)
		}
		verdicts[n] = allowedNow(t, f, probes)
	}
	f.drain()

	for _, from := range names {
		for _, to := range names {
			if from == to {
				continue
			}
			if err := f.d.Endpoints.ApplyEndpoint(epIfindex, ep, policies[from]); err != nil {
				t.Fatal(err)
			}
			var steps []string
			f.d.steps = stepFunc(func(step string) {
				steps = append(steps, step)
				now := allowedNow(t, f, probes)
				for i, ok := range now {
					if ok && !verdicts[from][i] && !verdicts[to][i] {
						t.Errorf("%s -> %s, after %s: %v passes, denied by both", from, to, step, probes[i])
					}
				}
			})
			if err := f.d.Endpoints.ApplyEndpoint(epIfindex, ep, policies[to]); err != nil {
				t.Fatal(err)
			}
			f.d.steps = nil
			if len(steps) != 6 {
				t.Fatalf("steps %v", steps)
			}
			if got := allowedNow(t, f, probes); !equalBools(got, verdicts[to]) {
				t.Errorf("%s -> %s: final verdicts differ from a fresh apply", from, to)
			}
			f.drain()
		}
	}
}

func equalBools(a, b []bool) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestApplyEndpointMapFull fills a tiny policy map: ApplyEndpoint must fail with context
// and leave the endpoint no more permissive than the old or the new policy.
func TestApplyEndpointMapFull(t *testing.T) {
	f := newFixture(t, Config{maxEntries: map[string]uint32{"policy": 4}})
	ep := EndpointInfo{EpID: epID, Identity: epIdent, Addr: epIP}
	old := mapstate.EndpointPolicy{EnforceIngress: false, Entries: entries(
		e(deny(idB, in, tcp, 80, 16, 1)),
		e(allow(idA, in, tcp, 80, 16, 2)),
	)}
	// New: enforce ingress, 5 entries (does not fit next to the old ones).
	newP := mapstate.EndpointPolicy{EnforceIngress: true, Entries: entries(
		e(deny(idA, in, tcp, 81, 16, 3)),
		e(deny(idPod, in, tcp, 80, 16, 4)),
		e(deny(ipcacheless, in, tcp, 80, 16, 5)),
		e(allow(identity.Any, in, udp, 53, 16, 6)),
		e(allow(idB, in, tcp, 8080, 16, 7)),
	)}
	probes := probesFor()
	if err := f.d.Endpoints.ApplyEndpoint(epIfindex, ep, old); err != nil {
		t.Fatal(err)
	}
	oldV := allowedNow(t, f, probes)
	// The new policy does not fit the map even alone, so its verdicts are spelled out below
	// from its entries: egress open; ingress only udp/53 from anyone and tcp/8080 from B.
	err := f.d.Endpoints.ApplyEndpoint(epIfindex, ep, newP)
	if err == nil {
		t.Fatal("ApplyEndpoint into a full map succeeded")
	}
	if !strings.Contains(err.Error(), "applying endpoint 7") || !strings.Contains(err.Error(), "entry") {
		t.Errorf("error without context: %v", err)
	}
	now := allowedNow(t, f, probes)
	for i, ok := range now {
		p := probes[i]
		newAllows := p.dir == out ||
			(p.proto == udp && p.dport == 53) ||
			(p.src == ipB && p.proto == tcp && p.dport == 8080)
		if ok && !oldV[i] && !newAllows {
			t.Errorf("after failed apply: %v passes, denied by old and new", p)
		}
	}
	f.drain()
	// A smaller policy still applies afterwards (recovery).
	if err := f.d.Endpoints.ApplyEndpoint(epIfindex, ep, mapstate.EndpointPolicy{EnforceIngress: true, Entries: entries(e(allow(idA, in, tcp, 80, 16, 2)))}); err != nil {
		t.Fatalf("recovering: %v", err)
	}
	if got := dumpPolicy(t, f.d)[epID]; len(got) != 1 {
		t.Errorf("after recovery: %v", got)
	}
}

// ipcacheless is an identity no address has.
const ipcacheless = identity.Identity(5000)

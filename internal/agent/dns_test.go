package agent

import (
	"net/netip"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/dnsproxy"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

const fqdnPolicy = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: fqdn, namespace: x}
spec:
  endpointSelector: {matchLabels: {pod: a}}
  egress:
  - toFQDNs: [{matchPattern: "*.example.com"}]
    toPorts: [{ports: [{port: "443", protocol: TCP}]}]
`

// A learnt address becomes an allow entry of the endpoint whose toFQDNs selects its name,
// with a CIDR identity of its own in the ipcache; an answer for a name no selector matches,
// or one that only extends an expiry, changes nothing; an expired address goes, unless a
// flow still uses it.
func TestLearnNames(t *testing.T) {
	h := newHarness(t)
	a := h.add("x", "a", map[string]string{"pod": "a"})
	if _, err := h.apply("fqdn.yaml", fqdnPolicy); err != nil {
		t.Fatal(err)
	}
	addr := netip.MustParseAddr("198.19.9.9")
	now := time.Now()
	allowed := func() bool {
		h.a.mu.Lock()
		defer h.a.mu.Unlock()
		d := mapstate.Lookup(h.a.cur.state, a.EpID, policy.Egress, addr, policy.ProtoTCP, 443)
		return d.Verdict == mapstate.Allowed
	}
	if allowed() {
		t.Fatal("allowed before anything was learnt")
	}
	if err := h.a.learnNames(now, []dnsproxy.Answer{{Name: "other.test", Addrs: []netip.Addr{addr}, TTL: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	if allowed() {
		t.Fatal("allowed after an answer for a name no selector matches")
	}
	if err := h.a.learnNames(now, []dnsproxy.Answer{{Name: "API.example.com.", Addrs: []netip.Addr{addr}, TTL: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	if !allowed() {
		t.Fatal("not allowed after the answer")
	}
	h.a.mu.Lock()
	rev := h.a.cur
	h.a.mu.Unlock()
	if err := h.a.learnNames(now.Add(time.Second), []dnsproxy.Answer{{Name: "api.example.com", Addrs: []netip.Addr{addr}, TTL: time.Minute}}); err != nil {
		t.Fatal(err)
	}
	h.a.mu.Lock()
	same := h.a.cur == rev
	h.a.mu.Unlock()
	if !same {
		t.Error("an answer that only extends an expiry changed the state")
	}
	// Expired, a flow still on it: kept as a zombie, no longer allowed for new flows but
	// still in the ipcache with its identity.
	h.dp.conntrackPeers = map[netip.Addr]bool{addr: true}
	h.a.expireNames(now.Add(10 * time.Minute))
	if allowed() {
		t.Error("still allowed after the TTL and grace ran out")
	}
	h.a.mu.Lock()
	_, kept := h.a.cur.state.IPCache[netip.PrefixFrom(addr, 32)]
	h.a.mu.Unlock()
	if !kept {
		t.Error("the address of an open flow lost its ipcache entry")
	}
	h.dp.conntrackPeers = nil
	h.a.expireNames(now.Add(11 * time.Minute))
	h.a.mu.Lock()
	_, kept = h.a.cur.state.IPCache[netip.PrefixFrom(addr, 32)]
	h.a.mu.Unlock()
	if kept {
		t.Error("the address kept its ipcache entry after its last flow")
	}
}

// BenchmarkLearn measures one answer that changes a toFQDNs selector's addresses, with n
// addresses already learnt, on the fake kernel: the computation, the apply and the state
// file.
func BenchmarkLearn(b *testing.B) {
	h := newHarness(b)
	h.add("x", "a", map[string]string{"pod": "a"})
	if _, err := h.apply("fqdn.yaml", fqdnPolicy); err != nil {
		b.Fatal(err)
	}
	now := time.Now()
	for i := range 2000 {
		a := netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})
		if err := h.a.learnNames(now, []dnsproxy.Answer{{Name: "n" + a.String() + ".example.com", Addrs: []netip.Addr{a}, TTL: time.Hour}}); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := range b.N {
		a := netip.AddrFrom4([4]byte{198, 18, byte(i >> 8), byte(i)})
		if err := h.a.learnNames(now, []dnsproxy.Answer{{Name: "m" + a.String() + ".example.com", Addrs: []netip.Addr{a}, TTL: time.Hour}}); err != nil {
			b.Fatal(err)
		}
	}
}

package datapath

import (
	"testing"

	"github.com/rampartnet/rampart/internal/flow"
)

// endpointRevision reads the policy revision the programs see for the fixture's endpoint.
func endpointRevision(t *testing.T, d *Datapath) uint32 {
	t.Helper()
	var info rampartEndpointInfo
	idx := uint32(epIfindex)
	if err := d.objs.Endpoints.Lookup(&idx, &info); err != nil {
		t.Fatal(err)
	}
	return info.Revision
}

// TestPolicyChangeEstablished: a policy change reaches established flows on their next
// packet. A deny ends them, a redirect ends those that do not pass the proxy, an allow
// removed without a deny keeps them (it stops new flows only), and an unchanged allow
// keeps them; replies are not checked.
func TestPolicyChangeEstablished(t *testing.T) {
	f := newProxyFixture(t)
	f.apply(true, true,
		e(allow(idA, in, tcp, 80, 16, 1)), e(allow(idA, in, tcp, 81, 16, 2)),
		e(allow(idA, in, tcp, 82, 16, 3)), e(allow(idA, in, tcp, 83, 16, 4)),
		e(allow(idA, out, tcp, 8080, 16, 5)), e(allow(idA, out, tcp, 8081, 16, 6)))
	rev := endpointRevision(t, f.d)
	if rev == 0 {
		t.Fatal("endpoint installed with revision 0")
	}
	f.apply(true, true,
		e(allow(idA, in, tcp, 80, 16, 1)), e(allow(idA, in, tcp, 81, 16, 2)),
		e(allow(idA, in, tcp, 82, 16, 3)), e(allow(idA, in, tcp, 83, 16, 4)),
		e(allow(idA, out, tcp, 8080, 16, 5)), e(allow(idA, out, tcp, 8081, 16, 6)))
	if got := endpointRevision(t, f.d); got != rev {
		t.Fatalf("revision %d after applying the same policy, want %d (unchanged)", got, rev)
	}
	f.drain()

	ack := func(p packet) packet { p.tcpFlags = 0x10; return p }
	var flows []packet
	for _, port := range []uint16{80, 81, 82, 83} {
		p := f.synIn(ipA, port)
		f.expectPass("SYN before the change", f.toEp(p))
		flows = append(flows, p)
	}
	toRedirect := f.synOut(ipA, tcp, 8080)
	f.expectPass("egress SYN before the change", f.fromEp(toRedirect))
	// A steered flow (as steering leaves it; BPF_PROG_RUN cannot assign) on a port that
	// stays redirect.
	steered := f.synOut(ipA, tcp, 8081)
	putCT(t, f.d, steered, epID, out, ctFToProxy)

	f.apply(true, true,
		e(redirect(idA, in, tcp, 80, 16, 11)), e(deny(idA, in, tcp, 81, 16, 12)),
		e(allow(idA, in, tcp, 83, 16, 4)),
		e(redirect(idA, out, tcp, 8080, 16, 15)), e(redirect(idA, out, tcp, 8081, 16, 16)))
	if got := endpointRevision(t, f.d); got == rev {
		t.Fatalf("revision still %d after a policy change", got)
	}
	f.drain()

	for range 2 { // the flow stays refused, not only its first packet
		f.check("established flow, port now redirect", f.toEp(ack(flows[0])),
			want{reason: flow.ReasonProxyBypass, dir: in, rule: 11, l7Ingress: true})
	}
	f.check("established flow, port now denied", f.toEp(ack(flows[1])),
		want{reason: flow.ReasonPolicyDeny, dir: in, rule: 12})
	f.check("established flow, allow removed", f.toEp(ack(flows[2])), want{pass: true, noEvent: true})
	f.check("new flow, allow removed", f.toEp(f.synIn(ipA, 82)), want{reason: flow.ReasonPolicyDefaultDeny, dir: in})
	f.check("established flow, allow kept", f.toEp(ack(flows[3])), want{pass: true, noEvent: true})
	// Replies follow their flow: the endpoint's answer on the now-redirected port passes
	// (the flow's own packets are what the change stops).
	synAck := packet{src: epIP, dst: ipA, proto: uint8(tcp), sport: 80, dport: flows[0].sport, tcpFlags: 0x12}
	f.check("reply of the redirected flow", f.fromEp(synAck), want{pass: true, noEvent: true})

	f.check("egress flow, port now redirect, not steered", f.fromEp(ack(toRedirect)),
		want{reason: flow.ReasonProxyBypass, rule: 15, l7Egress: true})
	// The steered flow is not refused by the check: it goes on to its proxy socket (none
	// here, so the steering drop, not a bypass).
	f.check("egress flow, port redirect, steered", f.fromEp(ack(steered)),
		want{reason: flow.ReasonProxyUnavailable})

	// Flows that passed the check took the new check revision (the policy revision plus
	// the ipcache generation, unchanged here); refused ones kept the old one.
	gen, err := f.d.ipcacheGeneration()
	if err != nil {
		t.Fatal(err)
	}
	cur, rev := endpointRevision(t, f.d)+gen, rev+gen
	ctRev := func(p packet, dir uint8) uint32 {
		t.Helper()
		k := ct4Key(p, epID, dir)
		var v rampartCtValue
		if err := f.d.objs.Conntrack4Peer.Lookup(&k, &v); err != nil {
			t.Fatalf("conntrack entry of %v: %v", p, err)
		}
		return v.Revision
	}
	if got := ctRev(flows[2], uint8(in)); got != cur {
		t.Errorf("kept flow's conntrack revision %d, want %d", got, cur)
	}
	if got := ctRev(flows[0], uint8(in)); got != rev {
		t.Errorf("refused flow's conntrack revision %d, want the old %d", got, rev)
	}
	if got := ctRev(steered, uint8(out)); got != cur {
		t.Errorf("steered flow's conntrack revision %d, want %d", got, cur)
	}
}

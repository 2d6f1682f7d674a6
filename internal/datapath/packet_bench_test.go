package datapath

import (
	"testing"

	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

// BenchmarkPacketPaths measures the programs' cost per packet (BPF_PROG_RUN in the kernel)
// on each path a packet can take: an established flow's packets in both directions (the
// path nearly every packet of a bulk transfer takes), and a new flow evaluated against
// policy. It is how changes to the per-packet work are compared:
//
//	go test -run '^$' -bench PacketPaths ./internal/datapath/
func BenchmarkPacketPaths(b *testing.B) {
	d := openTest(b, Config{})
	if err := d.IPCache.ApplyIPCache(fixtureIPCache()); err != nil {
		b.Fatal(err)
	}
	err := d.Endpoints.ApplyEndpoint(epIfindex, EndpointInfo{EpID: epID, Identity: epIdent, Addr: epIP}, mapstate.EndpointPolicy{
		EnforceEgress: true, EnforceIngress: true,
		Entries: entries(e(allow(idA, out, policy.ProtoAny, 0, 0, 1)), e(allow(idA, in, policy.ProtoAny, 0, 0, 2))),
	})
	if err != nil {
		b.Fatal(err)
	}
	peer := ipA
	syn := packet{src: epIP, dst: peer, proto: 6, sport: 40000, dport: 80, tcpFlags: 0x02}
	ack := packet{src: epIP, dst: peer, proto: 6, sport: 40000, dport: 80, tcpFlags: 0x10, payload: make([]byte, 1400)}
	reply := packet{src: peer, dst: epIP, proto: 6, sport: 80, dport: 40000, tcpFlags: 0x10}
	udp := packet{src: epIP, dst: peer, proto: 17, sport: 40001, dport: 53, payload: make([]byte, 1400)}
	udpIn := packet{src: peer, dst: epIP, proto: 17, sport: 40002, dport: 53, payload: make([]byte, 1400)}
	// Open the flows once, so the measured packets find their conntrack entries.
	for _, p := range []packet{syn, udp} {
		if ret, _, err := d.objs.RampartFromEp.Benchmark(p.bytes(), 1, nil); err != nil || ret != actOK {
			b.Fatalf("opening flow: verdict %d, %v", ret, err)
		}
	}
	if ret, _, err := d.objs.RampartToEp.Benchmark(udpIn.bytes(), 1, nil); err != nil || ret != actOK {
		b.Fatalf("opening flow: verdict %d, %v", ret, err)
	}
	for _, c := range []struct {
		name string
		from bool // rampart_from_ep, else rampart_to_ep
		p    packet
		want uint32
	}{
		{"tcp-established-egress", true, ack, actOK},
		{"tcp-reply-ingress", false, reply, actOK},
		{"udp-established-egress", true, udp, actOK},
		{"udp-established-ingress", false, udpIn, actOK},
		// ICMP timestamp requests are stateless: policy is evaluated on every packet.
		{"new-flow-evaluated", true, packet{src: epIP, dst: peer, proto: 1, icmpType: 13}, actOK},
		{"new-flow-denied", true, packet{src: epIP, dst: ipB, proto: 1, icmpType: 13}, actShot},
	} {
		b.Run(c.name, func(b *testing.B) {
			prog := d.objs.RampartToEp
			if c.from {
				prog = d.objs.RampartFromEp
			}
			ret, per, err := prog.Benchmark(c.p.bytes(), b.N, nil)
			if err != nil {
				b.Fatal(err)
			}
			if ret != c.want {
				b.Fatalf("verdict %d, want %d", ret, c.want)
			}
			b.ReportMetric(float64(per.Nanoseconds()), "ns/packet")
		})
	}
}

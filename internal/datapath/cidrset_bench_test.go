package datapath

import (
	"fmt"
	"net/netip"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/cidrtable"
	"github.com/rampartnet/rampart/internal/cidrtable/cidrtest"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

// BenchmarkReplaceCIDRSets loads 1M and 10M prefixes into one set of a datapath with the
// default host table bound and reports the build and write times and the memory per
// prefix (the dataplane's, and the kernel tables' alone):
//
//	go test -run '^$' -bench ReplaceCIDRSets -benchtime 3x ./internal/datapath/
//
// Each iteration is a full reload (the second and later replace the same content, which
// is what a reload of an unchanged list costs).
func BenchmarkReplaceCIDRSets(b *testing.B) {
	for _, c := range []struct {
		name string
		n    int
		v6   bool
	}{{"1M", 1_000_000, false}, {"10M", 10_000_000, false}, {"v6-1M", 1_000_000, true}} {
		b.Run(c.name, func(b *testing.B) {
			d := openTest(b, Config{CIDR6MaxEntries: 2 << 20})
			ct := cidrOf(b, d, cidrtable.DefaultHostSlots)
			ps := cidrtest.BenchPrefixes(c.n, 1)
			if c.v6 {
				ps = cidrtest.BenchPrefixes6(c.n, 1)
			}
			sets := map[uint8][]netip.Prefix{0: ps}
			runtime.GC()
			var st cidrtable.Stats
			var total time.Duration
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				var err error
				if st, err = ct.ReplaceCIDRSets(sets); err != nil {
					b.Fatal(err)
				}
				total += time.Since(t0)
			}
			b.ReportMetric(float64(st.Build.Milliseconds()), "build-ms")
			b.ReportMetric(float64(st.Write.Milliseconds()), "write-ms")
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "replace-ms")
			b.ReportMetric(float64(st.MemoryBytes)/float64(st.Prefixes), "B/prefix")
			b.ReportMetric(float64(st.KernelBytes)/float64(st.Prefixes), "kernel-B/prefix")
			b.Logf("%s: %+v", c.name, st)
		})
	}
}

// BenchmarkCIDRSetPacket measures the program's time per packet (BPF_PROG_RUN, repeated
// in the kernel) for a destination in a set and one in no set, with 10, 1M and 10M
// prefixes loaded: the cost must not grow with the number of prefixes. The packets are
// ICMP timestamp requests, which policy evaluates on every packet (no conntrack entry), so
// every run does the ipcache, CIDR set and policy lookups.
//
//	go test -run '^$' -bench CIDRSetPacket ./internal/datapath/
func BenchmarkCIDRSetPacket(b *testing.B) {
	d := openTest(b, Config{})
	ct := cidrOf(b, d, cidrtable.DefaultHostSlots)
	if err := d.IPCache.ApplyIPCache(fixtureIPCache()); err != nil {
		b.Fatal(err)
	}
	err := d.Endpoints.ApplyEndpoint(epIfindex, EndpointInfo{EpID: epID, Identity: epIdent, Addr: epIP}, mapstate.EndpointPolicy{
		EnforceEgress: true,
		Entries: entries(e(allow(identity.Any, out, policy.ProtoAny, 0, 0, 1)),
			e(deny(identity.CIDRSet(0), out, icmp, 0, 0, 2))),
	})
	if err != nil {
		b.Fatal(err)
	}
	listed, unlisted := addr("192.0.2.1"), addr("192.0.2.2")
	for _, n := range []int{10, 1_000_000, 10_000_000} {
		ps := append(cidrtest.BenchPrefixes(n, 2), netip.PrefixFrom(listed, 32))
		ps = slices.DeleteFunc(ps, func(p netip.Prefix) bool { return p.Contains(unlisted) })
		if _, err := ct.ReplaceCIDRSets(map[uint8][]netip.Prefix{0: ps}); err != nil {
			b.Fatal(err)
		}
		for _, c := range []struct {
			name string
			dst  netip.Addr
			want uint32
		}{{"listed", listed, actShot}, {"unlisted", unlisted, actOK}} {
			b.Run(fmt.Sprintf("%d/%s", n, c.name), func(b *testing.B) {
				p := packet{src: epIP, dst: c.dst, proto: uint8(icmp), icmpType: 13}
				ret, per, err := d.objs.RampartFromEp.Benchmark(p.bytes(), b.N, nil)
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
}

package policy

import (
	"bytes"
	"fmt"
	"syscall"
	"testing"
	"time"
)

// benchPolicy is a NetworkPolicy of n ingress rules written as bench/applylatency writes
// its large policy (docs/benchmarks.md, "Apply to enforcement"): peers rotating over two
// app labels (two ports each) and /32 blocks (one port), as YAML or as compact JSON.
func benchPolicy(n int, json bool) []byte {
	var b bytes.Buffer
	if json {
		b.WriteString(`{"apiVersion":"networking.k8s.io/v1","kind":"NetworkPolicy","metadata":{"name":"bench-apply","namespace":"bench"},` +
			`"spec":{"podSelector":{"matchLabels":{"app":"bench-server"}},"policyTypes":["Ingress"],"ingress":[`)
	} else {
		b.WriteString("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata:\n  name: bench-apply\n  namespace: bench\n" +
			"spec:\n  podSelector:\n    matchLabels:\n      app: bench-server\n  policyTypes: [Ingress]\n  ingress:\n")
	}
	for i := range n {
		port := 10000 + 4*i
		ports := []int{port, port + 2}
		if i%3 == 2 {
			ports = ports[:1]
		}
		if json {
			if i > 0 {
				b.WriteByte(',')
			}
			if i%3 == 2 {
				fmt.Fprintf(&b, `{"from":[{"ipBlock":{"cidr":"198.19.%d.%d/32"}}],"ports":[`, 128+i/256%128, i%256)
			} else {
				fmt.Fprintf(&b, `{"from":[{"podSelector":{"matchLabels":{"app":"bench-client-%d"}}}],"ports":[`, i%2)
			}
			for j, p := range ports {
				if j > 0 {
					b.WriteByte(',')
				}
				fmt.Fprintf(&b, `{"protocol":"TCP","port":%d}`, p)
			}
			b.WriteString("]}")
			continue
		}
		b.WriteString("  - from:\n")
		if i%3 == 2 {
			fmt.Fprintf(&b, "    - ipBlock:\n        cidr: 198.19.%d.%d/32\n", 128+i/256%128, i%256)
		} else {
			fmt.Fprintf(&b, "    - podSelector:\n        matchLabels:\n          app: bench-client-%d\n", i%2)
		}
		b.WriteString("    ports:\n")
		for _, p := range ports {
			fmt.Fprintf(&b, "    - protocol: TCP\n      port: %d\n", p)
		}
	}
	if json {
		b.WriteString("]}}\n")
	}
	return b.Bytes()
}

// cpuTime is the CPU time of the process so far, every thread's.
func cpuTime() time.Duration {
	var r syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &r); err != nil {
		return 0
	}
	return time.Duration(r.Utime.Nano() + r.Stime.Nano())
}

// BenchmarkParse10kRules parses the benchmark's 10,000-rule policy. cpu-ms/op is the
// process's CPU time per parse (the goroutines that check rules and the collector
// included): on a shared machine, wall time per op says more about the load than about
// the parser.
func BenchmarkParse10kRules(b *testing.B) {
	for _, format := range []string{"json", "yaml"} {
		b.Run(format, func(b *testing.B) {
			data := benchPolicy(10000, format == "json")
			b.SetBytes(int64(len(data)))
			start := cpuTime()
			for b.Loop() {
				if _, err := Parse("bench."+format, data); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(cpuTime()-start)/float64(time.Millisecond)/float64(b.N), "cpu-ms/op")
		})
	}
}

package identities

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/k8stest"
)

// BenchmarkAllocateThousand measures allocating 1,000 new label sets (1,000 new pods each
// with labels of its own) against a real API server: by one agent in sequence, and by four
// agents at once (250 each, their own clients). One op is the whole thousand; ms/1000sets
// is its mean wall time. Run with -benchtime=1x (or 3x).
func BenchmarkAllocateThousand(b *testing.B) {
	c := k8stest.Start(b)
	c.InstallCRDs(b)
	for _, agents := range []int{1, 4} {
		b.Run(fmt.Sprintf("agents=%d", agents), func(b *testing.B) {
			var allocs []*Allocator
			for range agents {
				allocs = append(allocs, startAllocator(b, c, Options{Logf: b.Logf}))
			}
			b.ResetTimer()
			var total time.Duration
			for range b.N {
				ns := "bench-" + testenv.Suffix(8)
				began := time.Now()
				var wg sync.WaitGroup
				errs := make([]error, agents)
				got := make([][]identity.Identity, agents)
				for k, a := range allocs {
					wg.Go(func() {
						for i := k; i < 1000; i += agents {
							id, err := a.Allocate(ctxT(b, time.Minute), podLabels(ns, fmt.Sprint("pod-", i)))
							if err != nil {
								errs[k] = err
								return
							}
							got[k] = append(got[k], id)
						}
					})
				}
				wg.Wait()
				elapsed := time.Since(began)
				seen := map[identity.Identity]bool{}
				for k := range allocs {
					if errs[k] != nil {
						b.Fatal(errs[k])
					}
					for _, id := range got[k] {
						if seen[id] {
							b.Fatalf("number %d given twice", id)
						}
						seen[id] = true
					}
				}
				if len(seen) != 1000 {
					b.Fatalf("%d distinct numbers, want 1000", len(seen))
				}
				total += elapsed
				b.Logf("%d agent(s): 1000 new label sets in %v (%.2f ms each)", agents, elapsed.Round(time.Millisecond), float64(elapsed.Microseconds())/1000/1000)
			}
			b.ReportMetric(float64(total.Milliseconds())/float64(b.N), "ms/1000sets")
		})
	}
}

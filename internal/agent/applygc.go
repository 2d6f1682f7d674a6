package agent

import (
	"os"
	"runtime/debug"
	"sync"

	"github.com/rampartnet/rampart/internal/api"
)

// The garbage collector during large applies (an API apply, or a Kubernetes view whose
// changed policy objects are that large). Parsing a 1.5 MB policy allocates about
// 50 MB of short-lived trees and lists; with the default GOGC=100 the collector runs
// several times during one apply, marking the agent's whole live state each time, and
// takes a fifth of the apply's CPU before the dataplane holds the new policy. While a
// request of at least largeApplyBytes is handled the agent runs with GOGC=applyGCPercent:
// for that time the heap may grow to five times the live heap instead of twice, and the
// previous setting is put back when the last such request ends. Measured with the
// 10,000-rule benchmark policy, the agent's CPU per apply fell from 189 to 140 ms while
// its peak RSS stayed where it was (156 MB, against 162 MB at GOGC=100, in one run of
// six rounds). An operator's own GOGC or GOMEMLIMIT is left alone:
// they chose the trade-off (docs/benchmarks.md, "Apply to enforcement").
const (
	largeApplyBytes = 256 << 10
	applyGCPercent  = 400
)

var applyGC struct {
	mu     sync.Mutex
	active int // requests in a relaxed scope
	prev   int // the GC percent to put back
}

// operatorGC reports whether the operator tuned the collector through the environment.
var operatorGC = os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != ""

// relaxGC raises the GC percent for a request of size bytes, if it is large, and returns
// the function that ends the scope.
func relaxGC(size int) func() {
	if size < largeApplyBytes || operatorGC {
		return func() {}
	}
	applyGC.mu.Lock()
	defer applyGC.mu.Unlock()
	if applyGC.active == 0 {
		applyGC.prev = debug.SetGCPercent(applyGCPercent)
		if applyGC.prev < 0 || applyGC.prev >= applyGCPercent {
			// Off, or already as relaxed (set in code elsewhere): keep it.
			debug.SetGCPercent(applyGC.prev)
		}
	}
	applyGC.active++
	return func() {
		applyGC.mu.Lock()
		defer applyGC.mu.Unlock()
		if applyGC.active--; applyGC.active == 0 {
			debug.SetGCPercent(applyGC.prev)
		}
	}
}

// changedObjectBytes is the size of the policy objects of v that syncCluster parses anew
// (a.mu held).
func (a *Agent) changedObjectBytes(v ClusterView) int {
	n := 0
	for key, o := range v.Objects {
		if prev, ok := a.k8s.parsed[key]; !ok || prev.rv != o.ResourceVersion {
			n += len(o.Document)
		}
	}
	return n
}

// requestBytes is the size of an apply request's documents.
func requestBytes(docs []api.Document) int {
	n := 0
	for _, d := range docs {
		n += len(d.Data)
	}
	return n
}

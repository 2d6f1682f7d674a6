//go:build pprof

// Profiling, only in a build with -tags pprof (docs/benchmarks.md, "Apply to
// enforcement"): RAMPARTD_PPROF=127.0.0.1:6060 serves net/http/pprof there, so a benchmark
// can take a CPU profile of the agent while it works. Release builds have no such listener.
package main

import (
	"fmt"
	"net/http"
	_ "net/http/pprof"
	"os"
)

func init() {
	addr := os.Getenv("RAMPARTD_PPROF")
	if addr == "" {
		return
	}
	go func() {
		if err := http.ListenAndServe(addr, nil); err != nil {
			fmt.Fprintf(os.Stderr, "rampartd: pprof on %s: %v\n", addr, err)
		}
	}()
}

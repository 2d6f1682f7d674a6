package policy

import (
	"runtime"
	"sync"
)

// parallelFrom is the length from which a list's items are parsed on several cores. A
// policy of thousands of rules took most of an apply's time in parsing, one core busy and
// the others idle; below a few hundred items the goroutines cost more than they save.
const parallelFrom = 512

// parseEach returns fn(0), ..., fn(n-1) in order, or the error of the lowest i that fails:
// the same result, and the same error, as calling fn in a loop that stops at the first
// error. Long lists are split into contiguous chunks parsed side by side, so fn must only
// read shared state (the docParser's fields are set before a document's lists are
// parsed).
func parseEach[T any](n int, fn func(i int) (T, error)) ([]T, error) {
	out := make([]T, n)
	run := func(lo, hi int) error {
		for i := lo; i < hi; i++ {
			v, err := fn(i)
			if err != nil {
				return err
			}
			out[i] = v
		}
		return nil
	}
	workers := min(runtime.GOMAXPROCS(0), 4)
	if n < parallelFrom || workers < 2 {
		if err := run(0, n); err != nil {
			return nil, err
		}
		return out, nil
	}
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := n*w/workers, n*(w+1)/workers
		wg.Go(func() { errs[w] = run(lo, hi) })
	}
	wg.Wait()
	// The first failing chunk holds the lowest failing item: its error is the one a
	// loop would have returned.
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

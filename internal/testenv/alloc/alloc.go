// Package alloc measures what code allocates, for tests that bound the memory a hostile
// input may cost. It imports nothing of the project, so every layer's tests can use it.
package alloc

import "runtime"

// Bytes returns the bytes fn allocated, whether or not they were freed since: a bound on
// it holds however the garbage collector runs, where one on the heap in use would not.
// Other goroutines' allocations during fn count too.
func Bytes(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// Bound returns a bound on Bytes for this build: b, or four times b under the race
// detector, whose instrumentation allocates beside the code.
func Bound(b uint64) uint64 {
	if race {
		return 4 * b
	}
	return b
}

package cidrtable

import (
	"runtime"
	"sync"
)

// radixBits is the digit width of radixSort. 10 bits (1024 buckets) measured fastest here
// for 10M keys: wider digits scatter to more places at once than the caches and TLB hold,
// narrower ones need more passes. The CIDR set builder's keys (37 and 40 bits) take 4.
const radixBits = 10

// radixParallelMin is the size from which radixSort splits each pass across CPUs.
const radixParallelMin = 1 << 16

// radixSort sorts the low keyBits bits of keys ascending (higher bits must be zero) with
// an LSD radix sort, using buf (at least len(keys) long) as scratch space. It returns the
// sorted slice, which is keys or buf[:len(keys)]. Passes whose digit is the same for every
// key are skipped. Each pass counts and scatters in parallel over contiguous chunks (each
// worker writes its chunk's keys after those of the chunks before it, so the sort stays
// stable). O(n) per pass: 10M keys sort in about 0.2 s where a comparison sort takes
// seconds.
func radixSort(keys, buf []uint64, keyBits int) []uint64 {
	n := len(keys)
	if n < 2 {
		return keys
	}
	workers := 1
	if n >= radixParallelMin {
		workers = runtime.GOMAXPROCS(0)
	}
	chunk := (n + workers - 1) / workers
	counts := make([][1 << radixBits]int, workers)
	src, dst := keys, buf[:n]
	for shift := 0; shift < keyBits; shift += radixBits {
		parallel(workers, func(w int) {
			c := &counts[w]
			*c = [1 << radixBits]int{}
			for _, k := range src[min(w*chunk, n):min((w+1)*chunk, n)] {
				c[(k>>shift)&(1<<radixBits-1)]++
			}
		})
		sum, skip := 0, false
		for d := range 1 << radixBits {
			total := 0
			for w := range counts {
				v := counts[w][d]
				counts[w][d] = sum + total
				total += v
			}
			if total == n {
				skip = true // every key has this digit: the pass would not move anything
				break
			}
			sum += total
		}
		if skip {
			continue
		}
		parallel(workers, func(w int) {
			c := &counts[w]
			for _, k := range src[min(w*chunk, n):min((w+1)*chunk, n)] {
				d := (k >> shift) & (1<<radixBits - 1)
				dst[c[d]] = k
				c[d]++
			}
		})
		src, dst = dst, src
	}
	return src
}

// parallel runs fn(0..workers-1), concurrently when there is more than one.
func parallel(workers int, fn func(w int)) {
	if workers == 1 {
		fn(0)
		return
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() { fn(w) })
	}
	wg.Wait()
}

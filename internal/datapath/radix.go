package datapath

// radixBits is the digit width of radixSort: 2^11 counters (16 KiB) stay in L1 cache, and
// 37- to 44-bit keys (the CIDR set builder's) take 4 passes.
const radixBits = 11

// radixSort sorts the low keyBits bits of keys ascending (higher bits must be zero) with
// an LSD radix sort, using buf (at least len(keys) long) as scratch space. It returns the
// sorted slice, which is keys or buf[:len(keys)]. Passes whose digit is the same for every
// key are skipped, so nearly uniform keys cost little. O(n) per pass: 10M keys sort in
// well under a second where a comparison sort takes seconds.
func radixSort(keys, buf []uint64, keyBits int) []uint64 {
	n := len(keys)
	if n < 2 {
		return keys
	}
	passes := (keyBits + radixBits - 1) / radixBits
	counts := make([][1 << radixBits]int, passes)
	for _, k := range keys {
		for p := range counts {
			counts[p][(k>>(p*radixBits))&(1<<radixBits-1)]++
		}
	}
	src, dst := keys, buf[:n]
	for p := range counts {
		shift := p * radixBits
		c := &counts[p]
		if c[(src[0]>>shift)&(1<<radixBits-1)] == n {
			continue // every key has this digit: the pass would not move anything
		}
		sum := 0
		for i, v := range c {
			c[i] = sum
			sum += v
		}
		for _, k := range src {
			d := (k >> shift) & (1<<radixBits - 1)
			dst[c[d]] = k
			c[d]++
		}
		src, dst = dst, src
	}
	return src
}

package benchkit

import (
	"math"
	"slices"
	"time"
)

// Median returns the median of xs (the mean of the two middle values for an even count),
// or NaN for none. Medians, not means, because one disturbed sample on a shared VM can be
// off by a factor of two.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// Percentile returns the p-th percentile (0 < p <= 100) of sorted durations by the
// nearest-rank method, so it is always one of the observed values.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = max(1, min(rank, len(sorted)))
	return sorted[rank-1]
}

// PairedRatios are the ratios f(xs[i]) / f(base[i]) of a case's samples to the baseline's
// sample of the same round: their median and range.
func PairedRatios[S any](xs, base []S, f func(S) float64) (median, lo, hi float64) {
	rs := make([]float64, 0, len(xs))
	for i := range xs {
		rs = append(rs, Ratio(f(xs[i]), f(base[i])))
	}
	lo, hi = MinMax(rs)
	return Median(rs), lo, hi
}

// MinMax returns the smallest and largest of xs (NaN, NaN for none).
func MinMax(xs []float64) (float64, float64) {
	if len(xs) == 0 {
		return math.NaN(), math.NaN()
	}
	return slices.Min(xs), slices.Max(xs)
}

// Ratio returns x/base, or NaN when base is not positive (no baseline to compare with).
func Ratio(x, base float64) float64 {
	if base <= 0 || math.IsNaN(base) {
		return math.NaN()
	}
	return x / base
}

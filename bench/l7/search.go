package l7

import (
	"context"
	"fmt"
	"math"
	"time"
)

// Criterion decides whether a configuration sustains a rate: every response is 200, the
// achieved rate is at least MinAchieved of the target, and p99 latency stays within
// P99Bound.
type Criterion struct {
	MinAchieved float64       `json:"min_achieved_fraction"`
	P99Bound    time.Duration `json:"-"`
	P99BoundUs  float64       `json:"p99_bound_us"`
}

// judge says whether run sustained its target rate, and if not, why.
func (c Criterion) judge(run LoadRun) (bool, string) {
	switch {
	case run.Errors > 0:
		return false, fmt.Sprintf("%d of %d responses not 200 (%v)", run.Errors, run.Requests, run.RetCodes)
	case run.TargetQPS > 0 && run.ActualQPS < c.MinAchieved*run.TargetQPS:
		return false, fmt.Sprintf("achieved %.0f/s of %.0f/s (< %.0f%%)", run.ActualQPS, run.TargetQPS, 100*c.MinAchieved)
	case run.P99Us > float64(c.P99Bound/time.Microsecond):
		return false, fmt.Sprintf("p99 %.0f us > %v", run.P99Us, c.P99Bound)
	}
	return true, ""
}

// Step is one run of the search.
type Step struct {
	LoadRun
	// Attempt is 1, or 2 for the second run at a rate whose first run missed the
	// criterion.
	Attempt   int    `json:"attempt"`
	Sustained bool   `json:"sustained"`
	Why       string `json:"why,omitempty"` // why not
}

// measureFunc runs the load generator at rate (requests/s) for the search's step length.
type measureFunc func(ctx context.Context, rate float64) (LoadRun, error)

// Search range, as fractions of the closed-loop saturation rate: a rate above what the
// connections achieve as fast as they can cannot be sustained (the top leaves room for
// noise between the two runs), and half of it almost always is.
const (
	searchLow  = 0.5
	searchHigh = 1.04
	// searchFloor is the lowest fraction tried when even searchLow fails.
	searchFloor = 0.05
)

// searchSustained finds the highest rate that c accepts, by bisection over
// [searchLow, searchHigh] x saturation in steps steps; each step halves the interval, so
// the result is within (searchHigh-searchLow)/2^steps of saturation below the true limit.
// A rate whose run misses the criterion without errors is run a second time and passes if
// that run meets it: on a shared machine a burst of other work in one short run (a few
// tens of milliseconds of stall are enough to push p99 over the bound) says nothing about
// what the configuration sustains, while a rate beyond its capacity misses both times.
// If no rate in the range passes, it halves from searchLow down to searchFloor. It returns
// the highest rate that passed (0 if none) and every run.
func searchSustained(ctx context.Context, saturation float64, steps int, c Criterion, measure measureFunc) (float64, []Step, error) {
	if saturation <= 0 || math.IsNaN(saturation) {
		return 0, nil, fmt.Errorf("no saturation rate to search under (%v)", saturation)
	}
	var tried []Step
	best := 0.0
	try := func(f float64) (bool, error) {
		rate := math.Max(1, math.Round(f*saturation))
		for attempt := 1; ; attempt++ {
			run, err := measure(ctx, rate)
			if err != nil {
				return false, fmt.Errorf("at %.0f/s: %w", rate, err)
			}
			ok, why := c.judge(run)
			tried = append(tried, Step{LoadRun: run, Attempt: attempt, Sustained: ok, Why: why})
			if ok {
				best = math.Max(best, rate)
				return true, nil
			}
			if attempt == 2 || run.Errors > 0 {
				return false, nil
			}
		}
	}
	lo, hi := searchLow, searchHigh
	for range steps {
		f := (lo + hi) / 2
		ok, err := try(f)
		if err != nil {
			return best, tried, err
		}
		if ok {
			lo = f
		} else {
			hi = f
		}
	}
	for f := searchLow; best == 0 && f >= searchFloor; f /= 2 {
		if _, err := try(f); err != nil {
			return best, tried, err
		}
	}
	return best, tried, nil
}

package l7

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"
)

var testCriterion = Criterion{MinAchieved: 0.98, P99Bound: 10 * time.Millisecond}

// fakeServer achieves min(rate, capacity) with a p99 that is low under capacity and over
// the bound above it.
func fakeServer(capacity float64, calls *[]float64) measureFunc {
	return func(_ context.Context, rate float64) (LoadRun, error) {
		*calls = append(*calls, rate)
		r := LoadRun{TargetQPS: rate, ActualQPS: math.Min(rate, capacity), Requests: 1000, OK: 1000, P99Us: 500}
		if rate > capacity {
			r.P99Us = 50000
		}
		return r, nil
	}
}

func TestSearchSustained(t *testing.T) {
	for _, c := range []struct{ saturation, capacity float64 }{
		{10000, 9000}, {10000, 10000}, {10000, 6000}, {10000, 5100}, {3000, 2000},
	} {
		var calls []float64
		got, steps, err := searchSustained(context.Background(), c.saturation, 4, testCriterion, fakeServer(c.capacity, &calls))
		if err != nil {
			t.Fatal(err)
		}
		// Every rate is run once if it passes, twice if it misses.
		want := 0
		rates := map[float64]int{}
		for _, s := range steps {
			rates[s.TargetQPS]++
			if s.Attempt != rates[s.TargetQPS] {
				t.Errorf("capacity %v: step %+v is attempt %d at its rate", c.capacity, s, rates[s.TargetQPS])
			}
		}
		for r, n := range rates {
			w := 1
			if r > c.capacity {
				w = 2
			}
			if n != w {
				t.Errorf("capacity %v: rate %v run %d times, want %d", c.capacity, r, n, w)
			}
			want += w
		}
		fallback := c.capacity < (searchLow+(searchHigh-searchLow)/16)*c.saturation
		if (!fallback && len(rates) != 4) || (fallback && len(rates) != 5) || len(calls) != want {
			t.Errorf("capacity %v: %d rates, %d calls (want %d)", c.capacity, len(rates), len(calls), want)
		}
		// Four halvings of [0.5, 1.04] x saturation: within 0.54/16 of it below capacity.
		res := (searchHigh - searchLow) / 16 * c.saturation
		if got > c.capacity || got < c.capacity-res-1 {
			t.Errorf("saturation %v capacity %v: sustained %v, want within %v below capacity", c.saturation, c.capacity, got, res)
		}
		for _, s := range steps {
			if s.Sustained != (s.TargetQPS <= c.capacity) || (s.Why == "") == !s.Sustained {
				t.Errorf("capacity %v: step %+v judged wrongly", c.capacity, s)
			}
		}
	}
}

func TestSearchFallsBelowRange(t *testing.T) {
	var calls []float64
	got, _, err := searchSustained(context.Background(), 10000, 3, testCriterion, fakeServer(1500, &calls))
	if err != nil {
		t.Fatal(err)
	}
	// 3 bisection steps fail, then 0.5, 0.25 fail and 0.125 (1250/s) passes: five rates
	// missed twice each, one passed.
	if got != 1250 || len(calls) != 11 {
		t.Errorf("sustained %v after calls %v, want 1250 after 11", got, calls)
	}
	calls = nil
	got, _, err = searchSustained(context.Background(), 10000, 2, testCriterion, fakeServer(10, &calls))
	if err != nil || got != 0 {
		t.Errorf("nothing sustainable: got %v, %v; want 0", got, err)
	}
	if _, _, err := searchSustained(context.Background(), 0, 2, testCriterion, fakeServer(10, &calls)); err == nil {
		t.Error("no saturation rate accepted")
	}
	boom := errors.New("boom")
	_, _, err = searchSustained(context.Background(), 1000, 2, testCriterion, func(context.Context, float64) (LoadRun, error) { return LoadRun{}, boom })
	if !errors.Is(err, boom) {
		t.Errorf("measure error lost: %v", err)
	}
}

// TestSearchRetriesOnce: a rate that misses once (a disturbed run) and then passes counts
// as sustained; one that fails with errors is not run again.
func TestSearchRetriesOnce(t *testing.T) {
	var calls []float64
	flaky := func(_ context.Context, rate float64) (LoadRun, error) {
		calls = append(calls, rate)
		r := LoadRun{TargetQPS: rate, ActualQPS: rate, Requests: 100, OK: 100, P99Us: 500}
		if len(calls) == 1 {
			r.P99Us = 90000 // the first run is disturbed
		}
		if rate > 9000 {
			r.OK, r.Errors = 99, 1
		}
		return r, nil
	}
	got, steps, err := searchSustained(context.Background(), 10000, 2, testCriterion, flaky)
	if err != nil {
		t.Fatal(err)
	}
	// 7700/s misses, passes on its second run; 9050/s has an error: not retried.
	if got != 7700 || len(calls) != 3 || calls[0] != calls[1] || steps[1].Attempt != 2 || !steps[1].Sustained || steps[2].Sustained {
		t.Errorf("sustained %v, calls %v, steps %+v", got, calls, steps)
	}
}

func TestCriterion(t *testing.T) {
	base := LoadRun{TargetQPS: 1000, ActualQPS: 990, Requests: 990, OK: 990, P99Us: 9000}
	if ok, why := testCriterion.judge(base); !ok {
		t.Errorf("good run refused: %s", why)
	}
	for name, mod := range map[string]func(*LoadRun){
		"errors":      func(r *LoadRun) { r.OK--; r.Errors = 1 },
		"slow rate":   func(r *LoadRun) { r.ActualQPS = 979 },
		"p99 too big": func(r *LoadRun) { r.P99Us = 10001 },
	} {
		r := base
		mod(&r)
		if ok, why := testCriterion.judge(r); ok || why == "" {
			t.Errorf("%s: accepted (%q)", name, why)
		}
	}
	closed := LoadRun{ActualQPS: 5, Requests: 10, OK: 10, P99Us: 1}
	if ok, why := testCriterion.judge(closed); !ok {
		t.Errorf("closed-loop run (no target) refused: %s", why)
	}
}

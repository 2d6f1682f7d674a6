package policyoverhead

import (
	"fmt"
	"slices"
)

// poolPairStride separates the pair numbers of pooled runs: a run has far fewer pairs.
const poolPairStride = 1_000_000

// Pool merges runs of the benchmark into one result whose cases hold every run's samples,
// each still paired with its own run's baseline sample, and summarizes it again. Runs must
// have the same cases in the same order. Why: on a noisy machine one run's median ratio
// moves by a few percent from run to run (the A/A control shows how much); pooling the
// pairs of several runs of one build narrows that without changing what is measured.
func Pool(runs []*Result) (*Result, error) {
	if len(runs) == 0 {
		return nil, fmt.Errorf("pooling: no runs")
	}
	first := runs[0]
	out := &Result{
		Schema: first.Schema, Started: first.Started, Finished: first.Finished, Host: first.Host,
		Settings: first.Settings, Target: first.Target, Pooled: len(runs),
	}
	out.Settings.Repeats = 0
	for i, r := range runs {
		if r.Schema != first.Schema {
			return nil, fmt.Errorf("pooling run %d: schema %q, want %q", i+1, r.Schema, first.Schema)
		}
		names := func(r *Result) []string {
			var n []string
			for _, c := range r.Cases {
				n = append(n, c.Name)
			}
			return n
		}
		if !slices.Equal(names(r), names(first)) {
			return nil, fmt.Errorf("pooling run %d: cases %v, want %v", i+1, names(r), names(first))
		}
		if r.Started.Before(out.Started) {
			out.Started = r.Started
		}
		if r.Finished.After(out.Finished) {
			out.Finished = r.Finished
		}
		out.Host.LoadStart = max(out.Host.LoadStart, r.Host.LoadStart)
		out.Host.LoadEnd = max(out.Host.LoadEnd, r.Host.LoadEnd)
		out.Settings.Repeats += r.Settings.Repeats
		out.Errors = append(out.Errors, r.Errors...)
		out.Incomplete = out.Incomplete || r.Incomplete
	}
	for ci, c := range first.Cases {
		pc := CaseResult{Name: c.Name, Description: c.Description, Agent: c.Agent, Control: c.Control, Rules: c.Rules}
		for ri, r := range runs {
			for _, s := range r.Cases[ci].Samples {
				s.Pair += ri * poolPairStride
				pc.Samples = append(pc.Samples, s)
			}
			for _, e := range r.Cases[ci].Errors {
				pc.Errors = append(pc.Errors, fmt.Sprintf("run %d: %s", ri+1, e))
			}
		}
		out.Cases = append(out.Cases, pc)
	}
	summarize(out.Cases)
	return out, nil
}

package suggest

import (
	"fmt"
	"slices"
	"strings"
)

// maxSearchKeys bounds the exhaustive search for a smallest selector: with more candidate
// keys than this (rare: workloads carry a handful of labels), subsets of up to
// maxSearchSize keys are tried and then all of them.
const (
	maxSearchKeys = 12
	maxSearchSize = 3
)

// orderKeys sorts label keys as selectors should prefer them: preferredKeys first, in
// their order, then the rest alphabetically.
func orderKeys(keys []string) []string {
	out := slices.Clone(keys)
	rank := func(k string) int {
		if i := slices.Index(preferredKeys, k); i >= 0 {
			return i
		}
		return len(preferredKeys)
	}
	slices.SortFunc(out, func(a, b string) int {
		if ra, rb := rank(a), rank(b); ra != rb {
			return ra - rb
		}
		return strings.Compare(a, b)
	})
	return out
}

// matches reports whether labels l have every key=value of sel.
func matches(l, sel map[string]string) bool {
	for k, v := range sel {
		if lv, ok := l[k]; !ok || lv != v {
			return false
		}
	}
	return true
}

// smallest returns the smallest subset of cands that selects, among universe, only
// endpoints in targets (by key); ok is false when even cands selects another one.
// Among subsets of one size, the first in preferredKeys order wins. The empty selector is
// tried only when there is no candidate: a selector that names the workload keeps
// selecting it alone when other workloads come to its namespace, the empty one does not.
func smallest(cands map[string]string, targets map[string]bool, universe []Endpoint) (map[string]string, bool) {
	exact := func(sel map[string]string) bool {
		for _, e := range universe {
			if matches(e.Labels, sel) && !targets[e.Key()] {
				return false
			}
		}
		return true
	}
	keys := orderKeys(sortedKeys(cands))
	limit := len(keys)
	if limit > maxSearchKeys {
		limit = maxSearchSize
	}
	first := 1
	if len(keys) == 0 {
		first = 0
	}
	for size := first; size <= limit; size++ {
		var found map[string]string
		combinations(len(keys), size, func(idx []int) bool {
			sel := map[string]string{}
			for _, i := range idx {
				sel[keys[i]] = cands[keys[i]]
			}
			if exact(sel) {
				found = sel
				return true
			}
			return false
		})
		if found != nil {
			return found, true
		}
	}
	if exact(cands) {
		return cands, true
	}
	return nil, false
}

// combinations calls fn with each k-subset of 0..n-1 in lexicographic order until fn
// returns true.
func combinations(n, k int, fn func([]int) bool) {
	idx := make([]int, k)
	var rec func(start, depth int) bool
	rec = func(start, depth int) bool {
		if depth == k {
			return fn(idx)
		}
		for i := start; i <= n-(k-depth); i++ {
			idx[depth] = i
			if rec(i+1, depth+1) {
				return true
			}
		}
		return false
	}
	rec(0, 0)
}

// common are the stable labels all of ws share (same value).
func common(ws []*workload) map[string]string {
	out := map[string]string{}
	for k, v := range ws[0].stable {
		out[k] = v
	}
	for _, w := range ws[1:] {
		for k, v := range out {
			if w.stable[k] != v {
				delete(out, k)
			}
		}
	}
	return out
}

// inNamespace returns the endpoints of namespace ns.
func (s *state) inNamespace(ns string) []Endpoint {
	var out []Endpoint
	for _, k := range sortedKeys(s.endpoints) {
		if e := s.endpoints[k]; e.Namespace == ns {
			out = append(out, e)
		}
	}
	return out
}

// targets are the endpoint keys of ws.
func targets(ws []*workload) map[string]bool {
	out := map[string]bool{}
	for _, w := range ws {
		for _, n := range w.endpoints {
			out[w.ns+"/"+n] = true
		}
	}
	return out
}

// subjectSelector is the selector of the endpoints a policy applies to: workload w. note
// is set when no label set selects w alone (then its stable labels select others too).
func (s *state) subjectSelector(w *workload) (map[string]string, string) {
	if sel, ok := smallest(w.stable, targets([]*workload{w}), s.inNamespace(w.ns)); ok {
		return sel, ""
	}
	var others []string
	for _, e := range s.inNamespace(w.ns) {
		if matches(e.Labels, w.stable) && s.byEp[e.Key()] != w {
			others = append(others, e.Key())
		}
	}
	return w.stable, fmt.Sprintf("the selector %s of %s's policies also selects %s (no label set tells them apart)",
		labelString(w.stable), strings.Join(w.endpoints, ","), strings.Join(others, ", "))
}

// peerSelectors are selectors (within namespace ns) for the workloads ws, all of ns:
// one for all of them if their common labels can select exactly them, else one per
// workload, else one per endpoint with all its labels. notes say where even that selects
// endpoints not seen.
func (s *state) peerSelectors(ns string, ws []*workload) ([]map[string]string, []string) {
	universe := s.inNamespace(ns)
	if sel, ok := smallest(common(ws), targets(ws), universe); ok {
		return []map[string]string{sel}, nil
	}
	if len(ws) > 1 {
		var out []map[string]string
		var notes []string
		for _, w := range ws {
			sels, n := s.peerSelectors(ns, []*workload{w})
			out = append(out, sels...)
			notes = append(notes, n...)
		}
		return out, notes
	}
	// One workload whose stable labels are a subset of another's: select its endpoints by
	// all their labels, per-pod ones included.
	var out []map[string]string
	var notes []string
	for _, n := range ws[0].endpoints {
		e := s.endpoints[ns+"/"+n]
		if sel, ok := smallest(e.Labels, map[string]bool{e.Key(): true}, universe); ok {
			out = append(out, sel)
			continue
		}
		out = append(out, e.Labels)
		notes = append(notes, fmt.Sprintf("peer %s is selected by all its labels (%s), which select other endpoints too", e.Key(), labelString(e.Labels)))
	}
	return out, notes
}

package agent

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"time"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/cidrtable"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

// CIDR sets in the agent (docs/cidrsets.md):
//
//   - A set has a name (a CiliumCIDRGroup's, or the one given to `rampart cidrset`), a
//     dataplane index 0..31 that stays the same for the set's life (policy entries name
//     the set by identity.CIDRSet(index)), and its prefixes, kept sorted and distinct in
//     the compact form api.PrefixList. Each set is a file in the state directory.
//   - Order of a change, so that no step opens what old and new state both block: new and
//     changed set contents go to the dataplane first (one rebuild of all sets aside and a
//     switch, ReplaceCIDRSets), then the policy state that may name new sets, then sets
//     that went away are emptied (a second switch), then the files and the state file.
//     A failure puts the previous sets and policy state back.
//   - add/remove change one set in place (AddCIDRs/RemoveCIDRs): the dataplane keeps the
//     sets' prefixes too, so a removal leaves addresses that another prefix of the set
//     still covers listed. If the dataplane refuses an in-place change (a full host table)
//     the tables are rebuilt instead.

// CIDRSets are the CIDR set tables.
type CIDRSets interface {
	// ReplaceCIDRSets makes the tables hold exactly sets (index -> prefixes; sets absent are
	// emptied): the new tables are built aside and switched to at once.
	ReplaceCIDRSets(sets map[uint8][]netip.Prefix) (cidrtable.Stats, error)
	// AddCIDRs and RemoveCIDRs change one set in the live tables. Adding never unlists
	// anything; removing clears the set's bit for every address of the prefixes.
	AddCIDRs(index uint8, prefixes []netip.Prefix) error
	RemoveCIDRs(index uint8, prefixes []netip.Prefix) error
	// CIDRSetMembership returns the set mask the dataplane computes for addr.
	CIDRSetMembership(addr netip.Addr) (uint32, error)
}

const maxCIDRSets = identity.MaxCIDRSets

// datapathSets converts the model's sets to what CIDRSets.ReplaceCIDRSets takes.
func datapathSets(sets map[string]*cidrSet) map[uint8][]netip.Prefix {
	out := make(map[uint8][]netip.Prefix, len(sets))
	for _, s := range sets {
		out[s.meta.Index] = s.prefixes.Prefixes()
	}
	return out
}

// setIndexes maps set names to indexes, for mapstate.Input.CIDRSets.
func setIndexes(sets map[string]*cidrSet) map[string]uint8 {
	out := make(map[string]uint8, len(sets))
	for name, s := range sets {
		out[name] = s.meta.Index
	}
	return out
}

// freeIndex returns the lowest index no set of either map uses.
func freeIndex(a, b map[string]*cidrSet) (uint8, bool) {
	used := map[uint8]bool{}
	for _, s := range a {
		used[s.meta.Index] = true
	}
	for _, s := range b {
		used[s.meta.Index] = true
	}
	for i := range uint8(maxCIDRSets) {
		if !used[i] {
			return i, true
		}
	}
	return 0, false
}

// referencedBy lists the policies of m that name group, as Kind/namespace/name.
func referencedBy(m *model, group string) []string {
	var out []string
	for _, key := range sortedKeys(m.policies) {
		sp := m.policies[key]
		if slices.Contains(policyGroups(sp.pol), group) {
			out = append(out, policyRefString(mapstate.PolicyRef{Kind: sp.pol.Kind, Namespace: sp.pol.Namespace, Name: sp.pol.Name}))
		}
	}
	return out
}

// policyGroups lists the CIDR groups a policy names, sorted and distinct.
func policyGroups(p *policy.Policy) []string {
	var out []string
	for _, r := range p.Rules {
		for _, peer := range r.Peers {
			if peer.Kind == policy.PeerCIDRGroup {
				out = append(out, peer.Group)
			}
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// cidrSetAPI describes a set; full adds the per-length counts.
func (a *Agent) cidrSetAPI(m *model, s *cidrSet, full bool) api.CIDRSet {
	out := api.CIDRSet{
		Name:         s.meta.Name,
		Index:        s.meta.Index,
		Identity:     identity.CIDRSet(s.meta.Index),
		Source:       s.meta.Source,
		LoadedAt:     s.meta.LoadedAt,
		ChangedAt:    s.meta.ChangedAt,
		Prefixes:     s.prefixes.Len(),
		IPv4:         len(s.prefixes.V4),
		IPv6:         len(s.prefixes.V6),
		AgentBytes:   s.agentBytes(),
		ReferencedBy: referencedBy(m, s.meta.Name),
	}
	out.MemoryBytes = out.AgentBytes
	if s.meta.LastLoad != nil {
		out.MemoryBytes += s.meta.LastLoad.DataplaneBytes
	}
	if full {
		out.LastLoad = s.meta.LastLoad
		out.ByLength = map[string]int{}
		var v4 [33]int
		for _, k := range s.prefixes.V4 {
			v4[k&0xff]++
		}
		for bits, n := range v4 {
			if n > 0 {
				out.ByLength[fmt.Sprintf("v4/%d", bits)] = n
			}
		}
		for _, p := range s.prefixes.V6 {
			out.ByLength[fmt.Sprintf("v6/%d", p.Bits())]++
		}
	}
	return out
}

// ListCIDRSets lists the CIDR sets, by name.
func (a *Agent) ListCIDRSets(ctx context.Context) ([]api.CIDRSet, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := []api.CIDRSet{}
	for _, name := range sortedKeys(a.model.cidrsets) {
		out = append(out, a.cidrSetAPI(a.model, a.model.cidrsets[name], false))
	}
	return out, nil
}

// GetCIDRSet describes one CIDR set, with its prefix lengths and last load.
func (a *Agent) GetCIDRSet(ctx context.Context, name string) (api.CIDRSet, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.model.cidrsets[name]
	if !ok {
		return api.CIDRSet{}, api.NotFound("CIDR set %q not found", name)
	}
	return a.cidrSetAPI(a.model, s, true), nil
}

func validSetName(name string) error {
	if !policy.ValidCIDRGroupName(name) {
		return api.BadRequest("CIDR set name %q: want lowercase letters, digits, '-' and '.' (a DNS subdomain, as CiliumCIDRGroup names), at most 253 characters", name)
	}
	return nil
}

// LoadCIDRSet creates a set or replaces its content. The dataplane builds the new tables
// aside and switches to them: there is no moment with neither the old nor the new content.
func (a *Agent) LoadCIDRSet(ctx context.Context, req api.CIDRSetRequest) (api.CIDRSetChange, error) {
	tm := newChangeTiming(req.Received)
	if err := validSetName(req.Name); err != nil {
		return api.CIDRSetChange{}, err
	}
	l := req.Prefixes
	given := l.Len()
	dups := l.Normalize() // before taking the lock: sorting ten million keys takes a while
	source := req.Source
	if source == "" {
		source = "cidrset load"
	}
	tm.sorted = time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	tm.locked = time.Now()
	return a.loadLocked(req.Name, source, &l, api.CIDRSetChange{Given: given, Duplicates: dups}, tm)
}

// loadLocked creates or replaces set name with l (normalised); a.mu held.
func (a *Agent) loadLocked(name, source string, l *api.PrefixList, res api.CIDRSetChange, tm *changeTiming) (api.CIDRSetChange, error) {
	start := tm.start
	old := a.model.cidrsets[name]
	if old != nil && prefixListsEqual(old.prefixes, l) {
		res.Action = "unchanged"
		res.Set = a.cidrSetAPI(a.model, old, true)
		res.Timing = tm.api()
		return res, nil
	}
	set, err := a.newSet(name, old, source, l, start)
	if err != nil {
		return res, err
	}
	if _, err := a.changeSets(start, tm, func(m *model) error {
		m.cidrsets[name] = set
		return nil
	}); err != nil {
		return res, err
	}
	res.Action = "created"
	if old != nil {
		res.Action = "replaced"
		res.Added, res.Removed = diffCounts(old.prefixes, l)
	} else {
		res.Added = l.Len()
	}
	res.Set = a.cidrSetAPI(a.model, a.model.cidrsets[name], true)
	res.Timing = tm.api()
	a.log.Info("CIDR set loaded", "set", name, "prefixes", l.Len(), "action", res.Action, "took", time.Since(start))
	return res, nil
}

// newSet makes the record of a set's new content (a.mu held): the old set's index, or a
// free one.
func (a *Agent) newSet(name string, old *cidrSet, source string, l *api.PrefixList, now time.Time) (*cidrSet, error) {
	meta := cidrSetMeta{Name: name, Source: source, LoadedAt: now, ChangedAt: now}
	if old != nil {
		meta.Index = old.meta.Index
	} else {
		idx, ok := freeIndex(a.model.cidrsets, nil)
		if !ok {
			return nil, api.Conflict("all %d CIDR sets are in use: delete one first (rampart cidrset delete NAME)", maxCIDRSets)
		}
		meta.Index = idx
	}
	return &cidrSet{meta: meta, prefixes: l}, nil
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// changeTiming records the stages of one set change for api.CIDRSetTiming.
type changeTiming struct {
	// received: the server began reading the request; start: the agent got it decoded;
	// sorted: its prefixes normalised; locked: the agent's lock taken.
	received, start, sorted, locked time.Time
	dataplane, policy, persist      time.Duration
}

func newChangeTiming(received time.Time) *changeTiming {
	now := time.Now()
	if received.IsZero() {
		received = now
	}
	return &changeTiming{received: received, start: now, sorted: now, locked: now}
}

// stage adds the time since t0 to d, one of t's durations.
func (t *changeTiming) stage(d *time.Duration, t0 time.Time) { *d += time.Since(t0) }

func (t *changeTiming) api() *api.CIDRSetTiming {
	return &api.CIDRSetTiming{
		ReceiveMs:   ms(t.start.Sub(t.received)),
		SortMs:      ms(t.sorted.Sub(t.start)),
		WaitMs:      ms(t.locked.Sub(t.sorted)),
		DataplaneMs: ms(t.dataplane),
		PolicyMs:    ms(t.policy),
		PersistMs:   ms(t.persist),
		TotalMs:     ms(time.Since(t.received)),
	}
}

func prefixListsEqual(a, b *api.PrefixList) bool {
	return slices.Equal(a.V4, b.V4) && slices.Equal(a.V6, b.V6)
}

// diffCounts counts the prefixes only in b (added) and only in a (removed); both lists are
// normalised.
func diffCounts(a, b *api.PrefixList) (added, removed int) {
	common := 0
	for i, j := 0, 0; i < len(a.V4) && j < len(b.V4); {
		switch {
		case a.V4[i] == b.V4[j]:
			common++
			i++
			j++
		case a.V4[i] < b.V4[j]:
			i++
		default:
			j++
		}
	}
	for _, p := range b.V6 {
		if a.Contains(p) {
			common++
		}
	}
	return b.Len() - common, a.Len() - common
}

// changeSets runs a change of the model's CIDR sets (and possibly its policies) with
// a.mu held: mutate edits a copy of the model. It returns the cost of the last rebuild of
// the dataplane's set tables (nil when none was needed).
//
// Order: (1) sets whose content is new or changed are loaded (sets being removed stay for
// now, so policies that still name them keep working); (2) the policy state computed from
// the new model is applied (entries of sets that went away are removed, entries of new
// sets added); (3) removed sets are emptied; (4) set files are written or removed and the
// state file saved. Any failure moves the dataplane back to the previous sets and policy
// state.
func (a *Agent) changeSets(start time.Time, tm *changeTiming, mutate func(m *model) error) (*cidrtable.Stats, error) {
	old := a.model
	m := old.clone()
	if err := mutate(m); err != nil {
		return nil, err
	}
	var changed, removed []string
	for name, s := range m.cidrsets {
		if o, ok := old.cidrsets[name]; !ok || o != s && !prefixListsEqual(o.prefixes, s.prefixes) {
			changed = append(changed, name)
		}
	}
	for name := range old.cidrsets {
		if _, ok := m.cidrsets[name]; !ok {
			removed = append(removed, name)
		}
	}
	sort.Strings(changed)
	sort.Strings(removed)

	var stats *cidrtable.Stats
	replace := func(sets map[string]*cidrSet) error {
		defer tm.stage(&tm.dataplane, time.Now())
		st, err := a.dp.ReplaceCIDRSets(datapathSets(sets))
		if err != nil {
			return fmt.Errorf("loading CIDR sets into the dataplane: %w", err)
		}
		stats = &st
		if st.Prefixes >= releaseAfter || totalPrefixes(old.cidrsets) >= releaseAfter {
			a.releaseMemory()
		}
		return nil
	}
	restoreSets := func() {
		if _, err := a.dp.ReplaceCIDRSets(datapathSets(old.cidrsets)); err != nil {
			a.degraded = fmt.Sprintf("restoring the previous CIDR sets failed: %v", err)
			a.log.Error("restoring previous CIDR sets failed", "error", err)
		}
	}

	// (1) new contents in, removed sets still there.
	if len(changed) > 0 {
		grow := maps.Clone(m.cidrsets)
		for _, name := range removed {
			grow[name] = old.cidrsets[name]
		}
		if err := replace(grow); err != nil {
			restoreSets()
			return nil, err
		}
	}
	// (2) policy state.
	policyStart := time.Now()
	alloc, err := cloneAllocator(a.cur.alloc)
	if err != nil {
		restoreSets()
		return nil, err
	}
	d, err := a.eng.compute(m, alloc, a.net.Router(), a.cur)
	if err != nil {
		restoreSets()
		return nil, err
	}
	if err := a.applyState(a.cur, d, m, false); err != nil {
		restoreSets()
		return nil, err
	}
	tm.stage(&tm.policy, policyStart)
	rollback := func() {
		if err := a.applyState(d, a.cur, old, true); err != nil {
			a.log.Error("rolling back policy state", "error", err)
		}
		restoreSets()
	}
	// (3) removed sets out.
	if len(removed) > 0 {
		if err := replace(m.cidrsets); err != nil {
			rollback()
			return nil, err
		}
	}
	// (4) files, then the state file. Changed sets are records of this change, not yet
	// shared with any model, so they can take the load statistics.
	defer tm.stage(&tm.persist, time.Now())
	if stats != nil {
		load := loadStats(stats, start)
		for _, name := range changed {
			m.cidrsets[name].meta.LastLoad = load
		}
	}
	for _, name := range changed {
		if err := a.sets.write(m.cidrsets[name]); err != nil {
			a.restoreSetFiles(old, changed)
			rollback()
			return nil, fmt.Errorf("persisting CIDR set: %w", err)
		}
	}
	if err := a.persist(m, d); err != nil {
		a.restoreSetFiles(old, changed)
		rollback()
		return nil, err
	}
	for _, name := range removed {
		if err := a.sets.remove(name); err != nil {
			// The set is gone from the dataplane and the model; a file left behind would
			// bring it back at the next start, with its old index.
			a.log.Error("removing CIDR set file", "set", name, "error", err)
			a.degraded = fmt.Sprintf("CIDR set %s was deleted but its file could not be removed: %v", name, err)
		}
	}
	a.model, a.cur = m, d
	a.publishView()
	return stats, nil
}

// restoreSetFiles puts back the files of sets a failed change had rewritten.
func (a *Agent) restoreSetFiles(old *model, changed []string) {
	for _, name := range changed {
		var err error
		if s, ok := old.cidrsets[name]; ok {
			err = a.sets.write(s)
		} else {
			err = a.sets.remove(name)
		}
		if err != nil {
			a.log.Error("restoring CIDR set file", "set", name, "error", err)
		}
	}
}

// AddCIDRs adds prefixes to a set in place: the dataplane sets the set's bit for them in
// its live tables, so listed addresses are enforced as soon as the call returns and
// nothing else changes. A set that does not exist is created (a full load).
func (a *Agent) AddCIDRs(ctx context.Context, req api.CIDRSetRequest) (api.CIDRSetChange, error) {
	tm := newChangeTiming(req.Received)
	if err := validSetName(req.Name); err != nil {
		return api.CIDRSetChange{}, err
	}
	l := req.Prefixes
	given := l.Len()
	dups := l.Normalize()
	tm.sorted = time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	tm.locked = time.Now()
	old, ok := a.model.cidrsets[req.Name]
	if !ok {
		source := req.Source
		if source == "" {
			source = "cidrset add"
		}
		return a.loadLocked(req.Name, source, &l, api.CIDRSetChange{Given: given, Duplicates: dups}, tm)
	}
	res := api.CIDRSetChange{Given: given, Duplicates: dups, InPlace: true}
	var fresh api.PrefixList
	for _, k := range l.V4 {
		if _, found := slices.BinarySearch(old.prefixes.V4, k); !found {
			fresh.V4 = append(fresh.V4, k)
		}
	}
	for _, p := range l.V6 {
		if !old.prefixes.Contains(p) {
			fresh.V6 = append(fresh.V6, p)
		}
	}
	res.Duplicates += l.Len() - fresh.Len()
	if fresh.Len() == 0 {
		res.Action = "unchanged"
		res.Set = a.cidrSetAPI(a.model, old, true)
		return res, nil
	}
	merged := mergeLists(old.prefixes, &fresh)
	inPlace := time.Now()
	if err := a.dp.AddCIDRs(old.meta.Index, fresh.Prefixes()); err != nil {
		// The table may be full: a rebuild sizes it anew.
		a.log.Warn("adding to CIDR set in place failed, rebuilding", "set", req.Name, "error", err)
		res.InPlace = false
	}
	tm.stage(&tm.dataplane, inPlace)
	res.Added = fresh.Len()
	return a.finishInPlace(req.Name, old, merged, &fresh, &api.PrefixList{}, res, tm)
}

// RemoveCIDRs removes prefixes from a set in place. Addresses that another prefix of the
// set still covers stay listed (the dataplane recomputes them from the set's remaining
// prefixes).
func (a *Agent) RemoveCIDRs(ctx context.Context, req api.CIDRSetRequest) (api.CIDRSetChange, error) {
	tm := newChangeTiming(req.Received)
	l := req.Prefixes
	given := l.Len()
	dups := l.Normalize() // before taking the lock
	tm.sorted = time.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	tm.locked = time.Now()
	old, ok := a.model.cidrsets[req.Name]
	if !ok {
		return api.CIDRSetChange{}, api.NotFound("CIDR set %q not found", req.Name)
	}
	res := api.CIDRSetChange{Given: given, Duplicates: dups, InPlace: true}
	var gone api.PrefixList
	for _, k := range l.V4 {
		if _, found := slices.BinarySearch(old.prefixes.V4, k); found {
			gone.V4 = append(gone.V4, k)
		}
	}
	for _, p := range l.V6 {
		if old.prefixes.Contains(p) {
			gone.V6 = append(gone.V6, p)
		}
	}
	res.NotFound = l.Len() - gone.Len()
	if gone.Len() == 0 {
		res.Action = "unchanged"
		res.Set = a.cidrSetAPI(a.model, old, true)
		return res, nil
	}
	rest := subtractLists(old.prefixes, &gone)
	inPlace := time.Now()
	if err := a.dp.RemoveCIDRs(old.meta.Index, gone.Prefixes()); err != nil {
		a.log.Warn("removing from CIDR set in place failed, rebuilding", "set", req.Name, "error", err)
		res.InPlace = false
	}
	tm.stage(&tm.dataplane, inPlace)
	res.Removed = gone.Len()
	return a.finishInPlace(req.Name, old, rest, &api.PrefixList{}, &gone, res, tm)
}

// finishInPlace completes an add or remove (a.mu held): a rebuild if the in-place update
// was not possible, then the set's journal (a few bytes, not the whole set). If that
// cannot be written the set's previous content is put back into the dataplane.
func (a *Agent) finishInPlace(name string, old *cidrSet, content, added, removed *api.PrefixList, res api.CIDRSetChange, tm *changeTiming) (api.CIDRSetChange, error) {
	start := tm.start
	now := time.Now()
	ns := &cidrSet{meta: old.meta, prefixes: content}
	ns.meta.ChangedAt = now
	ns.meta.Source = old.meta.Source
	if res.InPlace {
		ns.meta.Source = appendSource(old.meta.Source)
	}
	m := a.model.clone()
	m.cidrsets[name] = ns
	if !res.InPlace {
		rebuild := time.Now()
		st, err := a.dp.ReplaceCIDRSets(datapathSets(m.cidrsets))
		tm.stage(&tm.dataplane, rebuild)
		if err != nil {
			if _, rerr := a.dp.ReplaceCIDRSets(datapathSets(a.model.cidrsets)); rerr != nil {
				a.degraded = fmt.Sprintf("restoring CIDR set %s failed: %v", name, rerr)
			}
			return api.CIDRSetChange{}, fmt.Errorf("loading CIDR sets into the dataplane: %w", err)
		}
		ns.meta.LastLoad = loadStats(&st, start)
	}
	persist := time.Now()
	if err := a.sets.appendChange(ns, added, removed); err != nil {
		if _, rerr := a.dp.ReplaceCIDRSets(datapathSets(a.model.cidrsets)); rerr != nil {
			a.degraded = fmt.Sprintf("restoring CIDR set %s failed: %v", name, rerr)
		}
		return api.CIDRSetChange{}, fmt.Errorf("persisting CIDR set: %w", err)
	}
	tm.stage(&tm.persist, persist)
	a.model = m
	res.Action = "changed"
	// Without the per-length counts: a pass over ten million prefixes is not needed to
	// answer an add.
	res.Set = a.cidrSetAPI(m, ns, false)
	res.Timing = tm.api()
	a.log.Info("CIDR set changed", "set", name, "added", res.Added, "removed", res.Removed, "inPlace", res.InPlace, "took", time.Since(start))
	return res, nil
}

func loadStats(st *cidrtable.Stats, start time.Time) *api.CIDRSetLoad {
	load := &api.CIDRSetLoad{
		TotalPrefixes:  st.Prefixes,
		HostEntries:    st.HostEntries,
		DataplaneBytes: st.MemoryBytes,
		KernelBytes:    st.KernelBytes,
		BuildMs:        ms(st.Build),
		WriteMs:        ms(st.Write),
		TotalMs:        ms(time.Since(start)),
	}
	if st.Prefixes > 0 {
		load.BytesPerPrefix = float64(st.MemoryBytes) / float64(st.Prefixes)
		load.KernelBytesPerPrefix = float64(st.KernelBytes) / float64(st.Prefixes)
	}
	load.AgentMs = max(0, load.TotalMs-load.BuildMs-load.WriteMs)
	return load
}

// appendSource notes in-place changes after the source of the last load.
func appendSource(s string) string {
	const suffix = " (+ cidrset add/remove)"
	if len(s) >= len(suffix) && s[len(s)-len(suffix):] == suffix {
		return s
	}
	return s + suffix
}

// mergeLists returns a ∪ b; both normalised. The IPv4 keys are merged in
// one pass (re-sorting ten million keys would cost half a second per add).
func mergeLists(a, b *api.PrefixList) *api.PrefixList {
	out := &api.PrefixList{V4: make([]uint64, 0, len(a.V4)+len(b.V4)), V6: slices.Concat(a.V6, b.V6)}
	i, j := 0, 0
	for i < len(a.V4) && j < len(b.V4) {
		switch {
		case a.V4[i] < b.V4[j]:
			out.V4 = append(out.V4, a.V4[i])
			i++
		case a.V4[i] > b.V4[j]:
			out.V4 = append(out.V4, b.V4[j])
			j++
		default:
			out.V4 = append(out.V4, a.V4[i])
			i++
			j++
		}
	}
	out.V4 = append(append(out.V4, a.V4[i:]...), b.V4[j:]...)
	slices.SortFunc(out.V6, func(x, y netip.Prefix) int {
		if c := x.Addr().Compare(y.Addr()); c != 0 {
			return c
		}
		return x.Bits() - y.Bits()
	})
	out.V6 = slices.Compact(out.V6)
	return out
}

// subtractLists returns a \ b; b ⊆ a, both normalised.
func subtractLists(a, b *api.PrefixList) *api.PrefixList {
	out := &api.PrefixList{V4: make([]uint64, 0, len(a.V4)-len(b.V4))}
	j := 0
	for _, k := range a.V4 {
		for j < len(b.V4) && b.V4[j] < k {
			j++
		}
		if j < len(b.V4) && b.V4[j] == k {
			continue
		}
		out.V4 = append(out.V4, k)
	}
	for _, p := range a.V6 {
		if !b.Contains(p) {
			out.V6 = append(out.V6, p)
		}
	}
	return out
}

// DeleteCIDRSet deletes a set. While policies name it, only with force: those peers then
// select nothing (an egressDeny of the set stops blocking).
func (a *Agent) DeleteCIDRSet(ctx context.Context, name string, force bool) (api.CIDRSetChange, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	s, ok := a.model.cidrsets[name]
	if !ok {
		return api.CIDRSetChange{}, api.NotFound("CIDR set %q not found", name)
	}
	if refs := referencedBy(a.model, name); len(refs) > 0 && !force {
		return api.CIDRSetChange{}, api.Conflict("CIDR set %q is named by %v: delete those policies first, or use --force (their cidrGroupRef peers then select nothing)", name, refs)
	}
	res := api.CIDRSetChange{Action: "deleted", Removed: s.prefixes.Len(), Set: a.cidrSetAPI(a.model, s, false)}
	if _, err := a.changeSets(time.Now(), &changeTiming{}, func(m *model) error {
		delete(m.cidrsets, name)
		return nil
	}); err != nil {
		return api.CIDRSetChange{}, err
	}
	a.log.Info("CIDR set deleted", "set", name)
	return res, nil
}

// groupSet turns a CiliumCIDRGroup into set content.
func groupSet(g *policy.CIDRGroup) *api.PrefixList {
	l := &api.PrefixList{}
	for _, p := range g.CIDRs {
		l.Add(p)
	}
	l.Normalize()
	return l
}

// membership returns the CIDR set mask of an address for trace: the dataplane's answer,
// which decides packets, or the agent's own when the dataplane cannot say. A disagreement
// is reported.
func (a *Agent) membership(sets map[string]*cidrSet) (func(netip.Addr) uint32, *string) {
	var note string
	fn := func(addr netip.Addr) uint32 {
		mine := agentMembership(sets, addr)
		dp, err := a.dp.CIDRSetMembership(addr)
		if err != nil {
			return mine
		}
		if dp != mine && note == "" {
			note = fmt.Sprintf("the dataplane's CIDR set membership of %v (%#x) differs from the agent's sets (%#x); the dataplane's decides", addr, dp, mine)
		}
		return dp
	}
	return fn, &note
}

// agentMembership computes an address's set mask from the sets' prefixes.
func agentMembership(sets map[string]*cidrSet, addr netip.Addr) uint32 {
	addr = addr.Unmap()
	var mask uint32
	for _, s := range sets {
		for bits := 0; bits <= addr.BitLen(); bits++ {
			p, err := addr.Prefix(bits)
			if err == nil && s.prefixes.Contains(p) {
				mask |= 1 << s.meta.Index
				break
			}
		}
	}
	return mask
}

package identity

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/rampartnet/rampart/internal/labels"
)

// lastEndpoint and lastCIDR bound the two allocation ranges. CIDR identities stay below
// FirstCIDRSet, so they never take a CIDR set's fixed identity, and so below
// EndpointCIDRFlag: flagging one never collides with another identity.
const (
	lastEndpoint Identity = FirstCIDR - 1
	lastCIDR     Identity = FirstCIDRSet - 1
)

// Allocator hands out identity numbers for endpoint label sets and CIDR prefixes.
//
// Numbers are stable: the same label set (or prefix) keeps its number for as long as it is
// allocated, and the state can be saved (MarshalJSON) and restored (UnmarshalJSON) so numbers
// survive agent restarts. Freed numbers are not handed out again until the allocation cursor
// has gone round its whole range, so a number that was recently in the dataplane (policy keys,
// ipcache, flow events in flight) is not given a different meaning soon after.
//
// The zero value is ready to use. An Allocator is safe for concurrent use.
type Allocator struct {
	mu sync.Mutex

	byLabels map[string]Identity
	labels   map[Identity]labels.Labels
	byPrefix map[netip.Prefix]Identity
	prefixes map[Identity]netip.Prefix

	// next* is where the next search for a free number starts; it only moves forward
	// (wrapping at the end of the range).
	nextEndpoint Identity
	nextCIDR     Identity
}

// NewAllocator returns an empty allocator.
func NewAllocator() *Allocator {
	a := &Allocator{}
	a.init()
	return a
}

func (a *Allocator) init() {
	if a.byLabels == nil {
		a.byLabels = map[string]Identity{}
		a.labels = map[Identity]labels.Labels{}
		a.byPrefix = map[netip.Prefix]Identity{}
		a.prefixes = map[Identity]netip.Prefix{}
	}
	if a.nextEndpoint < FirstEndpoint || a.nextEndpoint > lastEndpoint {
		a.nextEndpoint = FirstEndpoint
	}
	if a.nextCIDR < FirstCIDR || a.nextCIDR > lastCIDR {
		a.nextCIDR = FirstCIDR
	}
}

// LabelsKey is an unambiguous encoding of a label set: equal sets, equal keys, and only
// they. ForLabels allocates one identity per key.
func LabelsKey(l labels.Labels) string { return labelsKey(l) }

// labelsKey is an unambiguous encoding of a label set. labels.Labels.String is not: values may
// contain ',' and '=' ("a=b,c=d" could be one label or two).
func labelsKey(l labels.Labels) string {
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		v := l[k]
		b.WriteString(strconv.Itoa(len(k)))
		b.WriteByte(':')
		b.WriteString(k)
		b.WriteString(strconv.Itoa(len(v)))
		b.WriteByte(':')
		b.WriteString(v)
	}
	return b.String()
}

func copyLabels(l labels.Labels) labels.Labels {
	out := make(labels.Labels, len(l))
	for k, v := range l {
		out[k] = v
	}
	return out
}

// ForLabels returns the identity of a full endpoint label set, allocating one (>=
// FirstEndpoint) if the set has none yet. Equal label sets get the same identity.
//
// It panics if every endpoint identity is in use (16.7 million distinct label sets), which
// the agent's endpoint limit makes impossible.
func (a *Allocator) ForLabels(l labels.Labels) Identity {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.init()
	return allocate(a, a.byLabels, a.labels, &a.nextEndpoint, FirstEndpoint, lastEndpoint, labelsKey(l),
		func() labels.Labels { return copyLabels(l) }, "endpoint")
}

// Claim gives label set l the endpoint identity id, which another allocator chose (the
// cluster's, for a pod of any node), so that the identity carried in the overlay means
// the same labels here. What this allocator held before yields: another number of l, and
// another label set's hold on id, are dropped (that label set gets a new number from
// ForLabels if it is still in use). The cluster's allocator is the authority on numbers;
// a mapping made here earlier (a label set seen with its namespace's labels of the time,
// say) must not keep the cluster's mapping out, or the node would never converge. The
// caller checks that one computation does not claim one number for two label sets.
func (a *Allocator) Claim(l labels.Labels, id Identity) error {
	if id < FirstEndpoint || id > lastEndpoint {
		return fmt.Errorf("identity %d is not an endpoint identity (%d-%d)", id, FirstEndpoint, lastEndpoint)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.init()
	key := labelsKey(l)
	if cur, ok := a.byLabels[key]; ok {
		if cur == id {
			return nil
		}
		delete(a.labels, cur)
	}
	if other, ok := a.labels[id]; ok {
		delete(a.byLabels, labelsKey(other))
	}
	a.byLabels[key] = id
	a.labels[id] = copyLabels(l)
	return nil
}

// ForCIDR returns the identity of a prefix (masked first), allocating one (>= FirstCIDR, <
// FirstCIDRSet) if it has none yet.
//
// It panics on an invalid prefix (a caller bug: prefixes come from validated policy) and if
// every CIDR identity is in use.
func (a *Allocator) ForCIDR(p netip.Prefix) Identity {
	if !p.IsValid() {
		panic(fmt.Sprintf("identity: ForCIDR on invalid prefix %v", p))
	}
	p = canonicalPrefix(p)
	a.mu.Lock()
	defer a.mu.Unlock()
	a.init()
	return allocate(a, a.byPrefix, a.prefixes, &a.nextCIDR, FirstCIDR, lastCIDR, p,
		func() netip.Prefix { return p }, "CIDR")
}

// allocate returns the identity byKey has for key, or gives key the first free identity of
// [first, last] from *cursor on, with the value v makes recorded for it in byID; what
// names the range in the panic when every identity of it is in use. The caller holds
// a.mu, after init.
func allocate[K comparable, V any](a *Allocator, byKey map[K]Identity, byID map[Identity]V, cursor *Identity, first, last Identity, key K, v func() V, what string) Identity {
	if id, ok := byKey[key]; ok {
		return id
	}
	id, ok := a.findFree(cursor, first, last, func(id Identity) bool {
		_, used := byID[id]
		return used
	})
	if !ok {
		panic("identity: " + what + " identity range exhausted")
	}
	byKey[key] = id
	byID[id] = v()
	return id
}

// canonicalPrefix masks p and unmaps IPv4-mapped IPv6 prefixes, so one network has one key.
func canonicalPrefix(p netip.Prefix) netip.Prefix {
	if p.Addr().Is4In6() && p.Bits() >= 96 {
		p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
	}
	return p.Masked()
}

// findFree returns the first number at or after *cursor (wrapping within [first, last]) for
// which used is false, and moves the cursor past it.
func (a *Allocator) findFree(cursor *Identity, first, last Identity, used func(Identity) bool) (Identity, bool) {
	id := *cursor
	for n := uint64(0); n <= uint64(last-first); n++ {
		if !used(id) {
			if id == last {
				*cursor = first
			} else {
				*cursor = id + 1
			}
			return id, true
		}
		if id == last {
			id = first
		} else {
			id++
		}
	}
	return 0, false
}

// Labels returns the label set of an endpoint identity, or for a reserved identity the single
// label "reserved:<name>" (as Cilium shows it). ok is false for unknown identities.
func (a *Allocator) Labels(id Identity) (labels.Labels, bool) {
	if name, ok := ReservedNames[id]; ok {
		return labels.Labels{name: ""}, true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	l, ok := a.labels[id]
	if !ok {
		return nil, false
	}
	return copyLabels(l), true
}

// Prefix returns the prefix of a CIDR identity. The EndpointCIDRFlag bit is ignored, so a
// secondary identity maps to its prefix too.
func (a *Allocator) Prefix(id Identity) (netip.Prefix, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	p, ok := a.prefixes[id&^EndpointCIDRFlag]
	return p, ok
}

// Retain frees every endpoint identity whose label set is not in usedLabelSets and every CIDR
// identity whose prefix is not in usedPrefixes. It returns the freed identities in increasing
// order. Freed numbers are not reused before the allocation cursor wraps (see Allocator).
func (a *Allocator) Retain(usedLabelSets []labels.Labels, usedPrefixes []netip.Prefix) []Identity {
	keepLabels := make(map[string]bool, len(usedLabelSets))
	for _, l := range usedLabelSets {
		keepLabels[labelsKey(l)] = true
	}
	keepPrefixes := make(map[netip.Prefix]bool, len(usedPrefixes))
	for _, p := range usedPrefixes {
		if p.IsValid() {
			keepPrefixes[canonicalPrefix(p)] = true
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.init()
	var freed []Identity
	for key, id := range a.byLabels {
		if !keepLabels[key] {
			delete(a.byLabels, key)
			delete(a.labels, id)
			freed = append(freed, id)
		}
	}
	for p, id := range a.byPrefix {
		if !keepPrefixes[p] {
			delete(a.byPrefix, p)
			delete(a.prefixes, id)
			freed = append(freed, id)
		}
	}
	sort.Slice(freed, func(i, j int) bool { return freed[i] < freed[j] })
	return freed
}

// Entry is one allocated identity, as listed by List.
type Entry struct {
	Identity Identity
	Labels   labels.Labels // endpoint identities
	Prefix   netip.Prefix  // CIDR identities
}

// List returns every allocated (non-reserved) identity in increasing order.
func (a *Allocator) List() []Entry {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := make([]Entry, 0, len(a.labels)+len(a.prefixes))
	for id, l := range a.labels {
		out = append(out, Entry{Identity: id, Labels: copyLabels(l)})
	}
	for id, p := range a.prefixes {
		out = append(out, Entry{Identity: id, Prefix: p})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Identity < out[j].Identity })
	return out
}

// allocatorJSON is the persisted form. Cursors are saved so that numbers freed before a
// restart are not reused right after it.
type allocatorJSON struct {
	NextEndpoint Identity        `json:"nextEndpoint"`
	NextCIDR     Identity        `json:"nextCIDR"`
	Endpoints    []endpointJSON  `json:"endpoints"`
	CIDRs        []cidrEntryJSON `json:"cidrs"`
}

// Clone returns an independent copy of the allocator: what MarshalJSON and UnmarshalJSON
// would give, without encoding every allocation (the agent copies the allocator for every
// change it computes).
func (a *Allocator) Clone() *Allocator {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.init()
	c := &Allocator{
		byLabels:     maps.Clone(a.byLabels),
		labels:       make(map[Identity]labels.Labels, len(a.labels)),
		byPrefix:     maps.Clone(a.byPrefix),
		prefixes:     maps.Clone(a.prefixes),
		nextEndpoint: a.nextEndpoint,
		nextCIDR:     a.nextCIDR,
	}
	for id, l := range a.labels {
		c.labels[id] = copyLabels(l)
	}
	return c
}

type endpointJSON struct {
	Identity Identity      `json:"identity"`
	Labels   labels.Labels `json:"labels"`
}

type cidrEntryJSON struct {
	Identity Identity     `json:"identity"`
	Prefix   netip.Prefix `json:"prefix"`
}

// MarshalJSON saves the allocator's state (allocations and cursors), sorted by identity so
// the output is deterministic.
func (a *Allocator) MarshalJSON() ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.init()
	s := allocatorJSON{
		NextEndpoint: a.nextEndpoint,
		NextCIDR:     a.nextCIDR,
		Endpoints:    make([]endpointJSON, 0, len(a.labels)),
		CIDRs:        make([]cidrEntryJSON, 0, len(a.prefixes)),
	}
	for id, l := range a.labels {
		s.Endpoints = append(s.Endpoints, endpointJSON{Identity: id, Labels: l})
	}
	for id, p := range a.prefixes {
		s.CIDRs = append(s.CIDRs, cidrEntryJSON{Identity: id, Prefix: p})
	}
	sort.Slice(s.Endpoints, func(i, j int) bool { return s.Endpoints[i].Identity < s.Endpoints[j].Identity })
	sort.Slice(s.CIDRs, func(i, j int) bool { return s.CIDRs[i].Identity < s.CIDRs[j].Identity })
	return json.Marshal(s)
}

// UnmarshalJSON replaces the allocator's state with a saved one. It rejects states that
// would break the allocator's guarantees (numbers out of range, one number or one label set
// or prefix allocated twice), leaving the allocator unchanged.
func (a *Allocator) UnmarshalJSON(data []byte) error {
	var s allocatorJSON
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("decoding identity state: %w", err)
	}
	byLabels := map[string]Identity{}
	lbls := map[Identity]labels.Labels{}
	byPrefix := map[netip.Prefix]Identity{}
	prefixes := map[Identity]netip.Prefix{}
	for _, e := range s.Endpoints {
		if e.Identity < FirstEndpoint || e.Identity > lastEndpoint {
			return fmt.Errorf("decoding identity state: endpoint identity %d out of range %d..%d", e.Identity, FirstEndpoint, lastEndpoint)
		}
		if _, dup := lbls[e.Identity]; dup {
			return fmt.Errorf("decoding identity state: identity %d allocated twice", e.Identity)
		}
		key := labelsKey(e.Labels)
		if other, dup := byLabels[key]; dup {
			return fmt.Errorf("decoding identity state: labels %q have identities %d and %d", e.Labels.String(), other, e.Identity)
		}
		byLabels[key] = e.Identity
		lbls[e.Identity] = copyLabels(e.Labels)
	}
	for _, e := range s.CIDRs {
		if e.Identity < FirstCIDR || e.Identity > lastCIDR {
			return fmt.Errorf("decoding identity state: CIDR identity %d out of range %d..%d", e.Identity, FirstCIDR, lastCIDR)
		}
		if !e.Prefix.IsValid() {
			return fmt.Errorf("decoding identity state: CIDR identity %d has no valid prefix", e.Identity)
		}
		p := canonicalPrefix(e.Prefix)
		if p != e.Prefix {
			return fmt.Errorf("decoding identity state: prefix %v of identity %d is not canonical (want %v)", e.Prefix, e.Identity, p)
		}
		if _, dup := prefixes[e.Identity]; dup {
			return fmt.Errorf("decoding identity state: identity %d allocated twice", e.Identity)
		}
		if other, dup := byPrefix[p]; dup {
			return fmt.Errorf("decoding identity state: prefix %v has identities %d and %d", p, other, e.Identity)
		}
		byPrefix[p] = e.Identity
		prefixes[e.Identity] = p
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.byLabels, a.labels, a.byPrefix, a.prefixes = byLabels, lbls, byPrefix, prefixes
	a.nextEndpoint, a.nextCIDR = s.NextEndpoint, s.NextCIDR
	a.init() // puts cursors missing from old or hand-written states back into range
	return nil
}

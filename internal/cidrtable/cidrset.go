package cidrtable

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"slices"
	"structs"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// CIDR set sizes. A bank's top table is 2^24 rows of 4 bytes (64 MiB), created only when
// some set has a prefix of /24 or shorter; its host table has 8 bytes per slot, about two
// slots per address of the /25../32 prefixes, created only when there are some. Only while
// a reload builds the new bank beside the active one are there two of each.
const (
	// DefaultHostSlots is the default bound on a host table's size (Open's hostSlots):
	// MaxHostSlots, 1 GiB, about 67M addresses.
	DefaultHostSlots = MaxHostSlots
	// MaxHostSlots bounds Open's hostSlots (1 GiB per table); the builder's sort key needs
	// the slot number to fit 27 bits.
	MaxHostSlots = 1 << 27
	// MinHostSlots is the smallest host table (CIDR_HOST_MIN_SLOTS), and the smallest
	// hostSlots accepted.
	MinHostSlots = 64

	// cidrLoadFactor is the host table fill a rebuild aims for (lower when the table has
	// room): with the sorted (Robin Hood) layout, 10M addresses at 0.5 need at most 13-14
	// probes, far below cidrMaxProbe.
	cidrLoadFactor = 0.5
	// v6NodeBytes estimates the kernel memory of one IPv6 trie entry (node, key, value,
	// and its share of intermediate nodes) for CIDRSetStats.
	v6NodeBytes = 160
	// v6BulkThreshold: in-place IPv6 changes of more prefixes than this recompute the whole
	// trie diff instead of patching entry by entry.
	v6BulkThreshold = 1024
)

// ErrCIDRSetsNotLoaded is returned by AddCIDRs and RemoveCIDRs on Tables opened over
// pinned maps: it does not know the sets' prefixes until ReplaceCIDRSets gives them again
// (the maps keep enforcing the old content meanwhile).
var ErrCIDRSetsNotLoaded = errors.New("CIDR sets not loaded since the tables were opened: call ReplaceCIDRSets first")

// Stats describes the CIDR sets in the dataplane.
type Stats struct {
	Prefixes    int // prefixes in all sets (a prefix listed by two sets counts twice)
	IPv4        int // IPv4 prefixes among them
	IPv6        int // IPv6 prefixes among them
	HostEntries int // distinct addresses in the IPv4 host table (from /25../32 prefixes)
	// MemoryBytes is KernelBytes + UserBytes.
	MemoryBytes uint64
	// Build is the time the last full rebuild spent computing the tables in Go; Write the
	// time it spent writing them (both IPv4 banks' content, the bank switch, the IPv6 trie).
	Build, Write time.Duration

	// HostSlots is the host table size of the active bank, HostCapacity the most slots a
	// host table may have (Open's hostSlots).
	HostSlots, HostCapacity int
	// MaxProbe is the longest probe sequence of the last rebuilt host table (at most 32).
	MaxProbe int
	// KernelBytes: the IPv4 tables (the kernel's memlock of the config and of each table
	// there is: a 64 MiB top table when some set has a prefix of /24 or shorter, a host
	// table of 8 bytes per slot when some set has a longer one) and the IPv6 trie
	// (estimated per entry). UserBytes: the Tables' copy of the prefixes (8 bytes per
	// IPv4 prefix, 32 per IPv6 trie entry).
	KernelBytes, UserBytes uint64
	// TableBytes is the IPv4 tables' part of KernelBytes.
	TableBytes uint64
	// V6Writes is the number of IPv6 trie writes and deletions of the last reload.
	V6Writes int
}

// Maps are the tc object's CIDR set maps (bpf/rampart.c), which the programs read and
// Tables fill; datapath.(*Datapath).CIDRMaps hands them out. Tables do not own them: they
// stay open until the datapath closes, after the Tables.
type Maps struct {
	// Config is cidr4_config: one BPF_F_MMAPABLE element, struct cidr_config.
	Config *ebpf.Map
	// Top and Host are cidr4_top and cidr4_host: the map-in-maps that hold each bank's
	// tables; TopInner and HostInner the layout of the tables they take.
	Top, Host           *ebpf.Map
	TopInner, HostInner *ebpf.MapSpec
	// V6 is cidr6, the IPv6 LPM trie.
	V6 *ebpf.Map
}

// Tables are the CIDR set tables of one dataplane. Their methods are safe for concurrent
// use.
type Tables struct {
	c *cidrState
}

// cidrState is the CIDR set state: the mmapped IPv4 tables and the sets' prefixes
// (needed to recompute rows and addresses when a prefix is removed, and to rebuild).
type cidrState struct {
	mu      sync.Mutex
	cfgMem  []byte // cidr4_config, mapped (nil over Go memory)
	cfgMap  *ebpf.Map
	t       v4Tables
	store   v4Store
	maxHost uint32     // Open's hostSlots: the largest host table a load may have
	m6      *ebpf.Map  // the IPv6 trie, for reads
	w6      trieWriter // the same, for writes
	v6max   int
	// v4[i]: set i's IPv4 prefixes, sorted and unique, encoded by v4enc.
	v4 [cidrSets][]uint64
	v6 v6State
	// loaded: the sets' prefixes are known (a fresh map, or a ReplaceCIDRSets since Open).
	loaded bool
	// flipped: the banks switched and the inactive bank's tables may still be read by
	// program runs that started before; wait for an RCU grace period before freeing them.
	flipped bool
	// stale[b]: freeing bank b's tables failed part way; the store may still hold some.
	stale [2]bool
	last  Stats // timings and probe length of the last rebuild
}

// config is struct cidr_config (bpf/include), as bpf2go writes it for the tc object;
// Open checks its size against the map's value.
type config struct {
	_         structs.HostLayout
	Bank      uint32
	Ready     uint32
	HostSlots [2]uint32
	Seed      [2]uint32
	ZeroMask  [2]uint32
}

// Open maps the CIDR set config and the tables the outer maps hold, and reads their state:
// fresh maps start with empty sets; maps of an earlier run keep enforcing what they hold
// until the next ReplaceCIDRSets gives the sets again. hostSlots bounds a host table's size
// (0: DefaultHostSlots).
func Open(m Maps, hostSlots uint32) (*Tables, error) {
	if hostSlots == 0 {
		hostSlots = DefaultHostSlots
	}
	if hostSlots < MinHostSlots || hostSlots > MaxHostSlots {
		return nil, fmt.Errorf("CIDR host slots %d: out of range %d..%d", hostSlots, MinHostSlots, MaxHostSlots)
	}
	if m.Config == nil || m.Top == nil || m.Host == nil || m.V6 == nil || m.TopInner == nil || m.HostInner == nil {
		return nil, errors.New("opening CIDR set tables: maps missing")
	}
	if got, want := m.Config.ValueSize(), uint32(unsafe.Sizeof(config{})); got != want {
		return nil, fmt.Errorf("opening CIDR set tables: cidr4_config values have %d bytes, want %d", got, want)
	}
	if got, want := m.V6.KeySize(), uint32(unsafe.Sizeof(v6MapKey{})); got != want {
		return nil, fmt.Errorf("opening CIDR set tables: cidr6 keys have %d bytes, want %d", got, want)
	}
	c, err := openCIDR(m, hostSlots)
	if err != nil {
		return nil, err
	}
	return &Tables{c: c}, nil
}

// Close unmaps the tables; later calls fail. The maps and the tables they hold stay, so
// the programs keep enforcing the sets.
func (t *Tables) Close() {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	t.c.close()
}

// openCIDR maps the CIDR set config and the tables the outer maps hold, and reads their
// state. maxHost bounds a host table's size.
func openCIDR(m Maps, maxHost uint32) (*cidrState, error) {
	c := &cidrState{m6: m.V6, w6: m.V6, v6max: int(m.V6.MaxEntries()), maxHost: maxHost, cfgMap: m.Config}
	cfg, err := mmapArray(m.Config)
	if err != nil {
		return nil, err
	}
	c.cfgMem = cfg
	c.t.cfg = (*config)(unsafe.Pointer(&cfg[0]))
	store, err := openMapStore(m.Top, m.Host, m.TopInner, m.HostInner)
	if err != nil {
		c.close()
		return nil, err
	}
	c.store = store
	for b := range uint32(2) {
		if c.t.top[b], c.t.host[b], err = store.tables(b); err != nil {
			c.close()
			return nil, err
		}
	}
	if atomic.LoadUint32(&c.t.cfg.Ready) == 0 {
		// New maps: empty sets, known.
		atomic.StoreUint32(&c.t.cfg.Ready, 1)
		c.loaded, c.v6.known = true, true
		return c, nil
	}
	// Pinned maps of an earlier run: they keep enforcing; the sets come with the next
	// ReplaceCIDRSets. A crash between a switch and the freeing of the old bank leaves
	// tables in the inactive bank: free them once no program run can read them.
	b := c.t.active()
	if size := atomic.LoadUint32(&c.t.cfg.HostSlots[b]); uint64(size) > uint64(len(c.t.host[b])) {
		c.close()
		return nil, fmt.Errorf("CIDR set configuration says %d host slots in bank %d, its table has %d", size, b, len(c.t.host[b]))
	}
	c.flipped = true
	if err := c.freeBank(b ^ 1); err != nil {
		c.close()
		return nil, err
	}
	return c, nil
}

func (c *cidrState) close() {
	if c.store != nil {
		c.store.close()
		c.store = nil
	}
	if c.cfgMem != nil {
		unix.Munmap(c.cfgMem)
		c.cfgMem = nil
	}
	c.t = v4Tables{}
}

// freeBank frees bank b's tables (the inactive bank's), after an RCU grace period if the
// banks switched since the last one.
func (c *cidrState) freeBank(b uint32) error {
	if c.t.top[b] == nil && c.t.host[b] == nil && !c.stale[b] {
		return nil
	}
	if c.flipped {
		rcuGrace()
		c.flipped = false
	}
	atomic.StoreUint32(&c.t.cfg.HostSlots[b], 0)
	c.t.top[b], c.t.host[b] = nil, nil
	if err := c.store.free(b); err != nil {
		c.stale[b] = true // tried again before the bank is used
		return fmt.Errorf("freeing the CIDR tables of bank %d: %w", b, err)
	}
	c.stale[b] = false
	return nil
}

// rcuGrace waits until every program run that may have read the bank switched away from has
// finished: membarrier(MEMBARRIER_CMD_GLOBAL) waits for an RCU grace period, and tc programs
// run inside RCU read-side sections. Without membarrier, a pause far longer than any program
// run does.
func rcuGrace() {
	const membarrierCmdGlobal = 1 // MEMBARRIER_CMD_GLOBAL: synchronize_rcu() on SMP
	if _, _, errno := unix.Syscall(unix.SYS_MEMBARRIER, membarrierCmdGlobal, 0, 0); errno != 0 {
		time.Sleep(50 * time.Millisecond)
	}
}

// splitPrefixes validates and canonicalises prefixes (masked, IPv4-mapped IPv6 as IPv4)
// into sorted, unique IPv4 (v4enc) and IPv6 lists.
func splitPrefixes(ps []netip.Prefix) ([]uint64, []v6key, error) {
	var (
		v4 = make([]uint64, 0, len(ps))
		v6 []v6key
	)
	for _, p := range ps {
		if !p.IsValid() {
			return nil, nil, fmt.Errorf("invalid prefix %v", p)
		}
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		p = p.Masked()
		if p.Addr().Is4() {
			a := p.Addr().As4()
			v4 = append(v4, v4enc(binary.BigEndian.Uint32(a[:]), p.Bits()))
		} else {
			v6 = append(v6, v6of(p))
		}
	}
	if !slices.IsSorted(v4) {
		v4 = radixSort(v4, make([]uint64, len(v4)), 40)
	}
	v4 = slices.Clip(slices.Compact(v4))
	slices.SortFunc(v6, cmpV6)
	v6 = slices.Compact(v6)
	return v4, v6, nil
}

// v4Plan is a host table layout computed before anything is written.
type v4Plan struct {
	keys     []uint64 // sorted hostKeys
	seed     uint32
	size     uint32
	distinct int
	maxProbe int
	zero     uint32
}

func randomSeed() uint32 {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(fmt.Sprintf("reading random bytes: %v", err)) // crypto/rand does not fail on Linux
	}
	return binary.NativeEndian.Uint32(b[:])
}

// cidrPlanSeeds is how many seeds planHost tries before it gives up on a table that is
// full to capacity. Near capacity a seed often fails: 448 addresses in 512 slots failed
// for 785 of 4,000 random seeds (20 %), so four tries refused such a set about once in
// 700 loads (TestCIDRHostOverflow failed in CI that way); sixteen make it about once in
// 10^11. A try costs one pass over the addresses, and only a failed one is repeated.
const cidrPlanSeeds = 16

// planHost chooses a seed and table size for the sets' host addresses: size for
// cidrLoadFactor, grown by a quarter (up to capacity) while some address would land
// cidrMaxProbe or more slots from home, and at capacity a new seed, up to cidrPlanSeeds
// times.
func planHost(sets *[cidrSets][]uint64, capacity uint32) (v4Plan, error) {
	n := countHostKeys(sets)
	keys := make([]uint64, 0, n)
	buf := make([]uint64, n)
	for range cidrPlanSeeds {
		seed := randomSeed()
		var zero uint32
		keys, zero = hostKeys(sets, seed, keys)
		sorted := radixSort(keys, buf, 37)
		p := v4Plan{keys: sorted, seed: seed, zero: zero, distinct: distinctHashes(sorted)}
		if p.distinct == 0 {
			return p, nil
		}
		if uint64(p.distinct) > uint64(capacity) {
			return v4Plan{}, fmt.Errorf("CIDR sets: %d host addresses (from /25../32 prefixes) do not fit the host table of %d slots (agent CIDRHostSlots, rampartd --cidr-host-slots)", p.distinct, capacity)
		}
		size := uint64(float64(p.distinct) / cidrLoadFactor)
		size = min(max(size, MinHostSlots), uint64(capacity))
		for {
			if mp, ok := placeHost(sorted, uint32(size), seed, nil); ok {
				p.size, p.maxProbe = uint32(size), mp
				return p, nil
			}
			if size == uint64(capacity) {
				break
			}
			size = min(size+size/4, uint64(capacity))
		}
	}
	return v4Plan{}, fmt.Errorf("CIDR sets: %d host addresses do not fit the host table of %d slots within %d probes (agent CIDRHostSlots, rampartd --cidr-host-slots)", n, capacity, cidrMaxProbe)
}

// prepareBank creates the inactive bank's tables at the sizes sets and the host plan p
// need (none where they need none) and writes them; commitBank then switches to them. If
// a table cannot be created (the kernel is out of memory, say), the bank is left empty,
// the active bank stays in force, and the error says so.
func (c *cidrState) prepareBank(sets *[cidrSets][]uint64, p v4Plan) error {
	bank := c.t.active() ^ 1
	if err := c.freeBank(bank); err != nil {
		return err
	}
	var (
		top  []uint32
		host []uint64
		err  error
	)
	if needsTop(sets) {
		top, err = c.store.newTop(bank)
	}
	if err == nil && p.size > 0 {
		host, err = c.store.newHost(bank, p.size)
	}
	if err != nil {
		c.stale[bank] = true // a table may have been made before the failure
		if ferr := c.freeBank(bank); ferr != nil {
			err = errors.Join(err, ferr)
		}
		return fmt.Errorf("allocating the new CIDR tables (the previous tables stay in force): %w", err)
	}
	c.t.top[bank], c.t.host[bank] = top, host
	if top != nil {
		buildTop(top, sets)
	}
	if host != nil {
		placeHost(p.keys, p.size, p.seed, host)
	}
	cfg := c.t.cfg
	atomic.StoreUint32(&cfg.Seed[bank], p.seed)
	atomic.StoreUint32(&cfg.HostSlots[bank], p.size)
	atomic.StoreUint32(&cfg.ZeroMask[bank], p.zero)
	return nil
}

// commitBank switches to the bank prepareBank wrote, then frees the old bank's tables once
// no program run can read them any more.
func (c *cidrState) commitBank() {
	old := c.t.active()
	// The switch: one 4-byte store. Program runs that read the old bank number finish on
	// the old bank, which stays intact until an RCU grace period has passed.
	atomic.StoreUint32(&c.t.cfg.Bank, old^1)
	c.flipped = true
	// A failure leaves the old tables installed but unused (flipped stays set): the next
	// rebuild frees them before it creates its own, or fails without switching.
	_ = c.freeBank(old)
}

// rebuildV4 rebuilds the IPv4 tables from c.v4 into the inactive bank and switches.
func (c *cidrState) rebuildV4() error {
	t0 := time.Now()
	p, err := planHost(&c.v4, c.maxHost)
	if err != nil {
		return err
	}
	t1 := time.Now()
	if err := c.prepareBank(&c.v4, p); err != nil {
		return err
	}
	c.commitBank()
	c.last.Build, c.last.Write, c.last.MaxProbe = t1.Sub(t0), time.Since(t1), p.maxProbe
	return nil
}

// ReplaceCIDRSets makes the dataplane's CIDR sets exactly sets (index -> prefixes, IPv4 and
// IPv6, bare addresses as /32 and /128; sets absent from the map are emptied). IPv4 is
// rebuilt into the inactive bank, then the banks switch: the program sees the old sets or
// the new ones, never a mix. IPv6 entries change in an order that keeps every address
// listed by a set before and after listed throughout. On error the old IPv4 content stays
// active.
func (t *Tables) ReplaceCIDRSets(sets map[uint8][]netip.Prefix) (Stats, error) {
	st, err := t.c.replace(sets)
	if err != nil {
		return Stats{}, fmt.Errorf("replacing CIDR sets: %w", err)
	}
	return st, nil
}

func (c *cidrState) replace(sets map[uint8][]netip.Prefix) (Stats, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.t.cfg == nil {
		return Stats{}, errors.New("CIDR set tables closed")
	}

	t0 := time.Now()
	var (
		v4 [cidrSets][]uint64
		v6 [cidrSets][]v6key
	)
	for idx, ps := range sets {
		if idx >= cidrSets {
			return Stats{}, fmt.Errorf("set index %d out of range 0..%d", idx, cidrSets-1)
		}
		var err error
		if v4[idx], v6[idx], err = splitPrefixes(ps); err != nil {
			return Stats{}, fmt.Errorf("set %d: %w", idx, err)
		}
	}
	next6 := buildV6(&v6)
	p, err := planHost(&v4, c.maxHost)
	if err != nil {
		return Stats{}, err
	}
	t1 := time.Now()

	// The new IPv4 tables first: if they cannot be allocated, nothing has changed.
	if err := c.prepareBank(&v4, p); err != nil {
		return Stats{}, err
	}
	if !c.v6.known {
		old, err := readV6(c.m6)
		if err != nil {
			c.freeBank(c.t.active() ^ 1)
			return Stats{}, err
		}
		c.v6.reset(old, false)
	}
	writes, err := writeV6Diff(c.w6, c.v6max, c.v6.entries, next6)
	if err != nil {
		// The trie is between the old and the new sets; read it back next time. The IPv4
		// tables stay as they are.
		c.v6.known, c.loaded = false, false
		c.freeBank(c.t.active() ^ 1)
		return Stats{}, err
	}
	c.v6.reset(next6, true)
	c.commitBank()
	c.v4 = v4
	c.loaded = true
	c.last = Stats{Build: t1.Sub(t0), Write: time.Since(t1), MaxProbe: p.maxProbe, V6Writes: writes}
	return c.usage(), nil
}

// AddCIDRs adds prefixes to set index in place (the active bank and the trie), without a
// rebuild unless an address finds no host table slot within the probe bound, in which case
// the tables are rebuilt and switched as by ReplaceCIDRSets. Prefixes already in the set
// are ignored. Additions never unlist anything. If it fails part way (the rebuild does not
// fit, a trie write fails), the tables may list part of the additions, and AddCIDRs and
// RemoveCIDRs return ErrCIDRSetsNotLoaded until a ReplaceCIDRSets.
func (t *Tables) AddCIDRs(index uint8, prefixes []netip.Prefix) error {
	return t.c.change(index, prefixes, true)
}

// RemoveCIDRs removes prefixes from set index in place. Addresses still covered by another
// prefix of the set stay listed; other sets are untouched. Prefixes not in the set are
// ignored. Removals only unlist.
func (t *Tables) RemoveCIDRs(index uint8, prefixes []netip.Prefix) error {
	return t.c.change(index, prefixes, false)
}

func (c *cidrState) change(index uint8, prefixes []netip.Prefix, add bool) error {
	what := "removing"
	if add {
		what = "adding"
	}
	if index >= cidrSets {
		return fmt.Errorf("%s CIDRs: set index %d out of range 0..%d", what, index, cidrSets-1)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.t.cfg == nil {
		return fmt.Errorf("%s CIDRs: CIDR set tables closed", what)
	}
	if !c.loaded {
		return fmt.Errorf("%s CIDRs: %w", what, ErrCIDRSetsNotLoaded)
	}
	v4, v6, err := splitPrefixes(prefixes)
	if err != nil {
		return fmt.Errorf("%s CIDRs to set %d: %w", what, index, err)
	}

	list := c.v4[index]
	var todo []uint64 // the prefixes that change the set
	for _, e := range v4 {
		if _, in := slices.BinarySearch(list, e); in != add {
			todo = append(todo, e)
		}
	}
	if len(todo) > 0 {
		if add {
			c.v4[index] = mergeSorted(list, todo)
			if err := c.t.addV4(index, c.v4[index], todo); err != nil {
				if !errors.Is(err, errNeedRebuild) {
					return fmt.Errorf("%s CIDRs to set %d: %w", what, index, err)
				}
				if err := c.rebuildV4(); err != nil {
					// The active bank may hold part of the additions (more listed, never
					// less); only a full reload makes tables and copy agree again.
					c.v4[index], c.loaded = list, false
					return fmt.Errorf("%s CIDRs to set %d: rebuilding: %w", what, index, err)
				}
			}
		} else {
			c.v4[index] = subtractSorted(list, todo)
			c.t.removeV4(index, c.v4[index], todo)
		}
	}

	bit := uint32(1) << index
	var todo6 []v6key
	for _, k := range v6 {
		i, found := c.v6.search(k)
		if in := found && c.v6.entries[i].own&bit != 0; in != add {
			todo6 = append(todo6, k)
		}
	}
	switch {
	case len(todo6) == 0:
	case len(todo6) <= v6BulkThreshold:
		if err := c.v6.v6Change(c.w6, c.v6max, index, todo6, add); err != nil {
			c.v6.known, c.loaded = false, false
			return fmt.Errorf("%s CIDRs to set %d: %w", what, index, err)
		}
	default:
		next := v6Bulk(c.v6.entries, index, todo6, add)
		if _, err := writeV6Diff(c.w6, c.v6max, c.v6.entries, next); err != nil {
			c.v6.known, c.loaded = false, false
			return fmt.Errorf("%s CIDRs to set %d: %w", what, index, err)
		}
		c.v6.reset(next, true)
	}
	return nil
}

// v6Bulk returns entries with set index's bit added to (or removed from) the prefixes ks,
// effective masks recomputed.
func v6Bulk(entries []v6entry, index uint8, ks []v6key, add bool) []v6entry {
	bit := uint32(1) << index
	next := slices.Clone(entries)
	if add {
		for _, k := range ks {
			next = append(next, v6entry{k: k, own: bit})
		}
		next = mergeV6(next)
	} else {
		drop := make(map[v6key]bool, len(ks))
		for _, k := range ks {
			drop[k] = true
		}
		out := next[:0]
		for _, e := range next {
			if drop[e.k] {
				e.own &^= bit
			}
			if e.own != 0 {
				out = append(out, e)
			}
		}
		next = out
	}
	computeEff(next)
	return next
}

// mergeSorted returns the sorted union of sorted a and sorted b (disjoint).
func mergeSorted(a, b []uint64) []uint64 {
	out := make([]uint64, 0, len(a)+len(b))
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		if a[i] < b[j] {
			out = append(out, a[i])
			i++
		} else {
			out = append(out, b[j])
			j++
		}
	}
	out = append(out, a[i:]...)
	return append(out, b[j:]...)
}

// subtractSorted returns sorted a without the elements of sorted b.
func subtractSorted(a, b []uint64) []uint64 {
	out := make([]uint64, 0, len(a)-len(b))
	j := 0
	for _, x := range a {
		for j < len(b) && b[j] < x {
			j++
		}
		if j < len(b) && b[j] == x {
			continue
		}
		out = append(out, x)
	}
	return out
}

// CIDRSetMembership returns the mask of the CIDR sets containing addr, read from the
// dataplane's tables the way the programs read them (bit i: set i).
func (t *Tables) CIDRSetMembership(addr netip.Addr) (uint32, error) {
	if !addr.IsValid() {
		return 0, fmt.Errorf("CIDR set membership: invalid address")
	}
	c := t.c
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.t.cfg == nil {
		return 0, errors.New("CIDR set membership: CIDR set tables closed")
	}
	addr = addr.Unmap()
	if addr.Is4() {
		a := addr.As4()
		return c.t.lookup(binary.BigEndian.Uint32(a[:])), nil
	}
	return lookupV6(c.m6, addr)
}

// tableBytes is the memlock of the IPv4 config and the tables of both banks (the inactive
// bank has tables only while a rebuild runs).
func (c *cidrState) tableBytes() uint64 {
	var n uint64
	if c.cfgMap != nil {
		n += memlockOf(c.cfgMap)
	}
	if c.store != nil {
		for b := range uint32(2) {
			n += c.store.memlock(b)
		}
	}
	return n
}

// CIDRSetUsage returns the current CIDR set statistics (Build and Write of the last full
// rebuild).
func (t *Tables) CIDRSetUsage() Stats {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	return t.c.usage()
}

func (c *cidrState) usage() Stats {
	s := c.last
	if c.t.cfg == nil {
		return s
	}
	for _, l := range c.v4 {
		s.IPv4 += len(l)
	}
	for _, e := range c.v6.entries {
		s.IPv6 += bits.OnesCount32(e.own)
	}
	s.Prefixes = s.IPv4 + s.IPv6
	b := c.t.active()
	size := min(uint64(atomic.LoadUint32(&c.t.cfg.HostSlots[b])), uint64(len(c.t.hostBank(b))))
	for _, v := range c.t.hostBank(b)[:size] {
		if v>>32 != 0 {
			s.HostEntries++
		}
	}
	if atomic.LoadUint32(&c.t.cfg.ZeroMask[b]) != 0 {
		s.HostEntries++
	}
	s.HostSlots, s.HostCapacity = int(size), int(c.maxHost)
	s.TableBytes = c.tableBytes()
	s.KernelBytes = s.TableBytes + uint64(len(c.v6.entries))*v6NodeBytes
	s.UserBytes = uint64(s.IPv4)*8 + uint64(len(c.v6.entries))*uint64(unsafe.Sizeof(v6entry{}))
	s.MemoryBytes = s.KernelBytes + s.UserBytes
	return s
}

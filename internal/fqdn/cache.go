package fqdn

import (
	"cmp"
	"container/heap"
	"fmt"
	"net/netip"
	"slices"
	"sync"
	"time"
)

// The defaults of Config's fields.
const (
	// DefaultGrace covers clients that keep dialling an answer a little after its TTL:
	// language runtimes with caches of their own (the JVM keeps a positive answer 30 s
	// whatever its TTL), connection pools opening one more connection to a cached address,
	// SYN retransmissions. Connections already open do not need it: zombies keep them. A
	// minute is twice the JVM's default while widening what a policy admits only briefly.
	DefaultGrace = time.Minute
	// DefaultMinTTL keeps an answer with TTL 0 (RFC 1035: for the transaction in progress
	// only) usable for the connection it was asked for, through the SYN retransmissions
	// Linux sends 1 s and 3 s after the first, even with the grace turned off.
	DefaultMinTTL = 5 * time.Second
	// DefaultMaxTTL is the cap recursive resolvers commonly put on TTLs (Unbound's
	// cache-max-ttl): an address stays admitted at most a day past its last answer, however
	// long the answer said, since addresses of clouds and CDNs change hands.
	DefaultMaxTTL = 24 * time.Hour
	// DefaultMaxNames holds every name a node's pods resolve in practice (hundreds to a few
	// thousand) with room to spare, while a pod resolving random names cannot grow the cache
	// past it.
	DefaultMaxNames = 16384
	// DefaultMaxAddrsPerName holds a whole answer: a 4 KiB EDNS response has room for about
	// 250 A records (16 octets each with a compressed name). Names answered from a larger
	// pool, a few addresses at a time, keep the 256 learnt last.
	DefaultMaxAddrsPerName = 256
	// DefaultMaxEntries bounds the name-address pairs of the whole cache: MaxNames times
	// MaxAddrsPerName alone would allow four million, a gigabyte (measured). 65536 pairs,
	// four addresses for each of DefaultMaxNames names, take about 20 MB (measured: some
	// 300 bytes a pair, each address distinct).
	DefaultMaxEntries = 65536
	// DefaultMaxZombies is of the order of Cilium's tofqdns-max-deferred-connection-deletes
	// (10000): each zombie is an address with an open connection, so this many is far more
	// than a node's pods keep open to names whose answers expired.
	DefaultMaxZombies = 16384
)

// Config bounds the cache. A zero field takes its default (the Default constants). A
// negative Grace or MinTTL means none. When MinTTL exceeds MaxTTL, every TTL counts as
// MaxTTL. MaxAddrsPerName is at most MaxEntries.
type Config struct {
	Grace           time.Duration // added to every record's TTL
	MinTTL          time.Duration // TTLs below it count as it
	MaxTTL          time.Duration // TTLs above it count as it
	MaxNames        int           // names held at most; beyond, the name that would leave first goes
	MaxAddrsPerName int           // addresses of one name at most; beyond, its first to expire goes
	MaxEntries      int           // name-address pairs at most; beyond, the first to expire goes
	MaxZombies      int           // zombies at most; beyond, the oldest go
}

func (cfg Config) withDefaults() Config {
	duration := func(d *time.Duration, def time.Duration) {
		switch {
		case *d == 0:
			*d = def
		case *d < 0:
			*d = 0
		}
	}
	count := func(n *int, def int) {
		if *n <= 0 {
			*n = def
		}
	}
	duration(&cfg.Grace, DefaultGrace)
	duration(&cfg.MinTTL, DefaultMinTTL)
	if cfg.MaxTTL <= 0 {
		cfg.MaxTTL = DefaultMaxTTL
	}
	count(&cfg.MaxNames, DefaultMaxNames)
	count(&cfg.MaxAddrsPerName, DefaultMaxAddrsPerName)
	count(&cfg.MaxEntries, DefaultMaxEntries)
	count(&cfg.MaxZombies, DefaultMaxZombies)
	cfg.MaxAddrsPerName = min(cfg.MaxAddrsPerName, cfg.MaxEntries)
	return cfg
}

// Cache holds the names the node's DNS proxy saw answered and the addresses each resolved
// to, each name-address pair until its expiry: the time it was learnt plus its TTL
// (clamped to [MinTTL, MaxTTL]) plus the grace. A pair is live while now is before its
// expiry; the addresses of live pairs are what toFQDNs selectors admit.
//
// An address that no live pair holds any more but that an open connection still uses is a
// zombie: selectors no longer admit it, but the agent keeps its identity so that the
// connection keeps working. Addresses a bound evicted become zombies as well until the next
// Expire asks whether a connection uses them.
//
// Memory is bounded by Config whatever the pods resolve. Learn and Expire cost O(log n) for
// each pair they add, extend or remove, n the pairs held (heaps by expiry: no scan of the
// cache, even when every Learn evicts); a Learn that takes a name past MaxAddrsPerName
// also sorts that name's addresses, and Expire asks inUse about every zombie. A Cache is
// safe for concurrent use; readers (Addrs, Names and the rest) run side by side.
type Cache struct {
	cfg Config
	mu  sync.RWMutex
	st  *state
}

// state is the content of a Cache, separate so that Restore can build a new one and swap
// it in only when every entry was valid.
type state struct {
	names    map[string]*nameEntry
	holders  map[netip.Addr]*pair // first of the pairs holding each address
	entries  int                  // pairs held
	byExpiry indexedHeap[*pair]   // every pair, the first to expire on top
	byLatest indexedHeap[*nameEntry]
	zombies  map[netip.Addr]*zombie
	byAge    indexedHeap[*zombie] // the zombie to go first on top
	counters counters
	learnGen uint64 // numbers Learn calls, to tell the pairs the current call added
}

type counters struct {
	evictedNames, evictedEntries, evictedZombies, refused uint64
}

// nameEntry is a name and its addresses.
type nameEntry struct {
	name      string
	addrs     map[netip.Addr]*pair
	latest    time.Time // latest expiry of its pairs: when the name would leave on its own
	heapIndex int       // in byLatest
}

// pair is one address learnt for one name.
type pair struct {
	name      *nameEntry
	addr      netip.Addr
	expires   time.Time // learnt + TTL + grace, without a monotonic clock reading
	heapIndex int       // in byExpiry
	// prevSameAddr and nextSameAddr link the pairs of all names holding addr, so that
	// Names is a walk of them and an address shared by thousands of names costs no map.
	prevSameAddr, nextSameAddr *pair
	createdGen                 uint64 // learnGen of the Learn that added it; 0 if Restore did
	addedGen                   uint64 // learnGen of the Learn that made it live
}

// zombie is an address no name holds, kept while a connection uses it.
type zombie struct {
	addr    netip.Addr
	expires time.Time // expiry of the last pair that held it
	// seenInUse is false until an Expire found a connection using it: an address a bound
	// evicted is kept until then, but goes before those known to be in use.
	seenInUse bool
	heapIndex int    // in byAge
	addedGen  uint64 // learnGen of the Learn that made it a zombie
}

func (p *pair) less(q *pair) bool {
	if c := p.expires.Compare(q.expires); c != 0 {
		return c < 0
	}
	if p.name != q.name {
		return p.name.name < q.name.name
	}
	return p.addr.Less(q.addr)
}

func (e *nameEntry) less(f *nameEntry) bool {
	if c := e.latest.Compare(f.latest); c != 0 {
		return c < 0
	}
	return e.name < f.name
}

func (z *zombie) less(y *zombie) bool {
	if z.seenInUse != y.seenInUse {
		return !z.seenInUse
	}
	if c := z.expires.Compare(y.expires); c != 0 {
		return c < 0
	}
	return z.addr.Less(y.addr)
}

func (p *pair) index() *int      { return &p.heapIndex }
func (e *nameEntry) index() *int { return &e.heapIndex }
func (z *zombie) index() *int    { return &z.heapIndex }

// NewCache returns an empty cache bounded by cfg.
func NewCache(cfg Config) *Cache {
	return &Cache{cfg: cfg.withDefaults(), st: newState()}
}

func newState() *state {
	return &state{
		names:   make(map[string]*nameEntry),
		holders: make(map[netip.Addr]*pair),
		zombies: make(map[netip.Addr]*zombie),
	}
}

// Config gives the cache's bounds, defaults filled in.
func (c *Cache) Config() Config { return c.cfg }

// expiry is the expiry of a record learnt at now with the given TTL.
func (c *Cache) expiry(now time.Time, ttl time.Duration) time.Time {
	ttl = min(max(ttl, c.cfg.MinTTL), c.cfg.MaxTTL)
	// Without the monotonic reading, expiries compare by the wall clock alone, as those
	// Restore reads do: a heap mixing both kinds of comparison need not stay ordered.
	return now.Add(ttl + c.cfg.Grace).Round(0)
}

// Learn records that name (in any case, with or without the final dot) resolved to addrs
// with the given TTL at now. A pair already held gets the later of its two expiries; an
// address that was a zombie is live again. An IPv4-mapped IPv6 address is stored as IPv4.
//
// Learn reports whether the live addresses of some name changed (an address or a name
// added, or one evicted to respect the bounds) or the zombies did (an evicted address
// waiting for Expire, a zombie dropped to respect MaxZombies). It reports false when it only
// extended expiries, so that the agent recomputes policy only when the answers of Addrs or
// Zombies changed.
//
// A name no selector could name (one NewSelector refuses as matchName), an invalid or
// zoned address, and an answer that would not be live even at now (TTL 0 with neither
// MinTTL nor grace) are not stored; the first two count in Stats.Refused. Storing such a
// name would also make the snapshot one Restore refuses.
func (c *Cache) Learn(now time.Time, name string, addrs []netip.Addr, ttl time.Duration) bool {
	n := Canonical(name)
	exp := c.expiry(now, ttl)
	c.mu.Lock()
	defer c.mu.Unlock()
	if checkName(n, false) != nil {
		c.st.counters.refused++
		return false
	}
	valid := make([]netip.Addr, 0, len(addrs))
	for _, a := range addrs {
		if !a.IsValid() || a.Zone() != "" {
			c.st.counters.refused++
			continue
		}
		valid = append(valid, a.Unmap())
	}
	if len(valid) == 0 || !exp.After(now) {
		return false
	}
	slices.SortFunc(valid, netip.Addr.Compare)
	valid = slices.Compact(valid)
	c.st.learnGen++
	op := learnOp{now: now, gen: c.st.learnGen}
	c.st.learn(&c.cfg, n, valid, exp, &op)
	if op.changed {
		return true
	}
	if e := c.st.names[n]; e != nil {
		for _, a := range valid {
			if p := e.addrs[a]; p != nil && p.addedGen == op.gen {
				return true
			}
		}
	}
	return false
}

// learnOp is what one Learn needs to tell whether it changed a live set or the zombies.
type learnOp struct {
	now time.Time
	// gen numbers this Learn (from 1; 0 for Restore): pairs with this addedGen were made
	// live by it, those with this createdGen were added by it, zombies with this addedGen too.
	gen uint64
	// changed says that a bound evicted a pair that was live before this Learn, or made or
	// dropped a zombie.
	changed bool
}

// learn adds or extends the pairs of name (canonical and valid) with addrs (unmapped,
// sorted, distinct) to expire at exp, then enforces the bounds. Restore calls it with a
// zero learnOp.
func (st *state) learn(cfg *Config, name string, addrs []netip.Addr, exp time.Time, op *learnOp) {
	e := st.names[name]
	if e == nil {
		e = &nameEntry{name: name, addrs: make(map[netip.Addr]*pair, len(addrs)), latest: exp}
		st.names[name] = e
		heap.Push(&st.byLatest, e)
	}
	for _, a := range addrs {
		p := e.addrs[a]
		if p == nil {
			st.addPair(e, a, exp, op)
			continue
		}
		if !exp.After(p.expires) {
			continue
		}
		if !p.expires.After(op.now) {
			p.addedGen = op.gen // expired but not yet dropped: live again
		}
		p.expires = exp
		heap.Fix(&st.byExpiry, p.heapIndex)
	}
	if exp.After(e.latest) {
		e.latest = exp
		heap.Fix(&st.byLatest, e.heapIndex)
	}

	// The bounds. Evicting a name's or the cache's first pairs to expire never lowers a
	// name's latest expiry unless it empties the name, which then goes.
	if over := len(e.addrs) - cfg.MaxAddrsPerName; over > 0 {
		ps := make([]*pair, 0, len(e.addrs))
		for _, p := range e.addrs {
			ps = append(ps, p)
		}
		slices.SortFunc(ps, func(p, q *pair) int {
			if c := p.expires.Compare(q.expires); c != 0 {
				return c
			}
			return p.addr.Compare(q.addr)
		})
		for _, p := range ps[:over] {
			st.evictPair(p, op)
		}
	}
	for len(st.names) > cfg.MaxNames {
		st.evictName(st.byLatest.items[0], op)
	}
	for st.entries > cfg.MaxEntries {
		st.evictPair(st.byExpiry.items[0], op)
	}
	// Zombies among the addresses are live again, unless the bounds just evicted them.
	for _, a := range addrs {
		if z := st.zombies[a]; z != nil && st.holders[a] != nil {
			heap.Remove(&st.byAge, z.heapIndex)
			delete(st.zombies, a)
			op.changed = true
		}
	}
	st.trimZombies(cfg.MaxZombies, op)
}

func (st *state) addPair(e *nameEntry, a netip.Addr, exp time.Time, op *learnOp) {
	p := &pair{name: e, addr: a, expires: exp, createdGen: op.gen, addedGen: op.gen}
	e.addrs[a] = p
	if first := st.holders[a]; first != nil {
		p.nextSameAddr = first
		first.prevSameAddr = p
	}
	st.holders[a] = p
	heap.Push(&st.byExpiry, p)
	st.entries++
}

// unlinkPair removes p from its name and the indexes, leaving the name (even empty) to the
// caller, and reports whether no pair holds p's address any more.
func (st *state) unlinkPair(p *pair) (unheld bool) {
	delete(p.name.addrs, p.addr)
	switch {
	case p.prevSameAddr != nil:
		p.prevSameAddr.nextSameAddr = p.nextSameAddr
	case p.nextSameAddr != nil:
		st.holders[p.addr] = p.nextSameAddr
	default:
		delete(st.holders, p.addr)
		unheld = true
	}
	if p.nextSameAddr != nil {
		p.nextSameAddr.prevSameAddr = p.prevSameAddr
	}
	p.prevSameAddr, p.nextSameAddr = nil, nil
	heap.Remove(&st.byExpiry, p.heapIndex)
	st.entries--
	return unheld
}

func (st *state) removeName(e *nameEntry) {
	delete(st.names, e.name)
	heap.Remove(&st.byLatest, e.heapIndex)
}

// evictPair drops p to respect a bound. Its address, if no other name holds it, becomes a
// zombie until the next Expire asks whether a connection uses it: a name rotating through
// many addresses must not cut its older connections.
func (st *state) evictPair(p *pair, op *learnOp) {
	st.counters.evictedEntries++
	st.dropEvicted(p, op)
	if len(p.name.addrs) == 0 {
		st.removeName(p.name)
	}
}

// evictName drops e with its addresses to respect MaxNames.
func (st *state) evictName(e *nameEntry, op *learnOp) {
	st.counters.evictedNames++
	for _, p := range e.addrs {
		st.dropEvicted(p, op)
	}
	st.removeName(e)
}

// dropEvicted unlinks p, which a bound evicts. A pair this Learn added was never admitted
// and leaves no zombie.
func (st *state) dropEvicted(p *pair, op *learnOp) {
	if p.expires.After(op.now) && p.addedGen != op.gen {
		op.changed = true
	}
	if st.unlinkPair(p) && (op.gen == 0 || p.createdGen != op.gen) {
		if st.addZombie(p.addr, p.expires, false, op.gen) {
			op.changed = true
		}
	}
}

// addZombie makes a, which no pair holds, a zombie, or updates the zombie it is already,
// and reports whether it is a new one.
func (st *state) addZombie(a netip.Addr, exp time.Time, seenInUse bool, gen uint64) bool {
	if z := st.zombies[a]; z != nil {
		z.expires = later(z.expires, exp)
		z.seenInUse = z.seenInUse || seenInUse
		heap.Fix(&st.byAge, z.heapIndex)
		return false
	}
	z := &zombie{addr: a, expires: exp, seenInUse: seenInUse, addedGen: gen}
	st.zombies[a] = z
	heap.Push(&st.byAge, z)
	return true
}

// trimZombies drops zombies, those never seen in use first, then the oldest, until at
// most limit are left: evictions a flood of names causes cannot push out the zombies whose
// connections are known to be open. Dropping a zombie that op made is no change.
func (st *state) trimZombies(limit int, op *learnOp) {
	for len(st.zombies) > limit {
		z := heap.Pop(&st.byAge).(*zombie)
		delete(st.zombies, z.addr)
		st.counters.evictedZombies++
		if op.gen == 0 || z.addedGen != op.gen {
			op.changed = true
		}
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Addrs gives the addresses of the live pairs (expiry after now) of every name s matches,
// sorted and each once. For a MatchName selector it is a map lookup; for a MatchPattern
// selector it matches the pattern against every name held (MaxNames regular-expression
// matches: about 3 ms with the default cache full, Learn waiting meanwhile), so the agent
// keeps the answer per selector and asks again when Learn or Expire reports a change.
func (c *Cache) Addrs(now time.Time, s Selector) []netip.Addr {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []netip.Addr
	add := func(e *nameEntry) {
		for a, p := range e.addrs {
			if p.expires.After(now) {
				out = append(out, a)
			}
		}
	}
	switch {
	case s.MatchName != "":
		if e := c.st.names[s.MatchName]; e != nil {
			add(e)
		}
	case s.re != nil:
		for n, e := range c.st.names {
			if s.re.MatchString(n) { // n is canonical: no need for Matches' Canonical
				add(e)
			}
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return slices.Compact(out)
}

// Names gives, sorted, the names for which a is live at now: the names a flow to a was
// allowed for. An IPv4-mapped address is looked up as IPv4. A zombie has none.
func (c *Cache) Names(now time.Time, a netip.Addr) []string {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var out []string
	for p := c.st.holders[a.Unmap()]; p != nil; p = p.nextSameAddr {
		if p.expires.After(now) {
			out = append(out, p.name.name)
		}
	}
	slices.Sort(out)
	return out
}

// Expire drops the pairs no longer live at now. An address no live pair holds any more
// becomes a zombie if inUse reports it in use (the agent asks conntrack); every zombie is
// asked again, and one no longer in use goes. inUse is called with the cache locked: it
// must be quick and must not call the cache; nil means nothing is in use. Beyond
// MaxZombies, the zombies no Expire has seen in use go first, then the oldest (earliest
// expiry).
//
// Expire reports whether it dropped a pair (so that the answer of Addrs the agent holds
// may be stale) or changed the zombies.
func (c *Cache) Expire(now time.Time, inUse func(netip.Addr) bool) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.st
	changed := false
	type candidate struct {
		addr    netip.Addr
		expires time.Time
	}
	var unheld []candidate
	for st.byExpiry.Len() > 0 && !st.byExpiry.items[0].expires.After(now) {
		p := st.byExpiry.items[0]
		if st.unlinkPair(p) {
			unheld = append(unheld, candidate{p.addr, p.expires})
		}
		if len(p.name.addrs) == 0 {
			st.removeName(p.name)
		}
		changed = true
	}
	for a, z := range st.zombies {
		switch {
		case inUse == nil || !inUse(a):
			heap.Remove(&st.byAge, z.heapIndex)
			delete(st.zombies, a)
			changed = true
		case !z.seenInUse:
			z.seenInUse = true
			heap.Fix(&st.byAge, z.heapIndex)
		}
	}
	// The addresses just unheld were held, so none is a zombie yet.
	for _, u := range unheld {
		if inUse != nil && inUse(u.addr) {
			st.addZombie(u.addr, u.expires, true, 0)
			changed = true
		}
	}
	st.trimZombies(c.cfg.MaxZombies, &learnOp{})
	return changed
}

// Zombies gives the zombies, sorted.
func (c *Cache) Zombies() []netip.Addr {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]netip.Addr, 0, len(c.st.zombies))
	for a := range c.st.zombies {
		out = append(out, a)
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

// NextExpiry gives the earliest expiry of a pair held, which is when Expire has something
// to do (already past if Expire is overdue), or the zero time when no pair is held.
// Zombies have no expiry: they go when their connections close, so while there are any the
// agent also calls Expire at an interval of its own (as Cilium does at each conntrack
// garbage collection).
func (c *Cache) NextExpiry() time.Time {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.st.byExpiry.Len() == 0 {
		return time.Time{}
	}
	return c.st.byExpiry.items[0].expires
}

// Entry is one name-address pair of a snapshot, or one zombie (Zombie set, no name).
// Expires includes the grace; a zombie's is that of the last pair that held it.
type Entry struct {
	Name    string     `json:"name,omitempty"`
	Addr    netip.Addr `json:"addr"`
	Expires time.Time  `json:"expires"`
	Zombie  bool       `json:"zombie,omitempty"`
}

// compareEntries orders a snapshot: pairs by name then address, then zombies by address.
func compareEntries(a, b Entry) int {
	if a.Zombie != b.Zombie {
		if a.Zombie {
			return 1
		}
		return -1
	}
	if c := cmp.Compare(a.Name, b.Name); c != 0 {
		return c
	}
	return a.Addr.Compare(b.Addr)
}

// Snapshot gives the content of the cache, for the agent to keep across restarts: every
// pair held (expired ones Expire has not dropped yet included) and every zombie, in the
// order compareEntries gives, times in UTC, so that the same content gives the same JSON.
func (c *Cache) Snapshot() []Entry {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]Entry, 0, c.st.entries+len(c.st.zombies))
	for _, e := range c.st.names {
		for a, p := range e.addrs {
			out = append(out, Entry{Name: e.name, Addr: a, Expires: p.expires.UTC()})
		}
	}
	for a, z := range c.st.zombies {
		out = append(out, Entry{Addr: a, Expires: z.expires.UTC(), Zombie: true})
	}
	slices.SortFunc(out, compareEntries)
	return out
}

// Restore replaces the content of the cache with entries, in the form and order Snapshot
// gives. It refuses, naming the first bad entry and changing nothing, a name that is not
// canonical or not valid, a zombie with a name, an invalid, zoned or IPv4-mapped address, a
// missing expiry, entries out of order or repeated, and a zombie also held by a name. The
// bounds hold as they do for Learn, evicting what does not fit (counted in Stats), so the
// cache never holds more than Config allows, whatever the input. Restored zombies count as
// not yet seen in use until the next Expire. Expiries are taken as they are: a snapshot is
// the agent's own state, written by Snapshot.
func (c *Cache) Restore(entries []Entry) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := newState()
	st.counters = c.st.counters
	st.learnGen = c.st.learnGen
	for i, en := range entries {
		if err := checkEntry(en); err != nil {
			return fmt.Errorf("restore fqdn cache: entry %d (%s): %w", i, describeEntry(en), err)
		}
		if i > 0 && compareEntries(entries[i-1], en) >= 0 {
			return fmt.Errorf("restore fqdn cache: entry %d (%s): not after entry %d (%s): entries must be in Snapshot's order, each once",
				i, describeEntry(en), i-1, describeEntry(entries[i-1]))
		}
		exp := en.Expires.Round(0)
		if en.Zombie {
			if p := st.holders[en.Addr]; p != nil {
				return fmt.Errorf("restore fqdn cache: entry %d (%s): the address is also learnt for %q", i, describeEntry(en), p.name.name)
			}
			st.addZombie(en.Addr, exp, false, 0)
			st.trimZombies(c.cfg.MaxZombies, &learnOp{})
			continue
		}
		st.learn(&c.cfg, en.Name, []netip.Addr{en.Addr}, exp, &learnOp{})
	}
	c.st = st
	return nil
}

func checkEntry(en Entry) error {
	if en.Zombie {
		if en.Name != "" {
			return fmt.Errorf("a zombie has no name")
		}
	} else {
		if Canonical(en.Name) != en.Name {
			return fmt.Errorf("name is not canonical (lowercase, no final dot)")
		}
		if err := checkName(en.Name, false); err != nil {
			return fmt.Errorf("name: %w", err)
		}
	}
	switch {
	case !en.Addr.IsValid():
		return fmt.Errorf("no address")
	case en.Addr.Zone() != "":
		return fmt.Errorf("address has a zone")
	case en.Addr.Is4In6():
		return fmt.Errorf("address is IPv4-mapped: write it as %v", en.Addr.Unmap())
	case en.Expires.IsZero():
		return fmt.Errorf("no expiry")
	}
	return nil
}

func describeEntry(en Entry) string {
	if en.Zombie {
		return fmt.Sprintf("zombie %v", en.Addr)
	}
	return fmt.Sprintf("%q %v", en.Name, en.Addr)
}

// Stats is the cache's size and its counters since NewCache, for metrics.
type Stats struct {
	Names   int // names held
	Entries int // name-address pairs held
	Addrs   int // distinct addresses held
	Zombies int
	// EvictedNames counts the names dropped with their addresses to respect MaxNames.
	EvictedNames uint64
	// EvictedEntries counts the pairs dropped to respect MaxAddrsPerName or MaxEntries.
	EvictedEntries uint64
	// EvictedZombies counts the zombies dropped to respect MaxZombies.
	EvictedZombies uint64
	// Refused counts the invalid names and addresses Learn did not store.
	Refused uint64
}

// Stats gives the cache's size and counters.
func (c *Cache) Stats() Stats {
	c.mu.RLock()
	defer c.mu.RUnlock()
	st := c.st
	return Stats{
		Names:          len(st.names),
		Entries:        st.entries,
		Addrs:          len(st.holders),
		Zombies:        len(st.zombies),
		EvictedNames:   st.counters.evictedNames,
		EvictedEntries: st.counters.evictedEntries,
		EvictedZombies: st.counters.evictedZombies,
		Refused:        st.counters.refused,
	}
}

// heapElement is what indexedHeap holds: a pointer that orders itself and keeps its
// position in the heap.
type heapElement[T any] interface {
	less(T) bool
	index() *int
}

// indexedHeap is a min-heap (container/heap) whose elements know their position, so that
// one can be removed or re-placed in O(log n) when its key changes.
type indexedHeap[T heapElement[T]] struct{ items []T }

func (h *indexedHeap[T]) Len() int           { return len(h.items) }
func (h *indexedHeap[T]) Less(i, j int) bool { return h.items[i].less(h.items[j]) }
func (h *indexedHeap[T]) Swap(i, j int) {
	h.items[i], h.items[j] = h.items[j], h.items[i]
	*h.items[i].index() = i
	*h.items[j].index() = j
}
func (h *indexedHeap[T]) Push(x any) {
	t := x.(T)
	*t.index() = len(h.items)
	h.items = append(h.items, t)
}
func (h *indexedHeap[T]) Pop() any {
	n := len(h.items) - 1
	t := h.items[n]
	var zero T
	h.items[n] = zero
	h.items = h.items[:n]
	*t.index() = -1
	return t
}

package sockverdict

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/l7table"
	"github.com/rampartnet/rampart/internal/netns"
)

// Verdict is the send-side L7 verdict (bpf/sockverdict.c, docs/internals/l7-send-side.md):
// requests between two local endpoints checked on the client's own socket. The agent lists
// the pairs of sockets it takes (SetTarget) and the rule table each pair is checked against
// (SetSlot); the programs do the rest. Its maps and the sockops link are pinned beside the
// dataplane's, so the verdict outlives the agent's process, like the tc programs.
type Verdict struct {
	objs   sockverdictObjects
	link   link.Link
	pinDir string

	mu     sync.Mutex
	nextID uint32
	slots  map[uint32]uint32         // slot -> table id in the maps
	tables map[uint32]*l7table.Table // table id -> what was written under it
}

// Sides of a target (SV_SIDE_* in sockverdict.h).
const (
	SideClient = 0
	SideServer = 1
)

// SlotCount is how many pairs of endpoints can have a table at once.
const SlotCount = 16384

const sockopsLinkPin = "sv_sockops_link"

// Open loads the programs with their maps pinned in pinDir (the dataplane's
// pin directory, whose sv_flows map tc reads), attaches the sockops program to the cgroup
// v2 directory cgroup (the root, so that it sees the sockets of every endpoint) through a
// pinned link, updating the link of an earlier run in place, and the two sk_msg programs
// to their sockhashes (replacing an earlier run's).
func Open(cgroup, pinDir string) (*Verdict, error) {
	if err := os.MkdirAll(pinDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating pin directory: %w", err)
	}
	s := &Verdict{pinDir: pinDir, slots: map[uint32]uint32{}, tables: map[uint32]*l7table.Table{}}
	opts := &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: pinDir}}
	if err := loadSockverdictObjects(&s.objs, opts); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("loading send-side verdict: %+v", ve)
		}
		return nil, fmt.Errorf("loading send-side verdict: %w", err)
	}
	for _, a := range []struct {
		m *ebpf.Map
		p *ebpf.Program
	}{{s.objs.SvClients, s.objs.SvRequest}, {s.objs.SvServers, s.objs.SvResponse}} {
		if err := link.RawAttachProgram(link.RawAttachProgramOptions{Target: a.m.FD(), Program: a.p, Attach: ebpf.AttachSkMsgVerdict}); err != nil {
			s.objs.Close()
			return nil, fmt.Errorf("attaching %s to its sockhash: %w", a.p, err)
		}
	}
	pin := filepath.Join(pinDir, sockopsLinkPin)
	if l, err := link.LoadPinnedLink(pin, nil); err == nil {
		if err := l.Update(s.objs.SvSockops); err != nil {
			l.Close()
			s.objs.Close()
			return nil, fmt.Errorf("updating the pinned sockops link: %w", err)
		}
		s.link = l
	} else {
		l, err := link.AttachCgroup(link.CgroupOptions{Path: cgroup, Attach: ebpf.AttachCGroupSockOps, Program: s.objs.SvSockops})
		if err != nil {
			s.objs.Close()
			return nil, fmt.Errorf("attaching sockops to %s: %w", cgroup, err)
		}
		if err := l.Pin(pin); err != nil {
			l.Close()
			s.objs.Close()
			return nil, fmt.Errorf("pinning the sockops link: %w", err)
		}
		s.link = l
	}
	if err := s.readState(); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// readState learns from the pinned maps which tables an earlier run left, so that
// replacing them deletes all their entries.
func (s *Verdict) readState() error {
	var slot, id uint32
	it := s.objs.SvSlots.Iterate()
	for it.Next(&slot, &id) {
		if id != 0 {
			s.slots[slot] = id
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading send-side slots: %w", err)
	}
	var h sockverdictSvTable
	it = s.objs.SvTables.Iterate()
	for it.Next(&id, &h) {
		s.tables[id] = &l7table.Table{}
		s.nextID = max(s.nextID, id)
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading send-side tables: %w", err)
	}
	var pk sockverdictSvPathKey
	var m sockverdictSvMasks
	it = s.objs.SvPaths.Iterate()
	for it.Next(&pk, &m) {
		t := s.tableOf(pk.Table)
		t.Paths = append(t.Paths, l7table.PathEntry{Key: string(pk.Path[:(pk.Prefixlen-32)/8])})
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading send-side paths: %w", err)
	}
	var hk sockverdictSvHostKey
	it = s.objs.SvHosts.Iterate()
	for it.Next(&hk, &m) {
		t := s.tableOf(hk.Table)
		t.Hosts = append(t.Hosts, l7table.HostEntry{Host: string(bytes.TrimRight(hk.Host[:], "\x00"))})
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading send-side hosts: %w", err)
	}
	var xk sockverdictSvHeaderKey
	var xv sockverdictSvHeaderVal
	it = s.objs.SvHeaders.Iterate()
	for it.Next(&xk, &xv) {
		t := s.tableOf(xk.Table)
		t.Headers = append(t.Headers, l7table.HeaderEntry{Name: int8String(xk.Name[:]), Value: int8String(xk.Value[:]), Presence: xk.Presence != 0})
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading send-side headers: %w", err)
	}
	return nil
}

func int8String(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}

func (s *Verdict) tableOf(id uint32) *l7table.Table {
	t := s.tables[id]
	if t == nil {
		t = &l7table.Table{}
		s.tables[id] = t
		s.nextID = max(s.nextID, id)
	}
	return t
}

// Slots returns the slots that have a table now.
func (s *Verdict) Slots() []uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]uint32, 0, len(s.slots))
	for slot := range s.slots {
		out = append(out, slot)
	}
	return out
}

// SlotsInUse returns the slots that open connections hold.
func (s *Verdict) SlotsInUse() (map[uint32]bool, error) {
	used := map[uint32]bool{}
	var k sockverdictSvConnKey
	var c sockverdictSvConn
	it := s.objs.SvConns.Iterate()
	for it.Next(&k, &c) {
		used[c.Slot] = true
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("reading send-side connections: %w", err)
	}
	return used, nil
}

// Table returns the table written under id (nil if none now): events name the table that
// decided, and its Rules name the rules of their masks.
func (s *Verdict) Table(id uint32) *l7table.Table {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.tables[id]
}

// Remove detaches the sockops program and deletes the pins (uninstall). Connections it
// took are released when the sockhashes go.
func (s *Verdict) Remove() error {
	var errs []error
	if err := s.link.Unpin(); err != nil {
		errs = append(errs, fmt.Errorf("unpinning the sockops link: %w", err))
	}
	m := &s.objs.sockverdictMaps
	for _, mp := range []*ebpf.Map{m.SvTargets, m.SvSlots, m.SvTables, m.SvPaths, m.SvHosts, m.SvHeaders, m.SvConns, m.SvClients, m.SvServers, m.SvEvents, m.SvCounts} {
		if err := mp.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpinning %s: %w", mp, err))
		}
	}
	errs = append(errs, s.Close())
	return errors.Join(errs...)
}

// Close releases the process's handles; the pinned link and maps stay, and so does the
// verdict.
func (s *Verdict) Close() error {
	var errs []error
	if s.link != nil {
		errs = append(errs, s.link.Close())
	}
	errs = append(errs, s.objs.Close())
	return errors.Join(errs...)
}

// NetnsCookie returns the cookie of the network namespace at nsPath ("" = the caller's),
// which the sockops program compares targets with.
func NetnsCookie(nsPath string) (uint64, error) {
	var cookie uint64
	err := netns.Do(nsPath, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_NETNS_COOKIE)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("reading the cookie of network namespace %q: %w", nsPath, err)
	}
	return cookie, nil
}

// Cgroup2Root finds where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or
// /sys/fs/cgroup/unified beside v1 controllers).
func Cgroup2Root() (string, error) {
	b, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return "", fmt.Errorf("finding the cgroup v2 mount: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 2 && f[2] == "cgroup2" {
			return f[1], nil
		}
	}
	return "", errors.New("finding the cgroup v2 mount: none in /proc/self/mounts")
}

func ip4(a netip.Addr) uint32 {
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:]) // network order in memory, as the kernel has it
}

// SetTarget lists one side of a pair: the socket in the namespace with netnsCookie whose
// own address is local, talking to remote on the server port, is checked against slot.
func (s *Verdict) SetTarget(netnsCookie uint64, local, remote netip.Addr, port uint16, side int, slot uint32) error {
	if !local.Is4() || !remote.Is4() {
		return fmt.Errorf("setting send-side target %s-%s: IPv4 only", local, remote)
	}
	k := sockverdictSvTargetKey{NetnsCookie: netnsCookie, LocalIp4: ip4(local), RemoteIp4: ip4(remote), Port: uint32(port), Side: uint32(side)}
	if err := s.objs.SvTargets.Put(&k, &sockverdictSvTarget{Slot: slot}); err != nil {
		return fmt.Errorf("setting send-side target %s-%s port %d: %w", local, remote, port, err)
	}
	return nil
}

// DeleteTarget removes what SetTarget wrote; connections already taken keep their slot.
func (s *Verdict) DeleteTarget(netnsCookie uint64, local, remote netip.Addr, port uint16, side int) error {
	k := sockverdictSvTargetKey{NetnsCookie: netnsCookie, LocalIp4: ip4(local), RemoteIp4: ip4(remote), Port: uint32(port), Side: uint32(side)}
	if err := s.objs.SvTargets.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("deleting send-side target %s-%s port %d: %w", local, remote, port, err)
	}
	return nil
}

// SetSlot makes t the table of slot's connections (nil: none, every request refused). The
// new table is written whole under a new id before the slot switches to it, and the old
// one is deleted after, so that no request meets a table half written.
func (s *Verdict) SetSlot(slot uint32, t *l7table.Table) error {
	if slot == 0 || slot >= SlotCount {
		return fmt.Errorf("send-side slot %d out of range", slot)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var id uint32
	if t != nil {
		id = s.newID()
		if err := s.writeTable(id, t); err != nil {
			s.deleteTable(id, t)
			return err
		}
		s.tables[id] = t
	}
	if err := s.objs.SvSlots.Put(slot, id); err != nil {
		if t != nil {
			s.deleteTable(id, t)
			delete(s.tables, id)
		}
		return fmt.Errorf("switching send-side slot %d: %w", slot, err)
	}
	if old, ok := s.slots[slot]; ok && old != 0 {
		s.deleteTable(old, s.tables[old])
		delete(s.tables, old)
	}
	if id == 0 {
		delete(s.slots, slot)
	} else {
		s.slots[slot] = id
	}
	return nil
}

func (s *Verdict) newID() uint32 {
	for {
		s.nextID++
		if s.nextID == 0 {
			s.nextID = 1
		}
		if _, used := s.tables[s.nextID]; !used {
			return s.nextID
		}
	}
}

func masks(m l7table.Masks) sockverdictSvMasks { return sockverdictSvMasks{M: m} }

func pathKey(id uint32, key string) sockverdictSvPathKey {
	k := sockverdictSvPathKey{Prefixlen: uint32(32 + 8*len(key)), Table: id}
	copy(k.Path[:], key)
	return k
}

func hostKey(id uint32, host string) sockverdictSvHostKey {
	k := sockverdictSvHostKey{Table: id}
	copy(k.Host[:], host)
	return k
}

func headerKey(id uint32, e l7table.HeaderEntry) sockverdictSvHeaderKey {
	k := sockverdictSvHeaderKey{Table: id}
	if e.Presence {
		k.Presence = 1
	}
	for i := range min(len(e.Name), len(k.Name)) {
		k.Name[i] = int8(e.Name[i])
	}
	for i := range min(len(e.Value), len(k.Value)) {
		k.Value[i] = int8(e.Value[i])
	}
	return k
}

func (s *Verdict) writeTable(id uint32, t *l7table.Table) error {
	h := sockverdictSvTable{Pass: masks(t.Header.Pass), AnyPath: masks(t.Header.AnyPath), AnyHost: masks(t.Header.AnyHost),
		HeaderRules: masks(t.Header.HeaderRules)}
	for i, m := range t.Header.Method {
		h.Method[i] = masks(m)
	}
	for side := range t.RuleReqs {
		copy(h.RuleReqs[side][:], t.RuleReqs[side])
	}
	for _, e := range t.Headers {
		k, v := headerKey(id, e), sockverdictSvHeaderVal{Reqs: masks(e.Reqs), ValueReqs: masks(e.ValueReqs)}
		if err := s.objs.SvHeaders.Put(&k, &v); err != nil {
			return fmt.Errorf("writing send-side header %q: %w", e.Name, err)
		}
	}
	for _, p := range t.Paths {
		k, v := pathKey(id, p.Key), masks(p.Masks)
		if err := s.objs.SvPaths.Put(&k, &v); err != nil {
			return fmt.Errorf("writing send-side path %q: %w", p.Key, err)
		}
	}
	for _, e := range t.Hosts {
		k, v := hostKey(id, e.Host), masks(e.Masks)
		if err := s.objs.SvHosts.Put(&k, &v); err != nil {
			return fmt.Errorf("writing send-side host %q: %w", e.Host, err)
		}
	}
	if err := s.objs.SvTables.Put(id, &h); err != nil {
		return fmt.Errorf("writing send-side table %d: %w", id, err)
	}
	return nil
}

func (s *Verdict) deleteTable(id uint32, t *l7table.Table) {
	s.objs.SvTables.Delete(id)
	if t == nil {
		return
	}
	for _, p := range t.Paths {
		k := pathKey(id, p.Key)
		s.objs.SvPaths.Delete(&k)
	}
	for _, e := range t.Hosts {
		k := hostKey(id, e.Host)
		s.objs.SvHosts.Delete(&k)
	}
	for _, e := range t.Headers {
		k := headerKey(id, e)
		s.objs.SvHeaders.Delete(&k)
	}
}

// Counts are the verdicts given since load, summed over CPUs.
type Counts struct {
	Passed, Refused, Malformed, SendFailed, EventsLost uint64
}

// Counts reads the verdict counters.
func (s *Verdict) Counts() (Counts, error) {
	var c Counts
	for i, dst := range []*uint64{&c.Passed, &c.Refused, &c.Malformed, &c.SendFailed, &c.EventsLost} {
		var per []uint64
		if err := s.objs.SvCounts.Lookup(uint32(i), &per); err != nil {
			return c, fmt.Errorf("reading send-side counters: %w", err)
		}
		for _, v := range per {
			*dst += v
		}
	}
	return c, nil
}

// Kind is what the verdict did with a request (SV_V_*).
type Kind uint8

const (
	Passed     Kind = 0
	Refused    Kind = 1 // no rule matched: 403 from the client's own socket
	Malformed  Kind = 2 // outside the kernel's subset: 400, connection shut
	SendFailed Kind = 3 // refused, but no answer could go in order: send failed
)

func (k Kind) String() string {
	switch k {
	case Passed:
		return "passed"
	case Refused:
		return "refused"
	case Malformed:
		return "malformed"
	case SendFailed:
		return "send-failed"
	}
	return fmt.Sprintf("verdict-%d", uint8(k))
}

// Event is one request the send-side verdict decided on.
type Event struct {
	Time    time.Time // when the event was written (boot clock converted to wall time)
	Latency time.Duration
	Client  netip.AddrPort
	Server  netip.AddrPort
	Table   uint32
	Rules   l7table.Masks
	Status  int    // 0: unknown
	Method  string // "" when the request had none the kernel knows
	Verdict Kind
	Path    string // at most 64 bytes
	Host    string // at most 32 bytes
}

// EventReader reads the send-side verdict's events.
type EventReader struct {
	rd       *ringbuf.Reader
	rec      ringbuf.Record
	deadline time.Time // the caller's (zero: none)
	boot     time.Time
}

// EventPoll is how late an event may be read: the programs wake the reader only when an
// event fills a quarter of its ring (bpf/sockverdict.c, emit), so Read polls.
const EventPoll = 50 * time.Millisecond

// Events opens a reader of the event ring. One reader at a time.
func (s *Verdict) Events() (*EventReader, error) {
	rd, err := ringbuf.NewReader(s.objs.SvEvents)
	if err != nil {
		return nil, fmt.Errorf("opening send-side events: %w", err)
	}
	return &EventReader{rd: rd, boot: bootTime()}, nil
}

// bootTime is the wall time of CLOCK_MONOTONIC's zero (what bpf_ktime_get_ns counts from).
func bootTime() time.Time {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return time.Now()
	}
	return time.Now().Add(-time.Duration(ts.Nano()))
}

// SetDeadline makes Read return os.ErrDeadlineExceeded after t (zero: none).
func (r *EventReader) SetDeadline(t time.Time) { r.deadline = t }

// Close stops the reader.
func (r *EventReader) Close() error { return r.rd.Close() }

// Read waits for the next event.
func (r *EventReader) Read() (Event, error) {
	for {
		wake := time.Now().Add(EventPoll)
		if !r.deadline.IsZero() && r.deadline.Before(wake) {
			wake = r.deadline
		}
		r.rd.SetDeadline(wake)
		err := r.rd.ReadInto(&r.rec)
		if err == nil {
			return r.decode(r.rec.RawSample)
		}
		if !errors.Is(err, os.ErrDeadlineExceeded) || (!r.deadline.IsZero() && !time.Now().Before(r.deadline)) {
			return Event{}, fmt.Errorf("reading send-side event: %w", err)
		}
	}
}

// decode reads a struct sv_event (field by field: binary.Read's reflection cost more than
// the verdict itself at these rates).
func (r *EventReader) decode(b []byte) (Event, error) {
	var e sockverdictSvEvent
	if len(b) < int(unsafe.Sizeof(e)) {
		return Event{}, fmt.Errorf("decoding send-side event: %d bytes", len(b))
	}
	ne := binary.NativeEndian
	addr := func(off int) netip.Addr { return netip.AddrFrom4([4]byte(b[off : off+4])) }
	ev := Event{
		Time:    r.boot.Add(time.Duration(ne.Uint64(b[0:]))),
		Latency: time.Duration(ne.Uint64(b[8:])),
		Rules:   l7table.Masks{ne.Uint64(b[16:]), ne.Uint64(b[24:])},
		Client:  netip.AddrPortFrom(addr(32), ne.Uint16(b[40:])),
		Server:  netip.AddrPortFrom(addr(36), ne.Uint16(b[42:])),
		Table:   ne.Uint32(b[44:]),
		Status:  int(ne.Uint16(b[48:])),
		Verdict: Kind(b[51]),
		Path:    cBytes(b[56 : 56+64]),
		Host:    cBytes(b[120 : 120+32]),
	}
	if m := int(b[50]); m < len(l7table.Methods) {
		ev.Method = l7table.Methods[m]
	}
	return ev, nil
}

func cBytes(b []byte) string {
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return string(b)
}

// PinNames returns the names of the pins the verdict makes in the dataplane's pin
// directory: every map the object pins by name (read from the object) and the sockops link.
func PinNames() ([]string, error) {
	spec, err := loadSockverdict()
	if err != nil {
		return nil, fmt.Errorf("reading the send-side verdict's pins: %w", err)
	}
	names := []string{sockopsLinkPin}
	for name, m := range spec.Maps {
		if m.Pinning == ebpf.PinByName {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// Programs returns the verdict's programs (for the memory of the maps they use without
// pinning them: datapath.(*Datapath).MapMemory).
func (s *Verdict) Programs() []*ebpf.Program {
	o := &s.objs.sockverdictPrograms
	return []*ebpf.Program{o.SvSockops, o.SvRequest, o.SvResponse}
}

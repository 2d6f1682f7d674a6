package datapath

import (
	"encoding/binary"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"

	"github.com/rampartnet/rampart/internal/cidrtable"
	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/testenv"
)

// tc verdicts.
const (
	actOK   = 0
	actShot = 2
)

// newPinDir makes a fresh pin directory on bpffs, removed at cleanup, for tests that pin
// maps of their own before a Datapath opens there.
func newPinDir(t *testing.T) string {
	t.Helper()
	testenv.RequireRoot(t)
	pin := filepath.Join(BPFFSRoot, "rampart-test-"+testenv.Suffix(8))
	if err := os.MkdirAll(pin, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(pin) })
	return pin
}

// testHostSlots is the CIDR host table bound of test CIDR set tables.
const testHostSlots = 1 << 16

// cidrOf opens CIDR set tables over d's maps, host tables bounded by slots (0:
// testHostSlots), closed at cleanup (before d, opened earlier).
func cidrOf(t testing.TB, d *Datapath, slots uint32) *cidrtable.Tables {
	t.Helper()
	if slots == 0 {
		slots = testHostSlots
	}
	ct, err := cidrtable.Open(cidrtable.Maps(d.Pins.CIDRMaps()), slots)
	if err != nil {
		t.Fatalf("opening CIDR set tables: %v", err)
	}
	t.Cleanup(ct.Close)
	return ct
}

// openTest opens a Datapath pinned in a fresh directory and removes it at cleanup.
func openTest(t testing.TB, cfg Config) *Datapath {
	t.Helper()
	testenv.RequireRoot(t)
	if cfg.PinDir == "" {
		cfg.PinDir = filepath.Join(BPFFSRoot, "rampart-test-"+testenv.Suffix(8))
	}
	d, err := Open(cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() {
		if err := d.Remove(); err != nil {
			t.Errorf("Remove: %v", err)
		}
	})
	return d
}

// Packets for BPF_PROG_RUN. Checksums are left zero: the programs never look at them.

type packet struct {
	ethType    uint16 // default IPv4
	src, dst   netip.Addr
	proto      uint8
	sport      uint16
	dport      uint16
	tcpFlags   uint8
	icmpType   uint8
	icmpID     uint16
	ipOptions  []byte // padded to a multiple of 4
	ipID       uint16
	mf         bool
	fragOffset uint16 // in 8-byte units; non-zero: a later fragment (payload only)
	payload    []byte
	quoted     []byte // ICMP errors: the quoted packet (IP header + 8 bytes)
	// Overrides for malformed packets.
	ihl    int // header length in 32-bit words; 0: computed
	totLen int // 0: computed
	l4     []byte
}

func addr(s string) netip.Addr { return netip.MustParseAddr(s) }

func (p packet) l4Bytes() []byte {
	if p.l4 != nil {
		return p.l4
	}
	if p.fragOffset != 0 {
		return nil
	}
	switch p.proto {
	case uint8(policy.ProtoTCP):
		b := make([]byte, 20)
		binary.BigEndian.PutUint16(b[0:], p.sport)
		binary.BigEndian.PutUint16(b[2:], p.dport)
		b[12] = 5 << 4
		b[13] = p.tcpFlags
		return b
	case uint8(policy.ProtoUDP):
		b := make([]byte, 8)
		binary.BigEndian.PutUint16(b[0:], p.sport)
		binary.BigEndian.PutUint16(b[2:], p.dport)
		binary.BigEndian.PutUint16(b[4:], uint16(8+len(p.payload)))
		return b
	case uint8(policy.ProtoSCTP):
		b := make([]byte, 12)
		binary.BigEndian.PutUint16(b[0:], p.sport)
		binary.BigEndian.PutUint16(b[2:], p.dport)
		return b
	case uint8(policy.ProtoICMP):
		b := make([]byte, 8)
		b[0] = p.icmpType
		binary.BigEndian.PutUint16(b[4:], p.icmpID)
		return append(b, p.quoted...)
	}
	return nil
}

// ipv4 returns the IP datagram (header, options, L4, payload).
func (p packet) ipv4() []byte {
	opts := append([]byte(nil), p.ipOptions...)
	for len(opts)%4 != 0 {
		opts = append(opts, 0) // end of options list
	}
	body := append(p.l4Bytes(), p.payload...)
	ihl := 5 + len(opts)/4
	if p.ihl != 0 {
		ihl = p.ihl
	}
	tot := 20 + len(opts) + len(body)
	if p.totLen != 0 {
		tot = p.totLen
	}
	h := make([]byte, 20)
	h[0] = 4<<4 | byte(ihl&0xf)
	binary.BigEndian.PutUint16(h[2:], uint16(tot))
	binary.BigEndian.PutUint16(h[4:], p.ipID)
	frag := p.fragOffset & 0x1fff
	if p.mf {
		frag |= 0x2000
	}
	binary.BigEndian.PutUint16(h[6:], frag)
	h[8] = 64
	h[9] = p.proto
	s, d := p.src.As4(), p.dst.As4()
	copy(h[12:], s[:])
	copy(h[16:], d[:])
	out := append(h, opts...)
	return append(out, body...)
}

func (p packet) bytes() []byte {
	eth := make([]byte, 14)
	copy(eth[0:], []byte{0x02, 0, 0, 0, 0, 1})
	copy(eth[6:], []byte{0x02, 0, 0, 0, 0, 2})
	et := p.ethType
	if et == 0 {
		et = 0x0800
	}
	binary.BigEndian.PutUint16(eth[12:], et)
	if et != 0x0800 {
		return append(eth, p.payload...)
	}
	return append(eth, p.ipv4()...)
}

// ct4Key is the conntrack key of p's flow at endpoint ep when p travels in direction dir:
// the endpoint's side first (the source when leaving the endpoint, else the destination),
// addresses and ports in network byte order, as the programs store them.
func ct4Key(p packet, ep uint32, dir uint8) rampartCt4Key {
	s, d := p.src.As4(), p.dst.As4()
	local, remote := binary.NativeEndian.Uint32(s[:]), binary.NativeEndian.Uint32(d[:])
	lport, rport := htons(p.sport), htons(p.dport)
	if dir != uint8(policy.Egress) {
		local, remote, lport, rport = remote, local, rport, lport
	}
	return rampartCt4Key{Laddr: local, Raddr: remote, Lport: lport, Rport: rport, EpId: ep, Protocol: p.proto}
}

// skbContext is the start of struct __sk_buff up to ifindex: BPF_PROG_RUN takes the
// packet's interface from ctx.ifindex (the device must exist in the caller's network
// namespace; 0 or 1 means loopback) and its mark from ctx.mark. All other fields must be
// zero.
type skbContext struct {
	Len     uint32
	PktType uint32
	Mark    uint32
	Fields  [7]uint32 // queue_mapping .. ingress_ifindex
	Ifindex uint32
	Rest    [1]uint32 // tc_index
}

// run runs prog on data as if received on ifindex (0: loopback, ifindex 1).
func run(t *testing.T, prog *ebpf.Program, data []byte, ifindex uint32) uint32 {
	t.Helper()
	ret, _ := runCtx(t, prog, data, skbContext{Ifindex: ifindex})
	return ret
}

// runCtx runs prog on data with the __sk_buff fields of ctx (ifindex 0 or 1: loopback) and
// returns the verdict and the mark the program left on the packet.
func runCtx(t *testing.T, prog *ebpf.Program, data []byte, ctx skbContext) (uint32, uint32) {
	t.Helper()
	if ctx.Ifindex <= 1 {
		ctx.Ifindex = 0
	}
	// The kernel writes the whole __sk_buff back, so the output buffer is larger than the
	// fields we pass in.
	out := make([]byte, 256)
	ret, err := prog.Run(&ebpf.RunOptions{Data: data, Context: ctx, ContextOut: out})
	if err != nil {
		t.Fatalf("BPF_PROG_RUN: %v", err)
	}
	return ret, binary.NativeEndian.Uint32(out[8:12])
}

// eventsOf opens an event reader closed at cleanup.
func eventsOf(t *testing.T, d *Datapath) *EventReader {
	t.Helper()
	r, err := d.Events.Reader()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// nextEvent waits (bounded) for the next event.
func nextEvent(t *testing.T, r *EventReader) flow.Event {
	t.Helper()
	r.SetDeadline(time.Now().Add(2 * time.Second))
	e, err := r.Read()
	if err != nil {
		t.Fatalf("reading event: %v", err)
	}
	return e
}

// noEvent checks that no event is pending.
func noEvent(t *testing.T, r *EventReader) {
	t.Helper()
	r.SetDeadline(time.Now().Add(50 * time.Millisecond))
	e, err := r.Read()
	if err == nil {
		t.Fatalf("unexpected event %+v", e)
	}
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("reading event: %v", err)
	}
}

// Convenience constructors for policy entries.

func allow(id identity.Identity, dir policy.Direction, proto policy.Protocol, port uint16, plen uint8, rule uint32) (mapstate.Key, mapstate.Value) {
	return mapstate.Key{Identity: id, Direction: dir, Protocol: proto, Port: port, PortPrefixLen: plen},
		mapstate.Value{RuleID: rule}
}

func deny(id identity.Identity, dir policy.Direction, proto policy.Protocol, port uint16, plen uint8, rule uint32) (mapstate.Key, mapstate.Value) {
	k, v := allow(id, dir, proto, port, plen, rule)
	v.Deny = true
	return k, v
}

type entry struct {
	k mapstate.Key
	v mapstate.Value
}

func e(k mapstate.Key, v mapstate.Value) entry { return entry{k, v} }

func entries(es ...entry) map[mapstate.Key]mapstate.Value {
	m := make(map[mapstate.Key]mapstate.Value, len(es))
	for _, x := range es {
		m[x.k] = x.v
	}
	return m
}

// The program groups loaded on first use (programs.go), for tests that run them directly;
// a group that fails to load panics the test.
func (d *Datapath) hostProgsT() *hostPrograms {
	return must(programs(d.handle, (*dataplaneObjects).hostProgs))
}

func (d *Datapath) vxlanProgsT() *vxlanPrograms {
	return must(programs(d.handle, (*dataplaneObjects).vxlanProgs))
}

func (d *Datapath) ipipProgsT() *ipipPrograms {
	return must(programs(d.handle, (*dataplaneObjects).ipipProgs))
}

func must[P any](p *P, err error) *P {
	if err != nil {
		panic(err)
	}
	return p
}

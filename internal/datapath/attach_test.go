package datapath

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/testenv"
)

func TestParseAttachMode(t *testing.T) {
	for in, want := range map[string]AttachMode{"": AttachTC, "tc": AttachTC, "tcx": AttachTCX} {
		if got, err := ParseAttachMode(in); err != nil || got != want {
			t.Errorf("ParseAttachMode(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseAttachMode("xdp"); err == nil {
		t.Error("ParseAttachMode(xdp): no error")
	}
}

// TestAttachModeSwitch: agents restarted with the other attach mode (tcx, tc, tcx, tc)
// move each endpoint over with no moment where a hook runs no program. Four UDP flows,
// each denied by exactly one of the four hooks (the ingress and egress of both endpoints'
// veths), are sent without pause all along and none gets through; an established TCP
// connection and new allowed ones keep working. With a TCX link and a tc filter both on a
// hook, the TCX program's verdict ends the hook: a tc filter that drops every packet is
// never reached.
func TestAttachModeSwitch(t *testing.T) {
	node, suffix := newNode(t, "rpm")
	a := addEndpoint(t, node, "rpm-"+suffix+"-a", "rma"+suffix, addr("198.18.30.2"), addr("198.18.30.1"))
	b := addEndpoint(t, node, "rpm-"+suffix+"-b", "rmb"+suffix, addr("198.18.40.2"), addr("198.18.40.1"))
	pinDir := newPinDir(t)
	open := func(mode AttachMode) *Datapath {
		t.Helper()
		d, err := Open(Config{PinDir: pinDir, Attach: mode})
		if err != nil {
			t.Fatalf("opening with --attach=%s: %v", mode, err)
		}
		return d
	}
	d := open(AttachTCX)
	current := d
	t.Cleanup(func() {
		if err := current.Remove(); err != nil {
			t.Errorf("Remove: %v", err)
		}
	})
	attachAll(t, d, node, a, b)

	const idA, idB = identity.Identity(1001), identity.Identity(1002)
	twoEndpointIPCache(t, d, a, b, idA, idB)
	// UDP a->b :9001 is denied by a's egress only (from_ep on a's veth), a->b :9002 by b's
	// ingress only (to_ep on b's veth), b->a :9003 by b's egress only, b->a :9004 by a's
	// ingress only. TCP :8080 a->b is allowed.
	const port = 8080
	polA := mapstate.EndpointPolicy{EnforceEgress: true, EnforceIngress: true, Entries: entries(
		e(allow(idB, out, tcp, port, 16, 1)), e(allow(idB, out, udp, 9002, 16, 2)), e(allow(idB, in, udp, 9003, 16, 3)))}
	polB := mapstate.EndpointPolicy{EnforceEgress: true, EnforceIngress: true, Entries: entries(
		e(allow(idA, in, tcp, port, 16, 4)), e(allow(idA, in, udp, 9001, 16, 5)), e(allow(idA, out, udp, 9004, 16, 6)))}
	if err := d.Endpoints.ApplyEndpoint(a.ifindex, EndpointInfo{EpID: 1, Identity: idA, Addr: a.ip}, polA); err != nil {
		t.Fatal(err)
	}
	if err := d.Endpoints.ApplyEndpoint(b.ifindex, EndpointInfo{EpID: 2, Identity: idB, Addr: b.ip}, polB); err != nil {
		t.Fatal(err)
	}

	server := netip.AddrPortFrom(b.ip, port)
	echoServer(t, b.ns, server)
	c1, err := dial(a.ns, server, 5*time.Second)
	if err != nil {
		t.Fatalf("allowed connection: %v", err)
	}
	t.Cleanup(func() { c1.Close() })
	checkTCP := func(step string) {
		t.Helper()
		if err := roundTrip(c1, step); err != nil {
			t.Fatalf("%s: established connection: %v", step, err)
		}
		c, err := dial(a.ns, server, 5*time.Second)
		if err != nil {
			t.Fatalf("%s: new allowed connection: %v", step, err)
		}
		defer c.Close()
		if err := roundTrip(c, step); err != nil {
			t.Fatalf("%s: new allowed connection: %v", step, err)
		}
	}

	type flow struct {
		from, to *trafficEndpoint
		port     uint16
		got      atomic.Int64
		conn     net.Conn
	}
	flows := []*flow{{from: a, to: b, port: 9001}, {from: a, to: b, port: 9002}, {from: b, to: a, port: 9003}, {from: b, to: a, port: 9004}}
	for _, f := range flows {
		f.conn = udpFlow(t, f.from, f.to, f.port, &f.got)
	}
	sendAll := func() {
		for _, f := range flows {
			f.conn.Write([]byte("denied")) // errors (none expected) show as nothing received
		}
	}
	var sent atomic.Int64
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			sendAll()
			sent.Add(1)
		}
	}()
	stopped := false
	stopSending := func() {
		if !stopped {
			stopped = true
			close(stop)
			<-done
		}
	}
	t.Cleanup(stopSending)
	// waitSent waits until the sender has sent n more rounds, so that every step runs
	// under traffic.
	waitSent := func(step string, n int64) {
		t.Helper()
		until, deadline := sent.Load()+n, time.Now().Add(5*time.Second)
		for sent.Load() < until {
			if time.Now().After(deadline) {
				t.Fatalf("%s: the sender sent %d rounds, want %d", step, sent.Load(), until)
			}
			time.Sleep(time.Millisecond) // polling the counter
		}
	}
	waitSent("tcx", 50)
	checkTCP("tcx")

	// a's hooks get a tc filter that drops everything beside the TCX links (the state
	// between the two steps of a move to tc): the TCX verdict ends the hook, so allowed
	// traffic still flows. The move to tc below replaces the filter (same priority and
	// handle) with Rampart's.
	shot := dropProgram(t)
	attachClsBPF(t, node, a.hostIf, shot, shot)
	waitSent("tcx with a dropping tc filter", 50)
	checkTCP("tcx with a dropping tc filter")

	for i, mode := range []AttachMode{AttachTC, AttachTCX, AttachTC} {
		step := fmt.Sprintf("move %d to %s", i+1, mode)
		if err := current.Close(); err != nil {
			t.Fatal(err)
		}
		waitSent(step+", agent stopped", 50)
		d = open(mode)
		current = d
		for _, ep := range []*trafficEndpoint{a, b} {
			if _, err := d.Endpoints.Attach(node, ep.hostIf); err != nil {
				t.Fatalf("%s: attaching to %s: %v", step, ep.hostIf, err)
			}
			checkFilters(t, node, ep.hostIf, mode, 1)
		}
		pins, err := filepath.Glob(filepath.Join(pinDir, tcxPinDir, "*"))
		if err != nil {
			t.Fatal(err)
		}
		if wantPins := map[AttachMode]int{AttachTC: 0, AttachTCX: 4}[mode]; len(pins) != wantPins {
			t.Errorf("%s: link pins %v, want %d", step, pins, wantPins)
		}
		waitSent(step, 50)
		checkTCP(step)
	}
	stopSending()
	for _, f := range flows {
		if n := f.got.Load(); n != 0 {
			t.Errorf("UDP %v -> %v:%d: %d of %d datagrams got through", f.from.ip, f.to.ip, f.port, n, sent.Load())
		}
	}

	// The receivers work: with the programs gone, every flow gets through.
	for _, ep := range []*trafficEndpoint{a, b} {
		if err := d.Endpoints.Detach(node, ep.hostIf); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for _, f := range flows {
		for f.got.Load() == 0 {
			if time.Now().After(deadline) {
				t.Fatalf("UDP %v -> %v:%d: nothing received without programs", f.from.ip, f.to.ip, f.port)
			}
			f.conn.Write([]byte("open"))
			time.Sleep(10 * time.Millisecond) // polling the receiver
		}
	}
}

// echoServer serves TCP echo at address at in namespace ns until the test ends.
func echoServer(t *testing.T, ns string, at netip.AddrPort) {
	t.Helper()
	serveTCP(t, ns, at.String(), func(c net.Conn) { io.Copy(c, c) })
}

// serveTCP runs handle on each connection to address at in namespace ns (closing it
// after) until the test ends.
func serveTCP(t testing.TB, ns string, at string, handle func(net.Conn)) {
	t.Helper()
	var ln net.Listener
	network := "tcp4"
	if ap, err := netip.ParseAddrPort(at); err == nil && ap.Addr().Is6() {
		network = "tcp6"
	}
	if err := testenv.InNetns(ns, func() error {
		var err error
		ln, err = net.Listen(network, at)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
}

// twoEndpointIPCache maps a's and b's addresses to idA and idB, their gateways to the
// host, and everything else to the world.
func twoEndpointIPCache(t *testing.T, d *Datapath, a, b *trafficEndpoint, idA, idB identity.Identity) {
	t.Helper()
	err := d.IPCache.ApplyIPCache(map[netip.Prefix]mapstate.IPCacheEntry{
		netip.MustParsePrefix("0.0.0.0/0"): {Identity: identity.World},
		netip.PrefixFrom(a.ip, 32):         {Identity: idA},
		netip.PrefixFrom(b.ip, 32):         {Identity: idB},
		netip.PrefixFrom(a.gw, 32):         {Identity: identity.Host},
		netip.PrefixFrom(b.gw, 32):         {Identity: identity.Host},
	})
	if err != nil {
		t.Fatal(err)
	}
}

// udpFlow listens on to's address and port, counting datagrams into got, and returns a
// UDP socket of from's connected to it; both close when the test ends.
func udpFlow(t *testing.T, from, to *trafficEndpoint, port uint16, got *atomic.Int64) net.Conn {
	t.Helper()
	at := netip.AddrPortFrom(to.ip, port)
	var pc net.PacketConn
	if err := testenv.InNetns(to.ns, func() error {
		var err error
		pc, err = net.ListenPacket("udp4", at.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 64)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			got.Add(1)
		}
	}()
	var c net.Conn
	if err := testenv.InNetns(from.ns, func() error {
		var err error
		c, err = net.Dial("udp4", at.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// dropProgram loads a tc program that drops every packet (TC_ACT_SHOT).
func dropProgram(t *testing.T) *ebpf.Program {
	t.Helper()
	p, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "test_drop_all", Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2), asm.Return()}, // TC_ACT_SHOT
	})
	if err != nil {
		t.Fatalf("loading the dropping program: %v", err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

package datapath

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/flow"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/l7plan"
	"github.com/rampartnet/rampart/internal/l7table"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/sockverdict"
	"github.com/rampartnet/rampart/internal/testenv"
)

// TestSockVerdictSteering: the dataplane and the send-side verdict together, between two
// endpoints behind their veths, with no proxy at all. The server's ingress policy
// redirects the client's port-80 connections; once the pair is listed, they go straight
// to the server and its L7 rules are checked on the client's socket; a segment forged on
// a raw socket with the connection's addresses and ports is dropped (l7-unchecked); a
// listed pair without the verdict's targets cannot carry data.
func TestSockVerdictSteering(t *testing.T) {
	node, suffix := newNode(t, "rsv")
	a := addEndpoint(t, node, "rsv-"+suffix+"-a", "rsa"+suffix, addr("198.18.30.2"), addr("198.18.30.1"))
	b := addEndpoint(t, node, "rsv-"+suffix+"-b", "rsb"+suffix, addr("198.18.40.2"), addr("198.18.40.1"))
	d := openTest(t, Config{})
	attachAll(t, d, node, a, b)
	const idEpA, idEpB = identity.Identity(1001), identity.Identity(1002)
	const epA, epB = 1, 2
	if err := d.IPCache.ApplyIPCache(map[netip.Prefix]mapstate.IPCacheEntry{
		netip.MustParsePrefix("0.0.0.0/0"): {Identity: identity.World},
		netip.PrefixFrom(a.ip, 32):         {Identity: idEpA, EndpointID: epA},
		netip.PrefixFrom(b.ip, 32):         {Identity: idEpB, EndpointID: epB},
		netip.PrefixFrom(a.gw, 32):         {Identity: identity.Host},
		netip.PrefixFrom(b.gw, 32):         {Identity: identity.Host},
	}); err != nil {
		t.Fatal(err)
	}
	const port = 80
	polA := mapstate.EndpointPolicy{EnforceEgress: true, Entries: entries(e(allow(idEpB, out, tcp, port, 16, 1)))}
	polB := mapstate.EndpointPolicy{EnforceIngress: true, Entries: entries(e(redirect(idEpA, in, tcp, port, 16, 11)))}
	if err := d.Endpoints.ApplyEndpoint(a.ifindex, EndpointInfo{EpID: epA, Identity: idEpA, Addr: a.ip}, polA); err != nil {
		t.Fatal(err)
	}
	if err := d.Endpoints.ApplyEndpoint(b.ifindex, EndpointInfo{EpID: epB, Identity: idEpB, Addr: b.ip}, polB); err != nil {
		t.Fatal(err)
	}
	evs := collectEvents(t, d)
	server := netip.AddrPortFrom(b.ip, port)

	var ln net.Listener
	if err := testenv.InNetns(b.ns, func() (err error) { ln, err = net.Listen("tcp4", server.String()); return err }); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s from %s", r.Method, r.URL.Path, r.RemoteAddr)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })

	// Without a proxy and without the pair listed, the redirected port is refused.
	if c, err := dial(a.ns, server, 2*time.Second); err == nil {
		c.Close()
		t.Fatalf("connected to the L7 port with no proxy and no send-side verdict")
	}
	evs.wait(t, "proxy-unavailable drop", func(e flow.Event) bool { return e.Reason == flow.ReasonProxyUnavailable })

	// The verdict's tables and targets, then the pair for tc.
	sv := openSockVerdict(t, d.Pins.PinDir())
	plan := &l7plan.Plan{Chains: []l7plan.Chain{{Name: "c", Port: port, Dst: b.ip, Ingress: &l7plan.Authz{
		EndpointID: epB, Direction: policy.Ingress, Port: port,
		Grants: []l7plan.Grant{{Name: "rule-11-0", RuleID: 11, Peers: l7plan.AddrSet{{Prefix: netip.PrefixFrom(a.ip, 32)}},
			HTTP: []policy.HTTPRule{{Method: "GET", Path: "/v1"}}}},
	}}}}
	tab, err := l7table.Compile(plan, a.ip, b.ip, port)
	if err != nil {
		t.Fatal(err)
	}
	if err := sv.SetSlot(1, tab); err != nil {
		t.Fatal(err)
	}
	type target struct {
		ns            string
		local, remote netip.Addr
		side          int
	}
	targets := []target{{a.ns, a.ip, b.ip, sockverdict.SideClient}, {b.ns, b.ip, a.ip, sockverdict.SideServer}}
	cookies := map[string]uint64{}
	for _, tg := range targets {
		cookie, err := sockverdict.NetnsCookie(tg.ns)
		if err != nil {
			t.Fatal(err)
		}
		cookies[tg.ns] = cookie
		if err := sv.SetTarget(cookie, tg.local, tg.remote, port, tg.side, 1); err != nil {
			t.Fatal(err)
		}
	}
	pairs, err := sockverdict.NewPairs(d.Pins.SockPairsMap())
	if err != nil {
		t.Fatal(err)
	}
	if err := pairs.Set(a.ip, b.ip, port, 1); err != nil {
		t.Fatal(err)
	}

	c, err := dial(a.ns, server, 2*time.Second)
	if err != nil {
		t.Fatalf("connecting to a listed pair: %v", err)
	}
	defer c.Close()
	evs.wait(t, "the new flow, checked by the send-side verdict", func(e flow.Event) bool {
		return e.Type == flow.EventNew && e.Flags.Has(flow.FlagSendSide) && e.Verdict == flow.VerdictForwarded && e.DestinationPort == port
	})
	r := bufio.NewReader(c)
	exchange := func(req string) (int, string) {
		t.Helper()
		c.SetDeadline(time.Now().Add(3 * time.Second))
		if _, err := c.Write([]byte(req)); err != nil {
			t.Fatalf("%q: %v", req, err)
		}
		resp, err := http.ReadResponse(r, nil)
		if err != nil {
			t.Fatalf("%q: reading the response: %v", req, err)
		}
		defer resp.Body.Close()
		buf := make([]byte, 256)
		n, _ := resp.Body.Read(buf)
		return resp.StatusCode, string(buf[:n])
	}
	client := c.LocalAddr().(*net.TCPAddr).AddrPort()
	if st, body := exchange("GET /v1 HTTP/1.1\r\nHost: b\r\n\r\n"); st != 200 || body != "GET /v1 from "+client.String() {
		t.Fatalf("GET /v1: %d %q (the server must see the client's own address)", st, body)
	}
	if st, _ := exchange("DELETE /v1 HTTP/1.1\r\nHost: b\r\n\r\n"); st != 403 {
		t.Fatalf("DELETE /v1: %d", st)
	}

	// A data segment forged on a raw socket, on the checked connection's addresses and
	// ports: tc drops it, because it does not come from the socket the verdict checks.
	from := evs.count()
	if err := testenv.InNetns(a.ns, func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_TCP)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		payload := "DELETE /v1 HTTP/1.1\r\nHost: b\r\n\r\n"
		seg := make([]byte, 20, 20+len(payload))
		binary.BigEndian.PutUint16(seg[0:], client.Port())
		binary.BigEndian.PutUint16(seg[2:], port)
		binary.BigEndian.PutUint32(seg[4:], 1)
		seg[12] = 5 << 4 // data offset: 20 bytes
		seg[13] = 0x18   // PSH, ACK
		binary.BigEndian.PutUint16(seg[14:], 65535)
		seg = append(seg, payload...)
		return unix.Sendto(fd, seg, 0, &unix.SockaddrInet4{Addr: b.ip.As4()})
	}); err != nil {
		t.Fatalf("raw socket: %v", err)
	}
	evs.waitFrom(t, from, "the forged segment's drop", func(e flow.Event) bool {
		return e.Type == flow.EventDrop && e.Reason == flow.ReasonL7Unchecked && e.SourcePort == client.Port()
	})
	// The connection itself goes on.
	if st, _ := exchange("GET /v1 HTTP/1.1\r\nHost: b\r\n\r\n"); st != 200 {
		t.Fatalf("GET /v1 after the forgery: %d", st)
	}

	// A listed pair whose sockets the verdict does not take (no targets): the handshake
	// passes tc, but no data does.
	for _, tg := range targets {
		if err := sv.DeleteTarget(cookies[tg.ns], tg.local, tg.remote, port, tg.side); err != nil {
			t.Fatal(err)
		}
	}
	c2, err := dial(a.ns, server, 2*time.Second)
	if err != nil {
		t.Fatalf("connecting without targets: %v", err)
	}
	defer c2.Close()
	c2.SetDeadline(time.Now().Add(time.Second))
	c2.Write([]byte("DELETE /v1 HTTP/1.1\r\nHost: b\r\n\r\n"))
	if n, err := c2.Read(make([]byte, 64)); err == nil {
		t.Fatalf("unchecked connection got %d bytes of answer", n)
	}
	evs.wait(t, "the unchecked data's drop", func(e flow.Event) bool {
		return e.Type == flow.EventDrop && e.Reason == flow.ReasonL7Unchecked && e.SourcePort == c2.LocalAddr().(*net.TCPAddr).AddrPort().Port()
	})
}

// openSockVerdict opens the send-side verdict pinned in pinDir (beside the dataplane's
// maps, as the agent does) and removes it at cleanup.
func openSockVerdict(t *testing.T, pinDir string) *sockverdict.Verdict {
	t.Helper()
	cg, err := sockverdict.Cgroup2Root()
	if err != nil {
		t.Fatal(err)
	}
	sv, err := sockverdict.Open(cg, pinDir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := sv.Remove(); err != nil {
			t.Errorf("removing the send-side verdict: %v", err)
		}
	})
	return sv
}

package dnsproxy

import (
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"

	"github.com/rampartnet/rampart/internal/testenv"
)

// TestTransparent checks transparent mode end to end without BPF: a pod namespace asks a
// DNS server address that exists nowhere (198.18.78.53:53); in the node namespace an
// iptables TPROXY rule hands its UDP and TCP packets, untouched, to the proxy's sockets
// on 127.0.0.1, as bpf_sk_assign does. The proxy must see the original destination, ask
// the test server from the node with its mark, and answer from 198.18.78.53:53, or the
// pod's resolver would not take the answer.
func TestTransparent(t *testing.T) {
	testenv.RequireRoot(t)
	for _, tool := range []string{"ip", "iptables", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.SkipOrFail(t, "%s not found", tool)
		}
	}
	sfx := testenv.Suffix(6)
	nodeName, podName := "rdp-n-"+sfx, "rdp-p-"+sfx
	node := testenv.NewNetns(t, nodeName)
	pod := testenv.NewNetns(t, podName)
	sh := func(ns string, args ...string) string {
		t.Helper()
		out, err := testenv.Shell(ns, args...)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	nodeIf, podIf := "rdpn"+sfx, "rdpp"+sfx
	sh(node, "ip", "link", "set", "lo", "up")
	sh(node, "ip", "link", "add", nodeIf, "type", "veth", "peer", "name", podIf, "netns", podName)
	sh(node, "ip", "addr", "add", "198.18.77.1/24", "dev", nodeIf)
	sh(node, "ip", "link", "set", nodeIf, "up")
	sh(pod, "ip", "link", "set", "lo", "up")
	sh(pod, "ip", "addr", "add", "198.18.77.2/24", "dev", podIf)
	sh(pod, "ip", "link", "set", podIf, "up")
	sh(pod, "ip", "route", "add", "default", "via", "198.18.77.1")
	nh, ph := testenv.NetlinkHandle(t, node), testenv.NetlinkHandle(t, pod)
	eventually(t, "veth up", func() bool {
		a, err1 := nh.LinkByName(nodeIf)
		b, err2 := ph.LinkByName(podIf)
		return err1 == nil && err2 == nil && a.Attrs().OperState == netlink.OperUp && b.Attrs().OperState == netlink.OperUp
	})

	srv := startServer(t, node, netip.MustParseAddrPort("127.0.0.1:0"))
	pol := &testPolicy{}
	const mark = 0x2
	p := startProxy(t, Config{
		ListenAddr: netip.MustParseAddrPort("127.0.0.1:0"), Transparent: true, Netns: node, UpstreamMark: mark,
	}, pol, srv.addr)

	// Steering: DNS from the pod's veth to the proxy's sockets; the steered packets are
	// delivered locally by the mark's routing table.
	sh(node, "ip", "rule", "add", "fwmark", "0x1/0x1", "lookup", "101")
	sh(node, "ip", "route", "add", "local", "0.0.0.0/0", "dev", "lo", "table", "101")
	for _, proto := range []string{"udp", "tcp"} {
		if _, err := testenv.Shell(node, "iptables", "-w", "-t", "mangle", "-A", "PREROUTING", "-i", nodeIf, "-p", proto,
			"--dport", "53", "-j", "TPROXY", "--on-ip", "127.0.0.1", "--on-port", strconv.Itoa(int(p.Addr().Port())),
			"--tproxy-mark", "0x1/0x1"); err != nil {
			testenv.SkipOrFail(t, "iptables TPROXY: %v", err)
		}
	}
	// Counts the upstream packets that carry the mark.
	sh(node, "iptables", "-w", "-t", "mangle", "-A", "OUTPUT", "-m", "mark", "--mark", fmt.Sprint(mark),
		"-d", srv.addr.Addr().String(), "-m", "comment", "--comment", "rdp-upstream")

	server := netip.MustParseAddrPort("198.18.78.53:53")
	podAddr := netip.MustParseAddr("198.18.77.2")

	t.Run("udp", func(t *testing.T) {
		var pc net.PacketConn
		if err := testenv.InNetns(pod, func() error {
			var err error
			pc, err = net.ListenPacket("udp4", "0.0.0.0:0")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		for _, c := range []struct {
			name  string
			rcode int
		}{{nameChain, dns.RcodeSuccess}, {"denied.example.com", dns.RcodeRefused}} {
			r, from := exchangeFrom(t, pc, server, c.name)
			if from != server {
				t.Errorf("%s: answer from %v, want %v", c.name, from, server)
			}
			if r.Rcode != c.rcode {
				t.Errorf("%s: answer %v", c.name, r)
			}
		}
	})

	t.Run("tcp", func(t *testing.T) {
		c, err := testenv.Dial(pod, "tcp", server, waitFor)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(waitFor))
		co := &dns.Conn{Conn: c}
		for _, name := range []string{nameDirect, nameChain} {
			m := new(dns.Msg)
			m.SetQuestion(name+".", dns.TypeA)
			if err := co.WriteMsg(m); err != nil {
				t.Fatal(err)
			}
			if r, err := co.ReadMsg(); err != nil || r.Rcode != dns.RcodeSuccess || len(answerAddrs(r)) == 0 {
				t.Errorf("%s: answer %v, %v", name, r, err)
			}
		}
	})

	// What the proxy saw: every query with its original destination and the pod's address.
	pol.mu.Lock()
	seen := slices.Clone(pol.allowed)
	pol.mu.Unlock()
	if len(seen) != 4 {
		t.Errorf("Allow called %d times, want 4", len(seen))
	}
	for _, q := range seen {
		if q.Server != server || q.Source.Addr() != podAddr {
			t.Errorf("query %+v: want server %v from %v", q, server, podAddr)
		}
	}
	if l := pol.learns(); len(l) != 3 || l[0].q.Protocol != ProtoUDP || l[1].q.Protocol != ProtoTCP {
		t.Errorf("learnt %+v", l)
	}
	if n := srv.count(nameChain); n != 2 {
		t.Errorf("server asked %s %d times, want 2", nameChain, n)
	}
	out := sh(node, "iptables", "-w", "-t", "mangle", "-L", "OUTPUT", "-v", "-x", "-n")
	if m := regexp.MustCompile(`(?m)^\s*(\d+).*rdp-upstream`).FindStringSubmatch(out); m == nil || m[1] == "0" {
		t.Errorf("no upstream packet with mark %#x:\n%s", mark, out)
	}

	// Without steering, a query to a second local address of the node on the proxy's own
	// port: the answer must come from that address (IP_PKTINFO), not from the one the
	// routing table would pick for the client.
	sh(node, "ip", "addr", "add", "198.18.79.53/32", "dev", "lo")
	for _, transparent := range []bool{false, true} {
		t.Run(fmt.Sprintf("second address, transparent %v", transparent), func(t *testing.T) {
			p2 := startProxy(t, Config{ListenAddr: netip.MustParseAddrPort("0.0.0.0:0"), Transparent: transparent, Netns: node},
				&testPolicy{}, srv.addr)
			to := netip.AddrPortFrom(netip.MustParseAddr("198.18.79.53"), p2.Addr().Port())
			var pc net.PacketConn
			if err := testenv.InNetns(node, func() error {
				var err error
				pc, err = net.ListenPacket("udp4", "198.18.77.1:0")
				return err
			}); err != nil {
				t.Fatal(err)
			}
			defer pc.Close()
			r, from := exchangeFrom(t, pc, to, nameDirect)
			if from != to || r.Rcode != dns.RcodeSuccess {
				t.Errorf("answer %v from %v, want from %v", r, from, to)
			}
		})
	}
}

// TestTransparentIPv6 checks the IPv6 raw answer path (source address and port, checksum)
// in a namespace of its own with only ::1: ip6tables TPROXY hands queries to [::1]:53,
// where nothing listens, to the proxy on another port of ::1.
func TestTransparentIPv6(t *testing.T) {
	testenv.RequireRoot(t)
	for _, tool := range []string{"ip", "ip6tables", "nsenter"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.SkipOrFail(t, "%s not found", tool)
		}
	}
	ns := testenv.NewNetns(t, "rdp-6-"+testenv.Suffix(6))
	if out, err := testenv.Shell(ns, "ip", "link", "set", "lo", "up"); err != nil {
		t.Fatal(out, err)
	}
	nh := testenv.NetlinkHandle(t, ns)
	eventually(t, "::1", func() bool {
		lo, err := nh.LinkByName("lo")
		if err != nil {
			return false
		}
		as, _ := nh.AddrList(lo, netlink.FAMILY_V6)
		return len(as) > 0 && as[0].Flags&0x40 == 0 // not tentative
	})
	srv := startServer(t, ns, netip.MustParseAddrPort("[::1]:0"))
	pol := &testPolicy{}
	p := startProxy(t, Config{ListenAddr: netip.MustParseAddrPort("[::1]:0"), Transparent: true, Netns: ns}, pol, srv.addr)
	for _, args := range [][]string{
		{"ip", "-6", "rule", "add", "fwmark", "0x1/0x1", "lookup", "101"},
		{"ip", "-6", "route", "add", "local", "::/0", "dev", "lo", "table", "101"},
		{"ip6tables", "-w", "-t", "mangle", "-A", "PREROUTING", "-i", "lo", "-p", "udp", "--dport", "53", "-j", "TPROXY",
			"--on-ip", "::1", "--on-port", strconv.Itoa(int(p.Addr().Port())), "--tproxy-mark", "0x1/0x1"},
	} {
		if _, err := testenv.Shell(ns, args...); err != nil {
			testenv.SkipOrFail(t, "%v", err)
		}
	}
	var pc net.PacketConn
	if err := testenv.InNetns(ns, func() error {
		var err error
		pc, err = net.ListenPacket("udp6", "[::1]:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	server := netip.MustParseAddrPort("[::1]:53")
	r, from := exchangeFrom(t, pc, server, nameChain)
	if from != server || r.Rcode != dns.RcodeSuccess || len(answerAddrs(r)) != 2 {
		t.Errorf("answer %v from %v, want from %v", r, from, server)
	}
	if l := pol.learns(); len(l) != 1 || l[0].q.Server != server {
		t.Errorf("learnt %+v", l)
	}
}

// exchangeFrom sends a query for name (type A) from pc to server and returns the answer
// and the address it came from. The socket is not connected, so an answer from any
// source is seen.
func exchangeFrom(t *testing.T, pc net.PacketConn, server netip.AddrPort, name string) (*dns.Msg, netip.AddrPort) {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name+".", dns.TypeA)
	m.SetEdns0(1232, false)
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pc.WriteTo(b, net.UDPAddrFromAddrPort(server)); err != nil {
		t.Fatal(err)
	}
	pc.SetReadDeadline(time.Now().Add(waitFor))
	buf := make([]byte, 65535)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			t.Fatalf("no answer to %s from %v: %v", name, server, err)
		}
		r := new(dns.Msg)
		if r.Unpack(buf[:n]) != nil || r.Id != m.Id {
			continue
		}
		return r, addrPortOf(from)
	}
}

package egress

import (
	"errors"
	"math"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
)

func TestParseIperf(t *testing.T) {
	b, err := os.ReadFile("testdata/iperf3-tcp.json")
	if err != nil {
		t.Fatal(err)
	}
	r, err := parseIperf(b)
	if err != nil {
		t.Fatal(err)
	}
	if r.BitsPerSecond <= 1e9 || r.SenderBps < r.BitsPerSecond*0.9 || r.Seconds <= 0 || r.HostCPU <= 0 || r.RemoteCPU <= 0 {
		t.Errorf("TCP report %+v", r)
	}
	b, err = os.ReadFile("testdata/iperf3-udp.json")
	if err != nil {
		t.Fatal(err)
	}
	u, err := parseIperf(b)
	if err != nil {
		t.Fatal(err)
	}
	// The fixture lost 8.9 % of its datagrams: the receiver's rate is below the sender's.
	if u.LostPercent < 8 || u.LostPercent > 10 || u.BitsPerSecond >= u.SenderBps || u.BitsPerSecond < 0.85e9 || u.HostCPU < 50 {
		t.Errorf("UDP report %+v", u)
	}
	for _, bad := range []string{`{"error": "unable to connect to server: Connection refused"}`, `not json`, `{"end": {}}`} {
		if _, err := parseIperf([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
	if _, err := parseIperf([]byte(`{"error": "the server is busy running a test. try again later"}`)); err == nil || !strings.Contains(err.Error(), "busy") {
		t.Errorf("busy server: %v", err)
	}
}

func TestIperfRetryable(t *testing.T) {
	for msg, want := range map[string]bool{
		"iperf3: the server is busy running a test. try again later":          true,
		"iperf3: unable to receive control message: Connection reset by peer": true,
		"iperf3: unable to connect to server: Connection refused":             true,
		"iperf3: error - unable to write to stream socket: Broken pipe":       false,
		"parsing iperf3 JSON: unexpected end of JSON input":                   false,
	} {
		if got := iperfRetryable(errors.New(msg)); got != want {
			t.Errorf("%q: retryable %v, want %v", msg, got, want)
		}
	}
}

func TestParsePing(t *testing.T) {
	b, err := os.ReadFile("testdata/ping.txt")
	if err != nil {
		t.Fatal(err)
	}
	p, err := parsePing(b)
	if err != nil {
		t.Fatal(err)
	}
	// Replies 45, 44, 41, 40, 44 us: two of the five printed as 44 stand for 43.5-44.5,
	// and the median lies a quarter into that interval.
	want := Ping{Sent: 5, Received: 5, MeanUs: 42.8, P50Us: 43.75, P90Us: 45, P99Us: 45, MaxUs: 45}
	p.rtts = nil
	if !reflect.DeepEqual(p, want) {
		t.Errorf("got %+v, want %+v", p, want)
	}
	lossy := "64 bytes from 1.2.3.4: icmp_seq=2 ttl=63 time=1.50 ms\n\n--- x ---\n3 packets transmitted, 1 received, 66% packet loss, time 2ms\n"
	p, err = parsePing([]byte(lossy))
	if err != nil || p.Sent != 3 || p.Received != 1 || p.P50Us != 1500 {
		t.Errorf("lossy ping: %+v %v", p, err)
	}
	if _, err := parsePing([]byte("3 packets transmitted, 0 received, 100% packet loss\n")); err == nil {
		t.Error("no replies parsed")
	}
	if _, err := parsePing([]byte("ping: sendmsg: Operation not permitted\n")); err == nil {
		t.Error("no summary parsed")
	}
}

func TestEchoRequest(t *testing.T) {
	b := echoRequest(false, 0x1234, 7, 99)
	if b[0] != 8 || b[1] != 0 || checksum(b) != 0 {
		t.Errorf("echo request %x: type, code or checksum wrong", b)
	}
	// A reply is the request with type 0 behind an IPv4 header from the target.
	p := &Prober{target: netip.AddrFrom4([4]byte{198, 19, 7, 10}), idBase: 0x1234 - 99}
	reply := append([]byte{0x45, 0, 0, 36, 0, 0, 0, 0, 64, 1, 0, 0, 198, 19, 7, 10, 198, 18, 1, 10}, b...)
	reply[20] = 0
	if k, ok := p.parseReply(reply, nil); !ok || k != 99 {
		t.Errorf("reply not recognised: %d %v", k, ok)
	}
	reply[15] = 11 // another source
	if _, ok := p.parseReply(reply, nil); ok {
		t.Error("a reply from another address was taken")
	}
	reply[15] = 10
	reply[20] = 8 // a request, not a reply
	if _, ok := p.parseReply(reply, nil); ok {
		t.Error("an echo request was taken for a reply")
	}
}

func TestEchoRequest6(t *testing.T) {
	b := echoRequest(true, 0x1234, 7, 99)
	if b[0] != 128 || b[1] != 0 {
		t.Errorf("echo request %x: type or code wrong", b)
	}
	// An ICMPv6 socket reads the message alone; the sender comes with it.
	target := netip.MustParseAddr("2001:2:0:107::a")
	p := &Prober{target: target, idBase: 0x1234 - 99}
	reply := append([]byte(nil), b...)
	reply[0] = 129
	if k, ok := p.parseReply(reply, &unix.SockaddrInet6{Addr: target.As16()}); !ok || k != 99 {
		t.Errorf("reply not recognised: %d %v", k, ok)
	}
	if _, ok := p.parseReply(reply, &unix.SockaddrInet6{Addr: netip.MustParseAddr("2001:2:0:107::b").As16()}); ok {
		t.Error("a reply from another address was taken")
	}
	if _, ok := p.parseReply(b, &unix.SockaddrInet6{Addr: target.As16()}); ok {
		t.Error("an echo request was taken for a reply")
	}
}

func TestGroupedMedian(t *testing.T) {
	us := func(xs ...int) []time.Duration {
		out := make([]time.Duration, len(xs))
		for i, x := range xs {
			out[i] = time.Duration(x) * time.Microsecond
		}
		return out
	}
	for _, c := range []struct {
		in   []time.Duration
		want float64 // us
	}{
		{us(16, 16, 16, 16), 16},           // all in one step: its middle
		{us(16, 16, 16, 17), 15.5 + 2.0/3}, // 2 of the 3 at 16 below the middle
		{us(15, 16, 17, 17), 16.5},         // the median sits on the boundary
		{us(16, 17, 17, 17, 17, 17), 16.9}, // 2 of the 5 at 17
		{us(1500), 1500},                   // 10 us steps above 1 ms
	} {
		if got := groupedMedian(c.in) / float64(time.Microsecond); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("groupedMedian(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestCombineBlocks(t *testing.T) {
	ip := combineIperf([]Iperf{
		{BitsPerSecond: 1e9, SenderBps: 2e9, Seconds: 1, HostCPU: 50, CPUBusy: []float64{100, 40}},
		{BitsPerSecond: 3e9, SenderBps: 4e9, Seconds: 3, HostCPU: 90, CPUBusy: []float64{100, 80}},
	})
	if ip.BitsPerSecond != 2.5e9 || ip.SenderBps != 3.5e9 || ip.Seconds != 4 || ip.HostCPU != 80 ||
		!slices.Equal(ip.CPUBusy, []float64{100, 70}) {
		t.Errorf("combineIperf: %+v", ip)
	}
	a := pingStats(3, 3, []time.Duration{10 * time.Microsecond, 12 * time.Microsecond, 30 * time.Microsecond})
	b := pingStats(3, 2, []time.Duration{11 * time.Microsecond, 13 * time.Microsecond})
	p := combinePing([]Ping{a, b})
	if p.Sent != 6 || p.Received != 5 || p.MaxUs != 30 || p.P50Us != 12 || p.MeanUs != 15.2 {
		t.Errorf("combinePing: %+v", p)
	}
	rr := combineRR([]benchkit.RRResult{
		{Transactions: 100, Seconds: 1, MeanUs: 10, P50Us: 9, P90Us: 20, P99Us: 40},
		{Transactions: 300, Seconds: 1, MeanUs: 20, P50Us: 19, P90Us: 30, P99Us: 50},
		{Transactions: 200, Seconds: 1, MeanUs: 15, P50Us: 14, P90Us: 25, P99Us: 90},
	})
	if rr.Transactions != 600 || rr.TPS != 200 || math.Abs(rr.MeanUs-50.0/3) > 1e-9 || rr.P50Us != 14 || rr.P90Us != 25 || rr.P99Us != 50 {
		t.Errorf("combineRR: %+v", rr)
	}
}

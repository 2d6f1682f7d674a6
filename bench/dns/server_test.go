package dns

import (
	"context"
	"net"
	"testing"
	"time"
)

// Every learn name has an address of its own in the world range, outside the cached
// names' /24, and names outside the zone have none.
func TestAddrOf(t *testing.T) {
	seen := map[string]string{}
	for i := range MaxNames {
		name := LearnName(i)
		a, ok := AddrOf(name)
		if !ok || !WorldRange.Contains(a) || a.As4()[2] == 255 {
			t.Fatalf("%s: %v %v, want an address of %v outside x.x.255.x", name, a, ok, WorldRange)
		}
		if other, dup := seen[a.String()]; dup {
			t.Fatalf("%s and %s both resolve to %v", other, name, a)
		}
		seen[a.String()] = name
	}
	for _, name := range []string{CachedName(0), CachedName(300)} {
		if a, ok := AddrOf(name); !ok || a.As4()[2] != 255 {
			t.Errorf("%s: %v %v, want an address in x.x.255.x", name, a, ok)
		}
	}
	for _, name := range []string{"x.other.example.", "n1.other.example.", LearnName(MaxNames), "nx.bench.example.", "bench.example.", "a.n1.bench.example."} {
		if a, ok := AddrOf(name); ok {
			t.Errorf("%s: %v, want none", name, a)
		}
	}
}

// The client's modes against the server on loopback, over UDP and TCP.
func TestClientAgainstServer(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan [2]net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- ServeDNS(ctx, "127.0.0.1:0", func(u, t net.Addr) { addrs <- [2]net.Addr{u, t} }) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	var a [2]net.Addr
	select {
	case a = <-addrs:
	case err := <-done:
		t.Fatal(err)
	}
	for i, proto := range []string{"udp", "tcp"} {
		target := a[i].String()
		res, err := queryOnce(ctx, proto, target, "x.other.example", time.Second, 0)
		if err != nil || res.Rcode != "NXDOMAIN" {
			t.Errorf("%s: x.other.example: %+v %v, want NXDOMAIN", proto, res, err)
		}
		want, _ := AddrOf(LearnName(7))
		res, err = queryOnce(ctx, proto, target, LearnName(7), time.Second, 0)
		if err != nil || res.Rcode != "NOERROR" || len(res.Addrs) != 1 || res.Addrs[0] != want.String() {
			t.Errorf("%s: %s: %+v %v, want %v", proto, LearnName(7), res, err, want)
		}
		lat, err := latency(proto, target, 4, 5, 50, time.Second)
		if err != nil || lat.Answered != 50 || lat.Failed != 0 || lat.P50us <= 0 || lat.P99us < lat.P50us {
			t.Errorf("%s latency: %+v %v", proto, lat, err)
		}
		r, err := rate(proto, target, 4, 3, 100*time.Millisecond, time.Second)
		if err != nil || r.Answered == 0 || r.Failed != 0 || r.QPS <= 0 {
			t.Errorf("%s rate: %+v %v", proto, r, err)
		}
	}
}

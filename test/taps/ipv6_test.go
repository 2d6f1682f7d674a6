package taps

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/monitor/suricata"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

// On a dual-stack node, taps take IPv6 as they take IPv4. A mirror copies the client's
// IPv6 connection to web to a passive Suricata, which alerts on the attack with the IPv6
// addresses; an inline Suricata (redirect) answers benign IPv6 requests and blocks the
// attack; with the monitor stopped the IPv6 requests fail (closed).
func TestSuricataOverIPv6(t *testing.T) {
	s := newShopOf(t, agenttest.Options{NoServers: true, PodCIDR6: netip.MustParsePrefix("2001:2:70::/64")})
	web6, client6 := s.e.IP6("shop/web"), s.e.IP6("shop/client")
	srv, err := testenv.ServeHTTPOn(s.web.Netns, netip.AddrPortFrom(web6, webPort), http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, "ok")
	}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	alert := fmt.Sprintf(`alert tcp any any -> any %d (msg:"%s"; flow:to_server,established; content:"%s"; sid:1000061; rev:1;)`, webPort, attack, attack)
	m := s.monitor(t, suricata.Passive, alert)
	s.e.MustCLI(addWebTap("web-mirror6", "mirror")...)
	for _, body := range []string{"hello", "buy " + attack} {
		if got, err := s.postTo(t, web6.String(), body, 5*time.Second); err != nil || got != "ok" {
			t.Fatalf("IPv6 request %q through the mirror: %q, %v", body, got, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ev, _, err := m.WaitEvent(ctx, func(e suricata.Event) bool { return e.Alert != nil && e.Alert.SignatureID == 1000061 })
	if err != nil {
		t.Fatalf("no alert for the attack over IPv6: %v", err)
	}
	if ev.Tuple.Src.Addr() != client6 || ev.Tuple.Dst.Addr() != web6 || ev.Tuple.Dst.Port() != webPort {
		t.Errorf("alert on %s, want %s -> [%s]:%d", ev.Tuple, client6, web6, webPort)
	}
	if tp := s.tap(t, "web-mirror6"); tp.Counters.MirroredPackets == 0 {
		t.Errorf("counters %+v: no copies", tp.Counters)
	}
	if err := m.Stop(); err != nil {
		t.Fatal(err)
	}
	s.e.MustCLI("tap", "delete", "web-mirror6")

	block := fmt.Sprintf(`drop tcp any any -> any %d (msg:"%s"; flow:to_server,established; content:"%s"; sid:1000062; rev:1;)`, webPort, attack, attack)
	ips := s.monitor(t, suricata.IPS, block)
	s.e.MustCLI(addWebTap("web-inline6", "redirect")...)
	if got, err := s.postTo(t, web6.String(), "hello", 5*time.Second); err != nil || got != "ok" {
		t.Fatalf("benign IPv6 request through the inline monitor: %q, %v", got, err)
	}
	if got, err := s.postTo(t, web6.String(), "buy "+attack, 3*time.Second); err == nil {
		t.Fatalf("the IPv6 attack passed the inline monitor: %q", got)
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel2()
	if _, _, err := ips.WaitEvent(ctx2, func(e suricata.Event) bool {
		return e.Alert != nil && e.Alert.SignatureID == 1000062 && e.Alert.Action == suricata.Blocked && e.Tuple.Dst.Addr() == web6
	}); err != nil {
		t.Fatalf("no blocking alert for the IPv6 attack: %v", err)
	}
	if tp := s.tap(t, "web-inline6"); tp.Counters.RedirectedPackets == 0 || tp.Counters.DroppedByMonitor == 0 {
		t.Errorf("counters %+v: want redirects and the attack dropped by the monitor", tp.Counters)
	}
	if err := ips.Stop(); err != nil {
		t.Fatal(err)
	}
	if got, err := s.postTo(t, web6.String(), "hello", 2*time.Second); err == nil {
		t.Fatalf("an IPv6 request passed while its inline monitor was stopped: %q", got)
	}
}

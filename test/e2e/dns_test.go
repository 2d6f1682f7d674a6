package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/fqdn"
	"github.com/rampartnet/rampart/internal/netns"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

// testDNS is a DNS server of the test's own in an endpoint's namespace: it answers A
// queries from a table and counts what it was asked.
type testDNS struct {
	mu      sync.Mutex
	records map[string][]dns.RR // by question name (with the final dot)
	asked   map[string]int
	servers []*dns.Server
}

func (s *testDNS) ServeDNS(w dns.ResponseWriter, req *dns.Msg) {
	resp := new(dns.Msg)
	resp.SetReply(req)
	s.mu.Lock()
	if len(req.Question) == 1 {
		q := strings.ToLower(req.Question[0].Name)
		s.asked[q]++
		resp.Answer = append(resp.Answer, s.records[q]...)
		if len(resp.Answer) == 0 {
			resp.Rcode = dns.RcodeNameError
		}
	}
	s.mu.Unlock()
	w.WriteMsg(resp)
}

func (s *testDNS) times(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.asked[name]
}

// serveDNS starts the server on port 53 (UDP and TCP) in the namespace at nsPath, over
// IPv4 and, when the namespace has IPv6 (a dual-stack endpoint), over IPv6.
func serveDNS(t *testing.T, nsPath string, records map[string][]dns.RR) *testDNS {
	t.Helper()
	s := &testDNS{records: records, asked: map[string]int{}}
	var servers []*dns.Server
	err := netns.Do(nsPath, func() error {
		for _, f := range []string{"4", "6"} {
			pc, err := net.ListenPacket("udp"+f, ":53")
			if err != nil {
				if f == "6" {
					return nil // no IPv6 here
				}
				return err
			}
			l, err := net.Listen("tcp"+f, ":53")
			if err != nil {
				pc.Close()
				return err
			}
			servers = append(servers, &dns.Server{PacketConn: pc, Handler: s}, &dns.Server{Listener: l, Handler: s})
		}
		return nil
	})
	if err != nil {
		t.Fatalf("starting the test's DNS server: %v", err)
	}
	for _, srv := range servers {
		started := make(chan struct{})
		srv.NotifyStartedFunc = func() { close(started) }
		go srv.ActivateAndServe()
		<-started
		s.servers = append(s.servers, srv)
		t.Cleanup(func() { srv.Shutdown() })
	}
	return s
}

func aRecord(t *testing.T, name string, ttl uint32, addr netip.Addr) dns.RR {
	t.Helper()
	rr, err := dns.NewRR(fmt.Sprintf("%s %d IN A %s", name, ttl, addr))
	if err != nil {
		t.Fatal(err)
	}
	return rr
}

// resolve asks server for name's A records from the namespace at nsPath over proto
// ("udp" or "tcp"); it returns the answer's rcode and addresses.
func resolve(t *testing.T, nsPath string, server netip.Addr, name, proto string) (int, []netip.Addr, error) {
	t.Helper()
	return resolveType(t, nsPath, server, name, proto, dns.TypeA)
}

// resolveType is resolve for records of type qtype (A or AAAA).
func resolveType(t *testing.T, nsPath string, server netip.Addr, name, proto string, qtype uint16) (int, []netip.Addr, error) {
	t.Helper()
	var resp *dns.Msg
	err := netns.Do(nsPath, func() (err error) {
		c := &dns.Client{Net: proto, Timeout: 2 * time.Second}
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), qtype)
		resp, _, err = c.Exchange(m, netip.AddrPortFrom(server, 53).String())
		return err
	})
	if err != nil {
		return 0, nil, err
	}
	var out []netip.Addr
	for _, rr := range resp.Answer {
		switch a := rr.(type) {
		case *dns.A:
			ip, _ := netip.AddrFromSlice(a.A.To4())
			out = append(out, ip)
		case *dns.AAAA:
			ip, _ := netip.AddrFromSlice(a.AAAA)
			out = append(out, ip)
		}
	}
	return resp.Rcode, out, nil
}

// dnsScene starts an agent with endpoints x/client and x/dns (app=client, app=dns), a
// world namespace serving TCP 80 on addrs (all in one /24, gateway .1), and the test's DNS
// server in x/dns answering each name of ttls (in order: the i-th name resolves to
// addrs[min(i, len(addrs)-1)]) with that TTL. It returns the DNS server, its address and
// the client's namespace path.
func dnsScene(t *testing.T, opts agenttest.Options, addrs []netip.Addr, ttls map[string]uint32) (*agenttest.Env, *testDNS, netip.Addr, string) {
	t.Helper()
	env := agenttest.StartAgent(t, opts)
	env.AddEndpoint("x", "client", map[string]string{"app": "client"})
	env.AddEndpoint("x", "dns", map[string]string{"app": "dns"})
	gw := netip.AddrFrom4([4]byte{addrs[0].As4()[0], addrs[0].As4()[1], addrs[0].As4()[2], 1})
	agenttest.AddWorld(t, env, gw, addrs, []uint16{80}, nil)
	names := make([]string, 0, len(ttls))
	for n := range ttls {
		names = append(names, n)
	}
	slices.Sort(names)
	records := map[string][]dns.RR{}
	for i, n := range names {
		records[n] = []dns.RR{aRecord(t, n, ttls[n], addrs[min(i, len(addrs)-1)])}
	}
	srv := serveDNS(t, agenttest.NetnsPathOf(env.Config.Instance, "x", "dns"), records)
	return env, srv, env.IP("x/dns"), agenttest.NetnsPathOf(env.Config.Instance, "x", "client")
}

// applyDNSPolicy applies x/client's egress policy: DNS to x/dns on port 53 over proto for
// the names of dnsSel, and TCP 80 to the addresses learnt for fqdnSel.
func applyDNSPolicy(t *testing.T, env *agenttest.Env, proto, dnsSel, fqdnSel string) {
	t.Helper()
	policy := fmt.Sprintf(`apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata: {name: client-dns, namespace: x}
spec:
  endpointSelector: {matchLabels: {app: client}}
  egress:
  - toEndpoints: [{matchLabels: {app: dns}}]
    toPorts:
    - ports: [{port: "53", protocol: %s}]
      rules:
        dns: [%s]
  - toFQDNs: [%s]
    toPorts:
    - ports: [{port: "80", protocol: TCP}]
`, proto, dnsSel, fqdnSel)
	if out, errs, code := env.CLIStdin(policy, "apply", "-f", "-"); code != 0 {
		t.Fatalf("apply: %d %s%s", code, out, errs)
	}
}

// A pod whose egress policy allows DNS to one server for *.example.com and TCP 80 to
// api.example.com (toFQDNs): its queries go through the agent's DNS proxy, which refuses
// other names before they reach the server, and the address an allowed answer carries is
// open to the pod from its first packet, over UDP and TCP DNS alike; other addresses stay
// closed, and the learnt address survives an agent restart.
func TestDNSAwareEgress(t *testing.T) {
	apiAddr, other := netip.MustParseAddr("198.19.50.10"), netip.MustParseAddr("198.19.50.11")
	env, srv, dnsIP, clientNs := dnsScene(t, agenttest.Options{}, []netip.Addr{apiAddr, other}, map[string]uint32{
		"api.example.com.": 300, "other.example.com.": 300, "evil.test.": 300,
	})
	if rc, addrs, err := resolve(t, clientNs, dnsIP, "api.example.com", "udp"); err != nil || rc != dns.RcodeSuccess || len(addrs) != 1 {
		t.Fatalf("without policy: rcode %d %v %v", rc, addrs, err)
	}

	applyDNSPolicy(t, env, "ANY", `{matchPattern: "*.example.com"}`, `{matchName: api.example.com}`)
	if env.Probe("x/client", apiAddr, 80, "tcp", 300*time.Millisecond) {
		t.Fatal("api.example.com's address is open before the pod resolved it")
	}

	// A refused name never reaches the server.
	before := srv.times("evil.test.")
	if rc, _, err := resolve(t, clientNs, dnsIP, "evil.test", "udp"); err != nil || rc != dns.RcodeRefused {
		t.Errorf("evil.test: rcode %d (%v), want REFUSED", rc, err)
	}
	if n := srv.times("evil.test."); n != before {
		t.Errorf("the refused query reached the server (%d times)", n-before)
	}

	rc, addrs, err := resolve(t, clientNs, dnsIP, "api.example.com", "udp")
	if err != nil || rc != dns.RcodeSuccess || len(addrs) != 1 || addrs[0] != apiAddr {
		t.Fatalf("api.example.com through the proxy: rcode %d %v %v", rc, addrs, err)
	}
	// The first packet passes: the proxy answered only once the address was admitted.
	if !env.Probe("x/client", apiAddr, 80, "tcp", time.Second) {
		t.Error("api.example.com's address is closed right after the answer")
	}
	if rc, _, err := resolve(t, clientNs, dnsIP, "other.example.com", "tcp"); err != nil || rc != dns.RcodeSuccess {
		t.Errorf("other.example.com over TCP: rcode %d %v", rc, err)
	}
	if env.Probe("x/client", other, 80, "tcp", 300*time.Millisecond) {
		t.Error("other.example.com's address is open: no toFQDNs selects it")
	}

	var st api.Status
	if err := json.Unmarshal([]byte(env.MustCLI("status", "-o", "json")), &st); err != nil {
		t.Fatal(err)
	}
	if d := st.DNS; d.State != "running" || d.Refused < 1 || d.Forwarded < 2 || d.Names < 2 || d.Addresses < 2 {
		t.Errorf("status: DNS %+v, want running, 1 refused, 2 forwarded, 2 names and addresses learnt", d)
	}

	env.Restart()
	if !env.Probe("x/client", apiAddr, 80, "tcp", time.Second) {
		t.Error("the learnt address is closed after an agent restart")
	}
	if rc, _, err := resolve(t, clientNs, dnsIP, "evil.test", "udp"); err != nil || rc != dns.RcodeRefused {
		t.Errorf("evil.test after the restart: rcode %d (%v), want REFUSED", rc, err)
	}
}

// TestDNSAwareEgressIPv6 is TestDNSAwareEgress on a dual-stack node with the queries sent
// over IPv6, to the DNS pod's IPv6 address: the DNS proxy's IPv6 sockets take them, refuse
// other names before they reach the server, and the AAAA answer opens the address to the
// pod from its first packet, over UDP and TCP DNS alike; other addresses stay closed.
func TestDNSAwareEgressIPv6(t *testing.T) {
	env := agenttest.StartAgent(t, agenttest.Options{PodCIDR6: netip.MustParsePrefix("2001:2::/64")})
	env.AddEndpoint("x", "client", map[string]string{"app": "client"})
	env.AddEndpoint("x", "dns", map[string]string{"app": "dns"})
	api6, other6 := netip.MustParseAddr("2001:2:ff::10"), netip.MustParseAddr("2001:2:ff::11")
	agenttest.AddWorld(t, env, netip.MustParseAddr("198.19.52.1"), []netip.Addr{netip.MustParseAddr("198.19.52.10"), api6, other6}, []uint16{80}, nil)
	aaaa := func(name string, a netip.Addr) []dns.RR {
		rr, err := dns.NewRR(fmt.Sprintf("%s 300 IN AAAA %s", name, a))
		if err != nil {
			t.Fatal(err)
		}
		return []dns.RR{rr}
	}
	srv := serveDNS(t, agenttest.NetnsPathOf(env.Config.Instance, "x", "dns"), map[string][]dns.RR{
		"api.example.com.": aaaa("api.example.com.", api6), "other.example.com.": aaaa("other.example.com.", other6), "evil.test.": aaaa("evil.test.", other6),
	})
	dnsIP, clientNs := env.IP6("x/dns"), agenttest.NetnsPathOf(env.Config.Instance, "x", "client")

	applyDNSPolicy(t, env, "ANY", `{matchPattern: "*.example.com"}`, `{matchName: api.example.com}`)
	if env.Probe("x/client", api6, 80, "tcp", 300*time.Millisecond) {
		t.Fatal("api.example.com's address is open before the pod resolved it")
	}
	before := srv.times("evil.test.")
	if rc, _, err := resolveType(t, clientNs, dnsIP, "evil.test", "udp", dns.TypeAAAA); err != nil || rc != dns.RcodeRefused {
		t.Errorf("evil.test over IPv6: rcode %d (%v), want REFUSED", rc, err)
	}
	if n := srv.times("evil.test."); n != before {
		t.Errorf("the refused query reached the server (%d times)", n-before)
	}
	rc, addrs, err := resolveType(t, clientNs, dnsIP, "api.example.com", "udp", dns.TypeAAAA)
	if err != nil || rc != dns.RcodeSuccess || len(addrs) != 1 || addrs[0] != api6 {
		t.Fatalf("api.example.com over IPv6 through the proxy: rcode %d %v %v", rc, addrs, err)
	}
	if !env.Probe("x/client", api6, 80, "tcp", time.Second) {
		t.Error("api.example.com's IPv6 address is closed right after the answer")
	}
	if rc, _, err := resolveType(t, clientNs, dnsIP, "other.example.com", "tcp", dns.TypeAAAA); err != nil || rc != dns.RcodeSuccess {
		t.Errorf("other.example.com over IPv6 TCP: rcode %d %v", rc, err)
	}
	if env.Probe("x/client", other6, 80, "tcp", 300*time.Millisecond) {
		t.Error("other.example.com's address is open: no toFQDNs selects it")
	}
}

// An address learnt with a short TTL closes for new connections when the TTL runs out,
// while a connection opened before keeps working (its address is kept as long as the flow
// lives), as in Cilium.
func TestDNSTTLExpiry(t *testing.T) {
	api := netip.MustParseAddr("198.19.51.10")
	env, _, dnsIP, clientNs := dnsScene(t, agenttest.Options{FQDN: fqdn.Config{Grace: -1, MinTTL: time.Second}},
		[]netip.Addr{api}, map[string]uint32{"api.example.com.": 2})
	applyDNSPolicy(t, env, "UDP", `{matchName: api.example.com}`, `{matchPattern: "*.example.com"}`)
	if rc, addrs, err := resolve(t, clientNs, dnsIP, "api.example.com", "udp"); err != nil || rc != dns.RcodeSuccess || len(addrs) != 1 {
		t.Fatalf("api.example.com: rcode %d %v %v", rc, addrs, err)
	}
	var conn net.Conn
	err := netns.Do(clientNs, func() (err error) {
		conn, err = net.DialTimeout("tcp4", netip.AddrPortFrom(api, 80).String(), time.Second)
		return err
	})
	if err != nil {
		t.Fatalf("connecting right after the answer: %v", err)
	}
	defer conn.Close()
	// Keep the connection busy while the TTL runs out, so that its flow is live.
	var echoed atomic.Int64
	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		buf := make([]byte, 5)
		tick := time.NewTicker(50 * time.Millisecond) // a packet each way this often
		defer tick.Stop()
		for {
			select {
			case <-stop:
				done <- nil
				return
			case <-tick.C:
			}
			conn.SetDeadline(time.Now().Add(2 * time.Second))
			if _, err := conn.Write([]byte("ping\n")); err != nil {
				done <- err
				return
			}
			if _, err := conn.Read(buf); err != nil {
				done <- err
				return
			}
			echoed.Add(1)
		}
	}()
	if !testenv.Eventually(15*time.Second, func() bool {
		return !env.Probe("x/client", api, 80, "tcp", 200*time.Millisecond)
	}) {
		t.Fatal("the address is still open for new connections 15 s after a 2 s TTL")
	}
	n := echoed.Load()
	if !testenv.Eventually(5*time.Second, func() bool { return echoed.Load() > n+3 }) {
		t.Error("the connection opened before the TTL ran out stopped working")
	}
	close(stop)
	if err := <-done; err != nil {
		t.Errorf("the open connection: %v", err)
	}
}

// cnpDomainNames: x/client's egress in the Admin tier: DNS to x/dns accepted, TCP 80 to
// api.example.com's addresses accepted (domainNames), everything else on TCP 80 denied.
// No Cilium rules.dns: the client's queries reach the proxy because a domainNames peer
// needs their answers (observing).
const cnpDomainNames = `apiVersion: policy.networking.k8s.io/v1beta1
kind: ClusterNetworkPolicy
metadata: {name: client-domains}
spec:
  tier: Admin
  priority: 10
  subject: {pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: client}}}}
  egress:
  - name: dns
    action: Accept
    to: [{pods: {namespaceSelector: {}, podSelector: {matchLabels: {app: dns}}}}]
    protocols: [{udp: {destinationPort: {number: 53}}}, {tcp: {destinationPort: {number: 53}}}]
  - name: api
    action: Accept
    to: [{domainNames: [api.example.com]}]
    protocols: [{tcp: {destinationPort: {number: 80}}}]
  - name: rest
    action: Deny
    to: [{networks: [0.0.0.0/0]}]
    protocols: [{tcp: {destinationPort: {number: 80}}}]
`

// ClusterNetworkPolicy domainNames with real traffic: the Admin tier accepts the client's
// DNS and TCP 80 to api.example.com, and denies TCP 80 elsewhere. The client's queries go
// through the observing DNS proxy (every name forwarded: the policy allowed them), and
// api.example.com's address opens from the first packet after the answer; a name the
// policy does not list resolves, but its address stays closed.
func TestClusterNetworkPolicyDomainNames(t *testing.T) {
	apiAddr, other := netip.MustParseAddr("198.19.52.10"), netip.MustParseAddr("198.19.52.11")
	env, srv, dnsIP, clientNs := dnsScene(t, agenttest.Options{}, []netip.Addr{apiAddr, other}, map[string]uint32{
		"api.example.com.": 300, "other.example.com.": 300,
	})
	if out, errs, code := env.CLIStdin(cnpDomainNames, "apply", "-f", "-"); code != 0 {
		t.Fatalf("apply: %d %s%s", code, out, errs)
	}
	if env.Probe("x/client", apiAddr, 80, "tcp", 300*time.Millisecond) {
		t.Fatal("api.example.com's address is open before the client resolved it")
	}
	before := srv.times("other.example.com.")
	if rc, addrs, err := resolve(t, clientNs, dnsIP, "other.example.com", "udp"); err != nil || rc != dns.RcodeSuccess || len(addrs) != 1 {
		t.Fatalf("other.example.com: rcode %d %v %v (every name is forwarded)", rc, addrs, err)
	}
	if srv.times("other.example.com.") != before+1 {
		t.Error("the query did not reach the server once")
	}
	if env.Probe("x/client", other, 80, "tcp", 300*time.Millisecond) {
		t.Error("other.example.com's address is open: no domainNames lists it")
	}
	rc, addrs, err := resolve(t, clientNs, dnsIP, "api.example.com", "tcp")
	if err != nil || rc != dns.RcodeSuccess || len(addrs) != 1 || addrs[0] != apiAddr {
		t.Fatalf("api.example.com over TCP: rcode %d %v %v", rc, addrs, err)
	}
	if !env.Probe("x/client", apiAddr, 80, "tcp", time.Second) {
		t.Error("api.example.com's address is closed right after the answer")
	}
	var st api.Status
	if err := json.Unmarshal([]byte(env.MustCLI("status", "-o", "json")), &st); err != nil {
		t.Fatal(err)
	}
	if st.DNS.Observing == "" || st.DNS.Observed < 2 {
		t.Errorf("status: DNS %+v, want the observing proxy with 2 queries", st.DNS)
	}
}

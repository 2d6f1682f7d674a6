package cli_test

import (
	"encoding/binary"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/agent"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

// onlyBToA admits only pod=b of namespace x into pod=a, on TCP 80.
const onlyBToA = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: only-b
  namespace: x
spec:
  podSelector:
    matchLabels:
      pod: a
  policyTypes: [Ingress]
  ingress:
  - from:
    - podSelector:
        matchLabels:
          pod: b
    ports:
    - protocol: TCP
      port: 80
`

// hostToA admits the host into pod=a of namespace x on TCP 80.
const hostToA = `apiVersion: cilium.io/v2
kind: CiliumNetworkPolicy
metadata:
  name: host-to-a
  namespace: x
spec:
  endpointSelector:
    matchLabels:
      pod: a
  ingress:
  - fromEntities: [host]
    toPorts:
    - ports:
      - port: "80"
        protocol: TCP
`

// forgedUDP is an IPv4/UDP datagram from src to dst (UDP checksum 0: none, which IPv4
// allows), to send from a raw socket.
func forgedUDP(src netip.AddrPort, dst netip.AddrPort, payload string) []byte {
	b := make([]byte, 28, 28+len(payload))
	b[0], b[8], b[9] = 0x45, 64, 17
	binary.BigEndian.PutUint16(b[2:], uint16(28+len(payload)))
	s, d := src.Addr().As4(), dst.Addr().As4()
	copy(b[12:], s[:])
	copy(b[16:], d[:])
	binary.BigEndian.PutUint16(b[20:], src.Port())
	binary.BigEndian.PutUint16(b[22:], dst.Port())
	binary.BigEndian.PutUint16(b[24:], uint16(8+len(payload)))
	return append(b, payload...)
}

// TestHostTraffic: connections from the host (the node namespace, whose router address
// carries the host identity) into an endpoint whose ingress policy admits only another
// endpoint. With --host-traffic=allow (the default) the host gets in, on any port; with
// policy it gets in only where a rule selects the host entity. In both modes other
// endpoints stay out, and an endpoint that sends from the router address to pass as the
// host is dropped at its own veth (spoofed-source).
func TestHostTraffic(t *testing.T) {
	for _, mode := range []agent.HostTraffic{"", agent.HostTrafficPolicy} {
		name := string(mode)
		if name == "" {
			name = "default"
		}
		t.Run(name, func(t *testing.T) {
			e := agenttest.StartAgent(t, agenttest.Options{HostTraffic: mode})
			e.AddEndpoint("x", "a", map[string]string{"pod": "a"})
			e.AddEndpoint("x", "b", map[string]string{"pod": "b"})
			e.AddEndpoint("x", "c", map[string]string{"pod": "c"})
			aIP := e.IP("x/a")
			node := endpoint.NetnsPath(e.Config.NodeNetns)
			fromHost := func(port uint16, proto string) bool {
				return testenv.Probe(node, netip.AddrPortFrom(aIP, port), proto, probeTimeout)
			}
			// Without policy everyone gets in: the probes work.
			if !fromHost(80, "tcp") || !e.Probe("x/c", aIP, 80, "tcp", 2*time.Second) {
				t.Fatal("no policy yet, but x/a unreachable")
			}
			e.MustCLI("apply", "-f", writeFile(t, "only-b.yaml", onlyBToA))
			if !e.Probe("x/b", aIP, 80, "tcp", 2*time.Second) {
				t.Error("x/b -> x/a:80 blocked, but the policy allows it")
			}
			if e.Probe("x/c", aIP, 80, "tcp", probeTimeout) || e.Probe("x/c", aIP, 81, "udp", probeTimeout) {
				t.Error("x/c got into x/a, which admits only x/b")
			}

			if mode == agent.HostTrafficPolicy {
				if fromHost(80, "tcp") || fromHost(81, "udp") {
					t.Error("--host-traffic=policy: the host got into x/a, which no rule opens to it")
				}
				e.MustCLI("apply", "-f", writeFile(t, "host.yaml", hostToA))
				if !fromHost(80, "tcp") {
					t.Error("--host-traffic=policy: fromEntities host does not admit the host")
				}
				if fromHost(81, "udp") {
					t.Error("--host-traffic=policy: the host got to a port its rule does not open")
				}
				return
			}

			for _, p := range []struct {
				port  uint16
				proto string
			}{{80, "tcp"}, {81, "tcp"}, {81, "udp"}} {
				if !fromHost(p.port, p.proto) {
					t.Errorf("--host-traffic=allow: host -> x/a:%d/%s blocked", p.port, p.proto)
				}
			}
			var out string
			if !testenv.Eventually(5*time.Second, func() bool {
				out = e.MustCLI("observe", "--since-start", "--endpoint", "x/a", "--port", "81", "--protocol", "udp")
				return strings.Contains(out, "FORWARDED rule=rampartd --host-traffic=allow")
			}) {
				t.Errorf("observe: no flow admitted by --host-traffic:\n%s", out)
			}

			// x/c sends from the router address with a raw socket, to pass as the host.
			router := endpoint.Node{PodCIDR: e.Config.PodCIDR}.Router()
			const sport = 40404
			err := testenv.InNetns(agenttest.NetnsPathOf(e.Config.Instance, "x", "c"), func() error {
				fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
				if err != nil {
					return err
				}
				defer unix.Close(fd)
				b := forgedUDP(netip.AddrPortFrom(router, sport), netip.AddrPortFrom(aIP, 81), "as the host")
				return unix.Sendto(fd, b, 0, &unix.SockaddrInet4{Addr: aIP.As4()})
			})
			if err != nil {
				t.Fatal(err)
			}
			if !testenv.Eventually(5*time.Second, func() bool {
				out = e.MustCLI("observe", "--since-start", "--endpoint", "x/c", "--verdict", "dropped")
				return strings.Contains(out, "reason=spoofed-source") && strings.Contains(out, router.String()+":"+strconv.Itoa(sport))
			}) {
				t.Errorf("observe: no spoofed-source drop at x/c:\n%s", out)
			}
			if !strings.Contains(out, "x/c (id ") {
				t.Errorf("the drop is not reported as x/c's:\n%s", out)
			}
			// Had it passed x/c's veth, x/a's would have seen it (and admitted it as the
			// host's).
			for _, line := range strings.Split(e.MustCLI("observe", "--since-start", "--endpoint", "x/a"), "\n") {
				if strings.Contains(line, ":"+strconv.Itoa(sport)+" ") && strings.Contains(line, " ingress ") {
					t.Errorf("the forged datagram reached x/a: %s", line)
				}
			}
		})
	}
}

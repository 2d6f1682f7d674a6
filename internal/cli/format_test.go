package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/api"
)

func TestFormatL7Flow(t *testing.T) {
	f := api.Flow{
		Time: time.Now(), Type: api.FlowTypeL7, Verdict: "DROPPED", Reason: "l7-denied", Direction: "ingress", Protocol: "TCP",
		Source: api.FlowPeer{IP: "198.18.0.9", Port: 40002, Identity: 262, Namespace: "sw", Name: "xwing"},
		Dest:   api.FlowPeer{IP: "198.18.0.7", Port: 80, Identity: 261, Namespace: "sw", Name: "deathstar"},
		L7:     &api.L7Flow{Protocol: "HTTP/1.1", Method: "PUT", Path: "/v1/exhaust-port", Host: "deathstar", Status: 403, LatencyMs: 0.84},
	}
	got := FormatFlow(f)
	want := "sw/xwing (id 262) -> sw/deathstar (id 261) HTTP/1.1 198.18.0.9:40002 -> 198.18.0.7:80 ingress DROPPED PUT deathstar /v1/exhaust-port 403 0.8ms reason=l7-denied"
	if !strings.HasSuffix(got, want) {
		t.Fatalf("got  %q\nwant ...%q", got, want)
	}
	f.Verdict, f.Reason, f.L7.Status = "FORWARDED", "", 200
	f.Rule = &api.RuleRef{ID: 3, Policy: "CiliumNetworkPolicy/sw/rule1", Rule: "ingress[0]"}
	if got := FormatFlow(f); !strings.HasSuffix(got, "ingress FORWARDED PUT deathstar /v1/exhaust-port 200 0.8ms rule=CiliumNetworkPolicy/sw/rule1 ingress[0]") {
		t.Fatalf("forwarded: %q", got)
	}
	// A dataplane flow steered to the proxy.
	d := api.Flow{Time: time.Now(), Type: "new", Verdict: "REDIRECTED", Direction: "egress", Protocol: "TCP",
		Source: f.Source, Dest: f.Dest, Rule: f.Rule}
	if got := FormatFlow(d); !strings.Contains(got, "TCP 198.18.0.9:40002 -> 198.18.0.7:80 egress REDIRECTED to L7 proxy rule=") {
		t.Fatalf("redirected: %q", got)
	}
}

func TestProxyLine(t *testing.T) {
	cases := []struct {
		p    api.ProxyStatus
		want string
	}{
		{api.ProxyStatus{State: "not started"}, "not started (no L7 rules so far)"},
		{api.ProxyStatus{State: "unavailable", Error: "envoy not found"}, "unavailable; error: envoy not found"},
		{api.ProxyStatus{State: "running", PID: 12, Restarts: 1, Version: 7, AckedVersion: 7, Chains: 3, Listen: "127.0.0.1:15001"},
			"running (pid 12, 1 restarts, config version 7 applied, 3 chains, 127.0.0.1:15001)"},
		{api.ProxyStatus{State: "restarting", Restarts: 2, Version: 7, AckedVersion: 6, Chains: 3, Listen: "127.0.0.1:15001", LastExit: "signal: killed"},
			"restarting (2 restarts, config version 7 published, 6 applied, 3 chains, 127.0.0.1:15001); last exit: signal: killed"},
	}
	for _, c := range cases {
		if got := proxyLine(c.p); got != c.want {
			t.Errorf("got  %q\nwant %q", got, c.want)
		}
	}
}

func TestFormatCIDRSetFlow(t *testing.T) {
	f := api.Flow{Time: time.Now(), Type: "drop", Verdict: "DROPPED", Reason: "policy-deny", Direction: "egress", Protocol: "TCP",
		Source: api.FlowPeer{IP: "198.18.0.9", Port: 40002, Identity: 262, Namespace: "x", Name: "a"},
		Dest:   api.FlowPeer{IP: "203.0.113.9", Port: 443, Identity: 2, Labels: []string{"reserved:world"}},
		Rule:   &api.RuleRef{ID: 3, Policy: "CiliumNetworkPolicy/x/block", Rule: "spec.egressDeny[0]"}, CIDRGroup: "threats"}
	if got := FormatFlow(f); !strings.HasSuffix(got, "egress DROPPED reason=policy-deny rule=CiliumNetworkPolicy/x/block spec.egressDeny[0] cidrGroupRef=threats") {
		t.Fatalf("got %q", got)
	}
}

// A flow whose L7 rules the send-side verdict checks says so, both the dataplane's new
// flow and the requests; other flows do not.
func TestFormatSendSideFlow(t *testing.T) {
	d := api.Flow{Time: time.Now(), Type: "new", Verdict: "FORWARDED", Direction: "egress", Protocol: "TCP",
		Source: api.FlowPeer{IP: "198.18.0.9", Port: 40002, Identity: 262, Namespace: "x", Name: "a"},
		Dest:   api.FlowPeer{IP: "198.18.0.7", Port: 80, Identity: 261, Namespace: "y", Name: "b"},
		Flags:  []string{"l7-egress", "send-side"}}
	if got := FormatFlow(d); !strings.HasSuffix(got, "198.18.0.9:40002 -> 198.18.0.7:80 egress FORWARDED (L7 send-side verdict)") {
		t.Fatalf("send-side new flow: %q", got)
	}
	l := d
	l.Type, l.Flags = api.FlowTypeL7, []string{"send-side"}
	l.L7 = &api.L7Flow{Protocol: "HTTP/1.1", Method: "GET", Path: "/v1", Host: "b", Status: 200, LatencyMs: 0.2}
	if got := FormatFlow(l); !strings.HasSuffix(got, "egress FORWARDED GET b /v1 200 0.2ms (L7 send-side verdict)") {
		t.Fatalf("send-side request: %q", got)
	}
	d.Flags = []string{"l7-egress"}
	if got := FormatFlow(d); strings.Contains(got, "send-side") {
		t.Fatalf("flow without the send-side flag: %q", got)
	}
}

// --verdict takes the verdicts' names in any case and names them when it gets another.
func TestObserveVerdictName(t *testing.T) {
	_, errOut, code := runFake(t, &fakeSets{}, "", "observe", "--verdict", "allowed")
	if code != 1 || !strings.Contains(errOut, `--verdict: unknown verdict "allowed": want one of FORWARDED, DROPPED, REDIRECTED`) {
		t.Fatalf("exit %d: %s", code, errOut)
	}
}

// A flow a tap rule matched says "tapped" (its JSON has the flag), others do not.
func TestFormatTappedFlow(t *testing.T) {
	f := api.Flow{Time: time.Now(), Type: "new", Verdict: "FORWARDED", Direction: "ingress", Protocol: "TCP",
		Source: api.FlowPeer{IP: "198.18.0.5", Port: 40004, Identity: 263, Namespace: "shop", Name: "client"},
		Dest:   api.FlowPeer{IP: "198.18.0.6", Port: 8080, Identity: 264, Namespace: "shop", Name: "web"},
		Flags:  []string{"tapped"}}
	if got := FormatFlow(f); !strings.HasSuffix(got, "198.18.0.5:40004 -> 198.18.0.6:8080 ingress FORWARDED tapped") {
		t.Fatalf("tapped flow: %q", got)
	}
	f.Flags = nil
	if got := FormatFlow(f); strings.Contains(got, "tapped") {
		t.Fatalf("untapped flow: %q", got)
	}
}

func TestFormatIPv6Flow(t *testing.T) {
	f := api.Flow{Time: time.Now(), Type: "new", Verdict: "FORWARDED", Direction: "ingress", Protocol: "TCP",
		Source: api.FlowPeer{IP: "2001:2::14", Port: 40002, Identity: 262, Namespace: "x", Name: "a"},
		Dest:   api.FlowPeer{IP: "2001:2::a", Port: 80, Identity: 261, Namespace: "x", Name: "b"}}
	if got := FormatFlow(f); !strings.Contains(got, "TCP [2001:2::14]:40002 -> [2001:2::a]:80 ingress FORWARDED") {
		t.Errorf("IPv6 ports: %q", got)
	}
	icmpType := uint8(128)
	f.Protocol, f.ICMPType = "ICMPv6", &icmpType
	if got := FormatFlow(f); !strings.Contains(got, "ICMPv6 2001:2::14 -> 2001:2::a type 128 ingress") {
		t.Errorf("ICMPv6: %q", got)
	}
}

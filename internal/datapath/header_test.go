package datapath

import (
	"bufio"
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

// Conntrack flags (CT_F_* in rampart.h), used by tests that write entries directly.
const (
	ctFSeenReply  = 1 << 0
	ctFToProxy    = 1 << 4
	ctFFromProxy  = 1 << 5
	ctFDNSProxy   = 1 << 7
	ctFDNSObserve = 1 << 8
)

func mapstateKey5(proto policy.Protocol, port uint16, plen uint8) mapstate.Key {
	return mapstate.Key{Identity: 9, Direction: policy.Ingress, Protocol: proto, Port: port, PortPrefixLen: plen}
}

// TestHeaderConstants checks that the Go mirrors of rampart.h's #defines (which bpf2go does
// not export) have the C values. The flow vocabulary (verdicts, reasons, event types,
// flags, directions) is enums that internal/flow is generated from, so it has no mirror.
func TestHeaderConstants(t *testing.T) {
	f, err := os.Open("../../bpf/include/rampart.h")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	def := regexp.MustCompile(`^#define\s+(\w+)\s+\(?([0-9a-fA-Fx]+)u?(?:\s*<<\s*(\d+)\))?`)
	c := map[string]uint64{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		m := def.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		v, err := strconv.ParseUint(m[2], 0, 64)
		if err != nil {
			continue
		}
		if m[3] != "" {
			s, _ := strconv.Atoi(m[3])
			v <<= s
		}
		c[m[1]] = v
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}

	want := map[string]uint64{
		"RAMPART_FAMILY_V4":        familyV4,
		"RAMPART_FAMILY_V6":        familyV6,
		"EP_ENFORCE_INGRESS":       enforceIngress,
		"EP_ENFORCE_EGRESS":        enforceEgress,
		"POLICY_ALLOW":             policyAllow,
		"POLICY_DENY":              policyDeny,
		"ID_UNKNOWN":               uint64(identity.Any),
		"ID_HOST":                  uint64(identity.Host),
		"ID_WORLD":                 uint64(identity.World),
		"ID_FLAG_ENDPOINT_CIDR":    uint64(identity.EndpointCIDRFlag),
		"POLICY_REDIRECT":          policyRedirect,
		"POLICY_PASS":              policyPass,
		"DIR_ADMIN_FLAG":           dirAdminFlag,
		"EP_ADMIN_INGRESS":         epAdminIngress,
		"EP_ADMIN_EGRESS":          epAdminEgress,
		"EP_DNS_OBSERVE":           epDNSObserve,
		"EP_HOST":                  epHost,
		"EP_AUDIT_INGRESS":         epAuditIngress,
		"EP_AUDIT_EGRESS":          epAuditEgress,
		"EP_AUDIT_ENFORCE_INGRESS": epAuditEnforceIngress,
		"EP_AUDIT_ENFORCE_EGRESS":  epAuditEnforceEgress,
		"AUDIT_EP_FLAG":            auditEpFlag,
		"HOST_EP_ID":               uint64(hostEpID),
		"HOST_SAFE_RULE_ID":        uint64(hostSafeRuleID),
		"VXLAN_PORT":               vxlanPort,
		"CT_F_DNS_PROXY":           ctFDNSProxy,
		"CT_F_DNS_OBSERVE":         ctFDNSObserve,
		"PROXY_KIND_DNS":           proxyKindDNS,
		"CT_F_SEEN_REPLY":          ctFSeenReply,
		"EP_TAP_INGRESS":           epTapIngress,
		"EP_TAP_EGRESS":            epTapEgress,
		"EP_MONITOR":               epMonitor,
		"TAP_ACTION_MIRROR":        tapActionMirror,
		"TAP_ACTION_REDIRECT":      tapActionRedirect,
		"TAP_F_MONITOR_UP":         tapFMonitorUp,
		"TAP_F_FAIL_OPEN":          tapFFailOpen,
		"TAP_F_ICMP_TYPE":          tapFICMPType,
		"TAP_F_ICMP_CODE":          tapFICMPCode,
		"TAP_F_REMOTE":             tapFRemote,
		"TAP_IF_RX":                tapIfRx,
		"TAP_IF_TX":                tapIfTx,
		"RAMPART_TAP_RULES":        MaxTapRules,
		"RAMPART_TAP_CONTRACTS":    MaxTapContracts,
		"CT_F_TO_PROXY":            ctFToProxy,
		"CT_F_FROM_PROXY":          ctFFromProxy,
		"PROXY_STEER_MARK":         ProxySteerMark,
		"PROXY_UPSTREAM_MARK":      ProxyUpstreamMark,
		"PROXY_DEFAULT_PORT":       uint64(DefaultProxyAddr.Port()),
		"ID_CIDR_SET_FIRST":        uint64(identity.FirstCIDRSet),
		"RAMPART_CIDR_SETS":        identity.MaxCIDRSets,
		"RAMPART_CIDR6_MAX":        DefaultCIDR6MaxEntries,
	}
	for name, v := range want {
		got, ok := c[name]
		if !ok {
			t.Errorf("%s not found in rampart.h", name)
			continue
		}
		if got != v {
			t.Errorf("%s = %d in rampart.h, %d in Go", name, got, v)
		}
	}
}

func TestPolicyKeyConversion(t *testing.T) {
	for _, c := range []struct {
		proto  policy.Protocol
		port   uint16
		plen   uint8
		want   uint32
		masked uint16
	}{
		{policy.ProtoAny, 0, 0, 72, 0},
		{policy.ProtoTCP, 0, 0, 80, 0},
		{policy.ProtoTCP, 80, 16, 96, 80},
		{policy.ProtoTCP, 8083, 13, 93, 8080},
		{policy.ProtoUDP, 0xffff, 1, 81, 0x8000},
	} {
		k, err := policyKey(5, mapstateKey5(c.proto, c.port, c.plen))
		if err != nil {
			t.Fatal(err)
		}
		if k.Prefixlen != c.want || k.EpId != 5 || k.Protocol != uint8(c.proto) {
			t.Errorf("%v/%d/%d: key %+v, want prefixlen %d", c.proto, c.port, c.plen, k, c.want)
		}
		// The port is stored in network byte order: its first byte is the high byte.
		b := [2]byte{byte(k.Dport), byte(k.Dport >> 8)}
		if got := uint16(b[0])<<8 | uint16(b[1]); got != c.masked {
			t.Errorf("%v/%d/%d: port bytes %x, want %d", c.proto, c.port, c.plen, b, c.masked)
		}
		_, back, ok := mapstateKey(k)
		if !ok || back.Port != c.masked || back.PortPrefixLen != c.plen || back.Protocol != c.proto {
			t.Errorf("%v/%d/%d: round trip %+v", c.proto, c.port, c.plen, back)
		}
	}
	if _, err := policyKey(1, mapstateKey5(policy.ProtoAny, 80, 16)); err == nil {
		t.Error("port prefix with any protocol accepted")
	}
	if _, err := policyKey(1, mapstateKey5(policy.ProtoTCP, 80, 17)); err == nil {
		t.Error("port prefix 17 accepted")
	}
}

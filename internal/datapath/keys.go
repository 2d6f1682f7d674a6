package datapath

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"net/netip"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

// Constants mirrored from bpf/include/rampart.h (checked by TestHeaderConstants).
const (
	familyV4 = 4
	familyV6 = 6

	policyAllow    = 1
	policyDeny     = 2
	policyRedirect = 3
	policyPass     = 4

	dirAdminFlag = 0x10 // DIR_ADMIN_FLAG: policy_key.direction of an Admin tier entry

	proxyKindDNS = 1 // PROXY_KIND_DNS: policy_value.proxy of a redirect to the DNS proxy

	enforceIngress = 1 << 0
	enforceEgress  = 1 << 1

	// policyKeyBits is the bit length of the policy key after prefixlen; ProtoAny entries
	// match on the first 72 (ep_id, identity, direction), protocol entries on 80 plus the
	// port prefix length.
	policyKeyBits     = 96
	policyAnyProtoLen = 72
	policyProtoLen    = 80

	// ipcachePrefixOffset is the number of key bits before the address (family + pad).
	ipcachePrefixOffset = 32
)

func htons(v uint16) uint16 { return bits.ReverseBytes16(v) } // hosts are little endian (bpfel)
func ntohs(v uint16) uint16 { return bits.ReverseBytes16(v) }

// policyKey converts a mapstate key of endpoint epID into the LPM key (masked, so equal
// prefixes always give equal keys).
func policyKey(epID uint32, k mapstate.Key) (rampartPolicyKey, error) {
	if k.Direction != policy.Ingress && k.Direction != policy.Egress {
		return rampartPolicyKey{}, fmt.Errorf("policy key %+v: invalid direction %d", k, k.Direction)
	}
	out := rampartPolicyKey{EpId: epID, Identity: k.Identity, Direction: uint8(k.Direction)}
	if k.Admin {
		out.Direction |= dirAdminFlag
	}
	if k.Protocol == policy.ProtoAny {
		if k.PortPrefixLen != 0 {
			return rampartPolicyKey{}, fmt.Errorf("policy key %+v: port prefix with any protocol", k)
		}
		out.Prefixlen = policyAnyProtoLen
		return out, nil
	}
	if k.PortPrefixLen > 16 {
		return rampartPolicyKey{}, fmt.Errorf("policy key %+v: port prefix length above 16", k)
	}
	out.Protocol = uint8(k.Protocol)
	out.Prefixlen = policyProtoLen + uint32(k.PortPrefixLen)
	port := k.Port
	if k.PortPrefixLen < 16 {
		port &^= 0xffff >> k.PortPrefixLen
	}
	out.Dport = htons(port)
	return out, nil
}

// mapstateKey converts an LPM key read from the map back; ok is false for keys this
// package never writes.
func mapstateKey(k rampartPolicyKey) (epID uint32, key mapstate.Key, ok bool) {
	key = mapstate.Key{Identity: identity.Identity(k.Identity), Direction: policy.Direction(k.Direction &^ dirAdminFlag), Admin: k.Direction&dirAdminFlag != 0}
	switch {
	case k.Prefixlen == policyAnyProtoLen:
		key.Protocol = policy.ProtoAny
	case k.Prefixlen >= policyProtoLen && k.Prefixlen <= policyKeyBits:
		key.Protocol = policy.Protocol(k.Protocol)
		key.PortPrefixLen = uint8(k.Prefixlen - policyProtoLen)
		key.Port = ntohs(k.Dport)
		if key.PortPrefixLen < 16 {
			key.Port &^= 0xffff >> key.PortPrefixLen
		}
	default:
		return 0, key, false
	}
	return k.EpId, key, true
}

// policyValue converts a mapstate value. Deny wins over Redirect, as in mapstate.
func policyValue(v mapstate.Value) rampartPolicyValue {
	out := rampartPolicyValue{Action: policyAllow, RuleId: v.RuleID, Prec: v.Prec}
	switch {
	case v.Deny:
		out.Action = policyDeny
	case v.Pass:
		out.Action = policyPass
	case v.Redirect:
		out.Action = policyRedirect
		if v.DNS {
			out.Proxy = proxyKindDNS
		}
	}
	return out
}

// mapstateValue converts a policy value read from the map back.
func mapstateValue(v rampartPolicyValue) mapstate.Value {
	redirect := v.Action == policyRedirect
	return mapstate.Value{Deny: v.Action == policyDeny, Redirect: redirect, DNS: redirect && v.Proxy == proxyKindDNS,
		Pass: v.Action == policyPass, Prec: v.Prec, RuleID: v.RuleId}
}

// normalizeKey masks a key read back from the map so it compares equal to the key written.
func normalizeKey(k rampartPolicyKey) rampartPolicyKey {
	switch {
	case k.Prefixlen <= policyAnyProtoLen:
		k.Protocol, k.Dport = 0, 0
	case k.Prefixlen < policyKeyBits:
		plen := k.Prefixlen - policyProtoLen
		port := ntohs(k.Dport) &^ (0xffff >> plen)
		k.Dport = htons(port)
	}
	return k
}

func ipcacheKey(p netip.Prefix) (rampartIpcacheKey, error) {
	if !p.IsValid() {
		return rampartIpcacheKey{}, fmt.Errorf("ipcache prefix %v: invalid", p)
	}
	p = p.Masked()
	var k rampartIpcacheKey
	addr := p.Addr()
	if addr.Is4() || addr.Is4In6() && p.Bits() >= 96 {
		if addr.Is4In6() {
			p = netip.PrefixFrom(addr.Unmap(), p.Bits()-96)
			addr = p.Addr()
		}
		k.Family = familyV4
		a := addr.As4()
		copy(k.Addr[:], a[:])
	} else {
		k.Family = familyV6
		k.Addr = addr.As16()
	}
	k.Prefixlen = ipcachePrefixOffset + uint32(p.Bits())
	return k, nil
}

func ipcachePrefix(k rampartIpcacheKey) (netip.Prefix, bool) {
	if k.Prefixlen < ipcachePrefixOffset {
		return netip.Prefix{}, false
	}
	bits := int(k.Prefixlen - ipcachePrefixOffset)
	switch k.Family {
	case familyV4:
		var a [4]byte
		copy(a[:], k.Addr[:4])
		p, err := netip.AddrFrom4(a).Prefix(bits)
		return p, err == nil
	case familyV6:
		p, err := netip.AddrFrom16(k.Addr).Prefix(bits)
		return p, err == nil
	}
	return netip.Prefix{}, false
}

// canonicalPrefix gives the form ipcache keys are tracked under (IPv4-mapped IPv6 prefixes
// become IPv4 ones, host bits cleared).
func canonicalPrefix(p netip.Prefix) netip.Prefix {
	k, err := ipcacheKey(p)
	if err != nil {
		return p
	}
	out, _ := ipcachePrefix(k)
	return out
}

// ipcacheEntryOf is the entry an ipcache map value holds (read back on Open).
func ipcacheEntryOf(v rampartIpcacheValue) mapstate.IPCacheEntry {
	e := mapstate.IPCacheEntry{Identity: v.Identity, Secondary: v.CidrIdentity, EndpointID: v.EpId}
	if v.TunnelEndpoint != 0 {
		var b [4]byte
		binary.NativeEndian.PutUint32(b[:], v.TunnelEndpoint)
		e.TunnelEndpoint = netip.AddrFrom4(b)
	}
	return e
}

package podaddr

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
)

// RouterLinkLocal is the link-local address of every endpoint's host-side veth, and so
// every endpoint's IPv6 default gateway. Every host veth has the same one (each is a link
// of its own, so they never meet), as Calico's fe80 gateway: an endpoint's routes do not
// depend on which veth it got.
var RouterLinkLocal = netip.MustParseAddr("fe80::1")

// Bounds of the IPv6 pod range's prefix length: at most /48, so that a node's range is
// no larger than a site's; at least /120, so that it holds a small IPv4 range's offsets.
const (
	MinBits6 = 48
	MaxBits6 = 120
)

// CheckPrefix6 says why cidr6 cannot be the IPv6 pod range beside the IPv4 range cidr4
// (nil: it can): it must be an IPv6 prefix (not an IPv4-mapped one) of MinBits6 to
// MaxBits6 bits, with at least as many host bits as cidr4, so that every offset of
// cidr4 has its address in it.
func CheckPrefix6(cidr4, cidr6 netip.Prefix) error {
	switch {
	case !cidr6.IsValid():
		return errors.New("not a prefix")
	case !cidr6.Addr().Is6():
		return errors.New("not an IPv6 prefix")
	case cidr6.Addr().Is4In6():
		return errors.New("an IPv4-mapped prefix, not an IPv6 one")
	case cidr6.Bits() < MinBits6 || cidr6.Bits() > MaxBits6:
		return fmt.Errorf("want a prefix length from /%d to /%d", MinBits6, MaxBits6)
	case cidr4.IsValid() && 128-cidr6.Bits() < 32-cidr4.Bits():
		return fmt.Errorf("%d host bits, fewer than the IPv4 pod range %v's %d: an endpoint's IPv6 address is its IPv4 address's offset in that range", 128-cidr6.Bits(), cidr4, 32-cidr4.Bits())
	}
	return nil
}

// Router6 is the node's IPv6 address in cidr6: the one paired with the IPv4 router (the
// first address after the network address), on the node's lo like it.
func Router6(cidr6 netip.Prefix) netip.Addr { return cidr6.Masked().Addr().Next() }

// Addrs returns the IPv6 address paired with ip4 (its offset in cidr4 added to cidr6's
// network address) and the link-local address of its interface (LinkLocal). Without
// cidr6 (an IPv4-only node) both are zero and the error nil.
func Addrs(cidr4, cidr6 netip.Prefix, ip4 netip.Addr) (ip6, ll netip.Addr, err error) {
	if !cidr6.IsValid() {
		return netip.Addr{}, netip.Addr{}, nil
	}
	if err := CheckPrefix6(cidr4, cidr6); err != nil {
		return netip.Addr{}, netip.Addr{}, fmt.Errorf("IPv6 pod range %v: %w", cidr6, err)
	}
	if !ip4.Is4() || !cidr4.Addr().Is4() || !cidr4.Contains(ip4) {
		return netip.Addr{}, netip.Addr{}, fmt.Errorf("address %v: not in the IPv4 pod range %v", ip4, cidr4)
	}
	n4, a4 := cidr4.Masked().Addr().As4(), ip4.As4()
	off := uint64(binary.BigEndian.Uint32(a4[:]) - binary.BigEndian.Uint32(n4[:]))
	b := cidr6.Masked().Addr().As16()
	// No carry out of the low half: cidr6 has at least as many host bits as cidr4 and
	// its network address has them all zero.
	binary.BigEndian.PutUint64(b[8:], binary.BigEndian.Uint64(b[8:])+off)
	ip6 = netip.AddrFrom16(b)
	ll = LinkLocal(ip6)
	if ll == RouterLinkLocal {
		// Only the router's own offset gets here; it is never an endpoint's.
		return netip.Addr{}, netip.Addr{}, fmt.Errorf("address %v: its link-local address would be the router's, %v", ip4, RouterLinkLocal)
	}
	return ip6, ll, nil
}

// LinkLocal is fe80:: with the low 64 bits of ip6 (its interface identifier).
func LinkLocal(ip6 netip.Addr) netip.Addr {
	b := ip6.As16()
	ll := [16]byte{0xfe, 0x80}
	copy(ll[8:], b[8:])
	return netip.AddrFrom16(ll)
}

// Last is the last address of IPv4 prefix p.
func Last(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]) | host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

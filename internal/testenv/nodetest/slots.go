package nodetest

import (
	"fmt"
	"net/netip"
	"path/filepath"

	"github.com/rampartnet/rampart/internal/testenv/controlplane"
	"github.com/rampartnet/rampart/internal/testenv/simcluster"
)

// MaxSlots is how many labs run on a host at once: the cluster benchmark keeps four
// clusters live (three tunnel modes and native routing's A/A control), and more would not
// fit two CPUs.
const MaxSlots = 4

// Slot is one place on a host where a lab runs beside others. What a lab puts in the host's
// network namespace (its link into the fabric with the host's address, routes to its nodes'
// pod CIDRs) and what its pods and kubelets are given (service range, DNS address) are the
// slot's, and no two slots share an address. Slot 0 is what a lab used before there were
// slots (the lock file, fabric, host address and ranges it still has), so a lab of older
// code, which knows slot 0 only, waits for a new lab there or holds it, and never collides
// with one in another slot.
type Slot struct {
	Index int
	// LockFile is held (flock) by the lab in the slot for as long as it runs.
	LockFile string
	// Fabric is the nodes' network: node i has .(i+1), the host HostAddress.
	Fabric      netip.Prefix
	HostAddress netip.Addr
	// ClusterCIDR is kube-controller-manager's --cluster-cidr, of which each node gets a
	// /NodeCIDRBits as its pod CIDR, routed from the host through the node.
	ClusterCIDR  netip.Prefix
	NodeCIDRBits int
	// ServiceCIDR is the API server's service range; the kubernetes Service has its first
	// address, and DNSServiceIP (kube-dns, the kubelets' clusterDNS) is in its low
	// sixteenth, which the API server keeps for addresses asked for by name.
	ServiceCIDR  netip.Prefix
	DNSServiceIP netip.Addr
}

// MaxNodes is the most nodes the slot gives a pod CIDR each (and its fabric holds).
func (s Slot) MaxNodes() int {
	return min(1<<(s.NodeCIDRBits-s.ClusterCIDR.Bits()), simcluster.MaxNodes)
}

// lockDir holds the slots' lock files and the host record.
const lockDir = "/run"

// SlotAt is slot i (0 to MaxSlots-1) with its lock file in dir (lockDir but in unit tests).
//
// Slot 0: fabric 198.19.254.0/24 (simcluster.FabricPrefix), pods 198.18.0.0/16 in /20s,
// services 198.19.255.0/24 (controlplane.DefaultServiceCIDR), lock
// /run/rampart-nodetest.lock. Slots 1 to 3 take 198.19.208.0/20 and 198.19.224.0/20: pods
// 198.19.208.0/21, .216.0/21, .224.0/21 in /24s (8 nodes), fabrics 198.19.232-234.0/24,
// services 198.19.236-238.0/24. Those are outside slot 0's ranges and outside what the
// simulated clusters that run beside the labs in CI use (simcluster's pod CIDRs, 198.18.16.0
// to 198.18.239.255 and 198.19.14.0 to 198.19.199.255; test/e2e's 198.19.200.0/24 and
// 198.19.250.0/23): those live in namespaces of their own, but an address that means two
// things on one host is a trap for whoever reads a trace.
func SlotAt(dir string, i int) Slot {
	if i == 0 {
		host := simcluster.FabricPrefix.Addr().As4()
		host[3] = 254
		return Slot{
			Index:        0,
			LockFile:     filepath.Join(dir, "rampart-nodetest.lock"),
			Fabric:       simcluster.FabricPrefix,
			HostAddress:  netip.AddrFrom4(host),
			ClusterCIDR:  netip.MustParsePrefix("198.18.0.0/16"),
			NodeCIDRBits: 20,
			ServiceCIDR:  controlplane.DefaultServiceCIDR,
			DNSServiceIP: netip.MustParseAddr("198.19.255.10"),
		}
	}
	b := byte(i - 1)
	return Slot{
		Index:        i,
		LockFile:     filepath.Join(dir, fmt.Sprintf("rampart-nodetest-%d.lock", i)),
		Fabric:       netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 19, 232 + b, 0}), 24),
		HostAddress:  netip.AddrFrom4([4]byte{198, 19, 232 + b, 254}),
		ClusterCIDR:  netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 19, 208 + 8*b, 0}), 21),
		NodeCIDRBits: 24,
		ServiceCIDR:  netip.PrefixFrom(netip.AddrFrom4([4]byte{198, 19, 236 + b, 0}), 24),
		DNSServiceIP: netip.AddrFrom4([4]byte{198, 19, 236 + b, 10}),
	}
}

// Slots are the host's slots, 0 to MaxSlots-1.
func Slots() []Slot {
	var s []Slot
	for i := range MaxSlots {
		s = append(s, SlotAt(lockDir, i))
	}
	return s
}

package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/mapstate"
)

// Host is host policy's place in the dataplane: its programs on the node's devices and
// the flows it lets by (host_safe).
type Host struct{ *handle }

// Constants mirrored from bpf/include/rampart.h (checked by TestHeaderConstants).
const (
	// EP_HOST: the endpoint is the node's own (host policy), on host devices.
	epHost = 1 << 8
	// HOST_EP_ID: the host endpoint's ep_id.
	hostEpID = mapstate.HostEndpointID
	// HOST_SAFE_RULE_ID: the rule ID of a host flow host_safe admits.
	hostSafeRuleID = mapstate.HostSafeRuleID
	// VXLAN_PORT: the overlay's port, which host policy never judges between nodes.
	vxlanPort = 4789
)

// The host programs' filters on a host device: before the IP-in-IP overlay's
// (fabricFilterPrio), which must see what host policy passes, and after nothing else of
// Rampart's. A program that passes a packet returns TC_ACT_UNSPEC so that the next filter
// runs.
const (
	filterToHost       = "rampart_to_host"
	filterFromHost     = "rampart_from_host"
	hostFilterPrio     = 0xb6
	maxHostSafeEntries = 64
)

// AttachHost puts the host programs on the host devices ifnames (the interfaces the node's
// own traffic enters and leaves by) in the network namespace at netnsPath:
// rampart_to_host on ingress, rampart_from_host on egress, replaced in place on a restart;
// it returns their interface indexes, for ApplyEndpoint with the host endpoint. Until the
// host endpoint's info is on an interface, every packet there is dropped
// (unknown-endpoint): attach, then apply. Devices that had them and are not in ifnames lose
// them (DetachHost).
func (d *Host) AttachHost(netnsPath string, ifnames []string) ([]uint32, error) {
	h, err := netlinkHandle(netnsPath)
	if err != nil {
		return nil, fmt.Errorf("attaching host policy: %w", err)
	}
	defer h.Close()
	progs, err := programs(d.handle, (*dataplaneObjects).hostProgs)
	if err != nil {
		return nil, fmt.Errorf("attaching host policy: %w", err)
	}
	var idxs []uint32
	for _, ifname := range ifnames {
		lnk, err := h.LinkByName(ifname)
		if err != nil {
			return nil, fmt.Errorf("attaching host policy to %s: finding interface: %w", ifname, err)
		}
		idx := lnk.Attrs().Index
		if err := h.QdiscAdd(clsact(idx)); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("attaching host policy to %s: adding clsact qdisc: %w", ifname, err)
		}
		if err := h.FilterReplace(hostFilters.filter(idx, netlink.HANDLE_MIN_INGRESS, filterToHost, progs.RampartToHost)); err != nil {
			return nil, fmt.Errorf("attaching host policy to %s: tc ingress filter: %w", ifname, err)
		}
		if err := h.FilterReplace(hostFilters.filter(idx, netlink.HANDLE_MIN_EGRESS, filterFromHost, progs.RampartFromHost)); err != nil {
			return nil, fmt.Errorf("attaching host policy to %s: tc egress filter: %w", ifname, err)
		}
		idxs = append(idxs, uint32(idx))
	}
	if _, err := DetachHost(netnsPath, ifnames...); err != nil {
		return nil, err
	}
	return idxs, nil
}

// DetachHost removes the host programs from every interface of the network namespace at
// netnsPath except those in keep, and returns the interfaces it removed them from.
func DetachHost(netnsPath string, keep ...string) ([]string, error) {
	return hostFilters.detach(netnsPath, keep)
}

// DetachHostDevices takes the host programs off every interface of the network namespace
// at netnsPath (DetachHost).
func (d *Host) DetachHostDevices(netnsPath string) error {
	_, err := DetachHost(netnsPath)
	return err
}

// RecheckFlows makes every established flow be checked again on its next packet (the
// ipcache generation moves), for a change no endpoint's revision records: the host's
// policy, which the endpoints' veths apply to flows between them and the node.
func (d *Host) RecheckFlows() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.bumpIPCacheGeneration()
}

// HostSafe is a peer of the node, with its port and protocol, that the node's own flows
// reach whatever host policy says (both ways: the flow is created on the node's side).
type HostSafe struct {
	Addr  netip.AddrPort
	Proto uint8
}

// SetHostSafe makes the host_safe maps hold exactly entries (at most 64 of each family):
// the IPv4 ones in host_safe, the IPv6 ones in host_safe6.
func (d *Host) SetHostSafe(entries []HostSafe) error {
	want4 := map[rampartHostSafeKey]bool{}
	want6 := map[rampartHostSafe6Key]bool{}
	for _, e := range entries {
		if e.Addr.Addr().Unmap().Is4() {
			want4[hostSafeKey(e)] = true
		} else {
			want6[hostSafe6Key(e)] = true
		}
	}
	if len(want4) > maxHostSafeEntries || len(want6) > maxHostSafeEntries {
		return fmt.Errorf("host safe flows: %d IPv4 and %d IPv6, at most %d of each", len(want4), len(want6), maxHostSafeEntries)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := syncSet(d.objs.HostSafe, want4); err != nil {
		return fmt.Errorf("host safe flows: %w", err)
	}
	if err := syncSet(d.objs.HostSafe6, want6); err != nil {
		return fmt.Errorf("host safe flows (IPv6): %w", err)
	}
	return nil
}

// syncSet makes the set map m (key -> 1) hold exactly the keys of want: the new ones
// written before the stale ones go, so no key of want is missing at any time.
func syncSet[K comparable](m *ebpf.Map, want map[K]bool) error {
	for k := range want {
		if err := m.Update(&k, uint8(1), ebpf.UpdateAny); err != nil {
			return fmt.Errorf("writing: %w", err)
		}
	}
	var k K
	var v uint8
	var stale []K
	it := m.Iterate()
	for it.Next(&k, &v) {
		if !want[k] {
			stale = append(stale, k)
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("reading: %w", err)
	}
	for _, k := range stale {
		if err := m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting: %w", err)
		}
	}
	return nil
}

func hostSafeKey(e HostSafe) rampartHostSafeKey {
	a := e.Addr.Addr().Unmap().As4()
	var port [2]byte
	binary.BigEndian.PutUint16(port[:], e.Addr.Port())
	// Both in network order in the key's memory.
	return rampartHostSafeKey{
		Addr:  binary.NativeEndian.Uint32(a[:]),
		Port:  binary.NativeEndian.Uint16(port[:]),
		Proto: e.Proto,
	}
}

func hostSafe6Key(e HostSafe) rampartHostSafe6Key {
	var port [2]byte
	binary.BigEndian.PutUint16(port[:], e.Addr.Port())
	return rampartHostSafe6Key{
		Addr:  e.Addr.Addr().As16(),
		Port:  binary.NativeEndian.Uint16(port[:]),
		Proto: e.Proto,
	}
}

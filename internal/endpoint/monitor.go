package endpoint

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// The interfaces of a monitor endpoint (flow taps) in its namespace, besides its own
// PodIfName: copies and diverted packets arrive on MonitorRxIfName; a monitor that sits
// inline (redirect) sends what it lets through out of MonitorTxIfName.
const (
	MonitorRxIfName = "tap-rx"
	MonitorTxIfName = "tap-tx"
)

// MonitorLinks are a monitor endpoint's receive and return veth pairs.
type MonitorLinks struct {
	// HostRx and HostTx are the host sides in the node namespace, with their indexes.
	HostRx, HostTx           string
	HostRxIndex, HostTxIndex int
}

// MonitorHostIfNames returns the host-side names of a monitor endpoint's receive and
// return veths: its HostIfName with "r" or "t" (11 characters, within IFNAMSIZ).
func (n Node) MonitorHostIfNames(namespace, name string) (rx, tx string) {
	h := n.HostIfName(namespace, name)
	return h + "r", h + "t"
}

// CreateMonitorLinks gives the monitor endpoint ep (made by Create or CreateIn) its
// receive and return veth pairs: MonitorRxIfName and MonitorTxIfName in its namespace, no
// addresses on either side (no one can address them), no IPv6. attach, when not nil, runs
// with the host sides' names while both ends are still down, so that the dataplane's
// return program (datapath.AttachMonitor) is on them before the monitor can send anything.
// The return side's host end does no reverse-path check: it carries packets whose
// sources are reached through other interfaces. On error what was made is removed.
func (n Node) CreateMonitorLinks(ep Endpoint, attach func(rx, tx string) error) (ml MonitorLinks, err error) {
	ml.HostRx, ml.HostTx = n.MonitorHostIfNames(ep.Namespace, ep.Name)
	node, err := n.handle()
	if err != nil {
		return ml, err
	}
	defer node.Close()
	podNs, err := netns.GetFromPath(ep.NetnsPath)
	if err != nil {
		return ml, fmt.Errorf("opening monitor network namespace %s: %w", ep.NetnsPath, err)
	}
	defer podNs.Close()
	pod, err := netlink.NewHandleAt(podNs, unix.NETLINK_ROUTE)
	if err != nil {
		return ml, fmt.Errorf("netlink handle in monitor network namespace: %w", err)
	}
	defer pod.Close()
	var created []string // only these are removed on error, never links that were there
	defer func() {
		if err != nil {
			for _, name := range created {
				if l, lerr := node.LinkByName(name); lerr == nil {
					node.LinkDel(l)
				}
			}
		}
	}()
	pairs := []struct{ host, pod string }{{ml.HostRx, MonitorRxIfName}, {ml.HostTx, MonitorTxIfName}}
	for _, p := range pairs {
		if _, err := node.LinkByName(p.host); err == nil {
			return ml, fmt.Errorf("host interface %s already exists", p.host)
		}
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: p.host, MTU: n.MTU},
			PeerName:      p.pod,
			PeerNamespace: netlink.NsFd(int(podNs)),
		}
		if err := node.LinkAdd(veth); err != nil {
			return ml, fmt.Errorf("creating veth %s: %w", p.host, err)
		}
		created = append(created, p.host)
	}
	if attach != nil {
		if err := attach(ml.HostRx, ml.HostTx); err != nil {
			return ml, fmt.Errorf("attaching to %s and %s: %w", ml.HostRx, ml.HostTx, err)
		}
	}
	err = Do(n.NetnsPath(), func() error {
		for _, k := range []string{
			"net/ipv6/conf/" + ml.HostRx + "/disable_ipv6",
			"net/ipv6/conf/" + ml.HostTx + "/disable_ipv6",
		} {
			_ = writeSysctl(k, "1") // a kernel without IPv6 has nothing to quiet
		}
		return writeSysctl("net/ipv4/conf/"+ml.HostTx+"/rp_filter", "0")
	})
	if err != nil {
		return ml, err
	}
	for _, p := range pairs {
		l, err := pod.LinkByName(p.pod)
		if err != nil {
			return ml, fmt.Errorf("finding monitor %s: %w", p.pod, err)
		}
		_ = pod.LinkSetIP6AddrGenMode(l, in6AddrGenModeNone)
		if err := pod.LinkSetUp(l); err != nil {
			return ml, fmt.Errorf("setting monitor %s up: %w", p.pod, err)
		}
		h, err := node.LinkByName(p.host)
		if err != nil {
			return ml, fmt.Errorf("finding %s: %w", p.host, err)
		}
		if err := node.LinkSetUp(h); err != nil {
			return ml, fmt.Errorf("setting %s up: %w", p.host, err)
		}
		if p.host == ml.HostRx {
			ml.HostRxIndex = h.Attrs().Index
		} else {
			ml.HostTxIndex = h.Attrs().Index
		}
	}
	for _, p := range pairs {
		if err := WaitOperUp(node, p.host, linkUpTimeout); err != nil {
			return ml, err
		}
		if err := WaitOperUp(pod, p.pod, linkUpTimeout); err != nil {
			return ml, fmt.Errorf("monitor side: %w", err)
		}
	}
	return ml, nil
}

// DeleteMonitorLinks removes a monitor endpoint's receive and return veth pairs. Missing
// ones are not an error (deleting the endpoint's namespace removes them too).
func (n Node) DeleteMonitorLinks(namespace, name string) error {
	node, err := n.handle()
	if err != nil {
		return err
	}
	defer node.Close()
	rx, tx := n.MonitorHostIfNames(namespace, name)
	var errs []error
	for _, ifname := range []string{rx, tx} {
		l, err := node.LinkByName(ifname)
		if err != nil {
			var nf netlink.LinkNotFoundError
			if !errors.As(err, &nf) {
				errs = append(errs, fmt.Errorf("finding %s: %w", ifname, err))
			}
			continue
		}
		if err := node.LinkDel(l); err != nil {
			errs = append(errs, fmt.Errorf("deleting %s: %w", ifname, err))
		}
	}
	return errors.Join(errs...)
}

package endpoint

import (
	"fmt"
	"time"

	"github.com/vishvananda/netlink"
)

// linkUpTimeout bounds the wait for a new veth to carry packets. The kernel's link watcher
// normally acts within milliseconds; seconds mean something is wrong.
const linkUpTimeout = 5 * time.Second

// WaitOperUp polls until the named link's operational state is up.
//
// Why: after both ends of a veth are set up, the kernel keeps the no-op qdisc, which drops
// every packet, until its link watcher has run. A packet sent in that window is lost; if it
// is the first ARP request, the next one follows only a second later, so a fresh endpoint
// looks unreachable for a second. Waiting here means "created" also means "can send".
func WaitOperUp(h *netlink.Handle, name string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		l, err := h.LinkByName(name)
		if err != nil {
			return fmt.Errorf("finding %s: %w", name, err)
		}
		state := l.Attrs().OperState
		if state == netlink.OperUp {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("link %s still %s after %s", name, state, timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

package agent_test

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/rampartnet/rampart/internal/agent"
	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/testenv"
)

// In a node namespace the instance did not create (the root namespace of a real host),
// the VXLAN device, the IP-in-IP programs on the fabric interface and the routes to other
// nodes are the instance's own: uninstall removes them and leaves a route of someone
// else's to the same kind of prefix, and the fabric interface.
func TestUninstallRemovesOverlay(t *testing.T) {
	testenv.RequireRoot(t)
	for _, mode := range []overlay.Mode{overlay.VXLAN, overlay.IPIP} {
		t.Run(string(mode), func(t *testing.T) { testUninstallRemovesOverlay(t, mode) })
	}
}

func testUninstallRemovesOverlay(t *testing.T, mode overlay.Mode) {
	inst := "o" + testenv.Suffix(8)
	nodeNs := "rp-" + inst + "-node"
	if _, err := endpoint.CreateNetns(nodeNs); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { endpoint.DeleteNetns(nodeNs) })
	nodePath := endpoint.NetnsPath(nodeNs)
	userRoute := netip.MustParsePrefix("198.19.200.0/24")
	inNode(t, nodePath, func(h *netlink.Handle) error {
		lo, err := h.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := h.LinkSetUp(lo); err != nil {
			return err
		}
		if err := h.RouteAdd(&netlink.Route{LinkIndex: lo.Attrs().Index, Dst: &net.IPNet{IP: userRoute.Addr().AsSlice(), Mask: net.CIDRMask(24, 32)}}); err != nil {
			return err
		}
		// The fabric: an interface with the node's address, through which node B's
		// address is reached (its peer stays in the namespace, which is all a route
		// needs).
		if err := h.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "fabric0"}, PeerName: "fabric1"}); err != nil {
			return err
		}
		for _, name := range []string{"fabric0", "fabric1"} {
			l, err := h.LinkByName(name)
			if err != nil {
				return err
			}
			if err := h.LinkSetUp(l); err != nil {
				return err
			}
		}
		f, err := h.LinkByName("fabric0")
		if err != nil {
			return err
		}
		a, _ := netlink.ParseAddr("198.19.255.1/24")
		return h.AddrAdd(f, a)
	})
	fabricFilters := func(h *netlink.Handle) []string { return testenv.BPFFilterNames(t, h, "fabric0") }
	sockDir, err := os.MkdirTemp("", "rp-sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	cfg := agent.Config{
		Instance: inst, StateDir: filepath.Join(t.TempDir(), "state"), Socket: filepath.Join(sockDir, "r.sock"),
		BPFDir: filepath.Join("/sys/fs/bpf/rampart", inst), NodeNetns: nodeNs,
		PodCIDR: netip.MustParsePrefix("198.18.16.0/20"), CIDRHostSlots: 1 << 16, Tunnel: mode,
		Logger: slog.New(slog.NewTextHandler(testLog{t}, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	uninstalled := false
	t.Cleanup(func() {
		if !uninstalled {
			agent.Uninstall(cfg)
		}
	})
	a, err := agent.New(cfg)
	if err != nil {
		t.Fatalf("starting agent: %v", err)
	}
	if _, err := a.PutNode(context.Background(), "node-b", api.NodeSpec{Address: "198.19.255.2", PodCIDR: "198.18.32.0/20"}); err != nil {
		a.Close()
		t.Fatal(err)
	}
	podCIDRB := netip.MustParsePrefix("198.18.32.0/20")
	if routes, err := overlay.Routes(nodePath); err != nil || !slices.Equal(routes, []netip.Prefix{podCIDRB}) {
		a.Close()
		t.Fatalf("routes to other nodes %v (%v), want %v", routes, err, podCIDRB)
	}
	inNode(t, nodePath, func(h *netlink.Handle) error {
		l, err := h.LinkByName(overlay.DeviceName)
		switch {
		case mode != overlay.VXLAN:
			if err == nil {
				t.Errorf("%s: %s exists", mode, overlay.DeviceName)
			}
			if got, want := fabricFilters(h), []string{"rampart_from_ipip", "rampart_to_ipip"}; !slices.Equal(got, want) {
				t.Errorf("filters on the fabric interface %v, want %v", got, want)
			}
		case err != nil:
			t.Errorf("VXLAN device: %v", err)
		default:
			if vx, ok := l.(*netlink.Vxlan); !ok || !vx.FlowBased || vx.Port != overlay.Port {
				t.Errorf("%s is %+v, want a collect_md VXLAN device on port %d", overlay.DeviceName, l, overlay.Port)
			}
		}
		return nil
	})
	a.Close()

	if err := agent.Uninstall(cfg); err != nil {
		t.Fatalf("uninstall: %v", err)
	}
	uninstalled = true
	if routes, err := overlay.Routes(nodePath); err != nil || len(routes) != 0 {
		t.Errorf("routes to other nodes left: %v (%v)", routes, err)
	}
	inNode(t, nodePath, func(h *netlink.Handle) error {
		if _, err := h.LinkByName(overlay.DeviceName); err == nil {
			t.Errorf("%s left in the node namespace", overlay.DeviceName)
		}
		if got := fabricFilters(h); len(got) != 0 {
			t.Errorf("filters left on the fabric interface: %v", got)
		}
		if qs, err := h.QdiscList(mustLink(t, h, "fabric0")); err != nil || slices.ContainsFunc(qs, func(q netlink.Qdisc) bool { return q.Type() == "clsact" }) {
			t.Errorf("clsact qdisc left on the fabric interface (%v)", err)
		}
		rs, err := h.RouteGet(userRoute.Addr().AsSlice())
		if err != nil || len(rs) == 0 {
			t.Errorf("the user's route to %v was removed (%v)", userRoute, err)
		}
		return nil
	})
}

func mustLink(t *testing.T, h *netlink.Handle, name string) netlink.Link {
	t.Helper()
	l, err := h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

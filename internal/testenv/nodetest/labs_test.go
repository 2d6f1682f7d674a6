package nodetest

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/clustertest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	clustertest.Bins.Remove()
	os.Exit(code)
}

// ended is what a lab left to check once it has ended: its host link, namespaces, routes
// and cgroups.
type ended struct {
	slot     int
	hostLink string
	netns    []string
	podCIDRs []netip.Prefix
	cgroups  []string
}

// Two labs at once, of two nodes each, in two slots: each API server knows its own two
// nodes only, at addresses of its slot's fabric; a pod on each node, with an address of
// the slot's pod range, connects to the other node's pod and to its API server (on the
// host, through the slot's host link and the route back to the pod CIDR), and kubectl exec
// reaches them through the kubelets. When both have ended, nothing of theirs is left on
// the host (links, routes, network namespaces, cgroups) and, if no other lab ran
// meanwhile, the sysctls are the host's again.
func TestTwoLabsAtOnce(t *testing.T) {
	testenv.RequireRoot(t)
	began := time.Now()
	before, idleBefore := hostSnapshot(t)
	var mu sync.Mutex
	var labs []ended
	t.Run("labs", func(t *testing.T) {
		for i := range 2 {
			t.Run(fmt.Sprintf("lab-%d", i+1), func(t *testing.T) {
				t.Parallel()
				c := Start(t, Options{Nodes: 2})
				e := ended{slot: c.Slot.Index, hostLink: c.hostLink}
				for _, n := range c.Nodes {
					e.netns = append(e.netns, n.Netns)
					e.podCIDRs = append(e.podCIDRs, n.PodCIDR)
					e.cgroups = append(e.cgroups, n.CgroupRoot)
				}
				e.netns = append(e.netns, strings.TrimSuffix(c.Nodes[0].Netns, "-n1")+"-fab")
				mu.Lock()
				labs = append(labs, e)
				mu.Unlock()
				checkLab(t, c)
			})
		}
	})
	if len(labs) != 2 {
		t.Fatalf("%d labs started, want 2", len(labs))
	}
	if labs[0].slot == labs[1].slot {
		t.Errorf("both labs in slot %d", labs[0].slot)
	}
	for _, e := range labs {
		if _, err := netlink.LinkByName(e.hostLink); err == nil {
			t.Errorf("slot %d: host link %s left", e.slot, e.hostLink)
		}
		for _, ns := range e.netns {
			if endpoint.NetnsExists(ns) {
				t.Errorf("slot %d: network namespace %s left", e.slot, ns)
			}
		}
		for _, p := range e.podCIDRs {
			routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4,
				&netlink.Route{Dst: &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}}, netlink.RT_FILTER_DST)
			if err != nil || len(routes) > 0 {
				t.Errorf("slot %d: route to pod CIDR %v left: %v (%v)", e.slot, p, routes, err)
			}
		}
		for _, cg := range e.cgroups {
			if _, err := os.Stat(filepath.Join(cgroupBase, "memory", cg)); err == nil {
				t.Errorf("slot %d: cgroup %s left", e.slot, cg)
			}
		}
	}
	if links, err := LeftoverHostLinks(); err != nil || len(links) > 0 {
		t.Errorf("host links of free slots: %v (%v)", links, err)
	}
	after, idleAfter := hostSnapshot(t)
	if idleBefore && idleAfter {
		for s, v := range before {
			if after[s] != v {
				t.Errorf("sysctl %s is %q after the labs, %q before", s, after[s], v)
			}
		}
	} else {
		t.Logf("other labs ran beside these (idle before %v, after %v): the sysctls are theirs to restore", idleBefore, idleAfter)
	}
	t.Logf("two labs of two nodes at once, started, checked and ended in %v", time.Since(began).Round(time.Millisecond))
}

// hostSnapshot reads the sysctls and says whether no lab runs on the host (none in the
// record, none of older code in slot 0).
func hostSnapshot(t *testing.T) (map[string]string, bool) {
	t.Helper()
	h := theHost(t.Logf)
	var vals map[string]string
	idle := false
	err := h.locked(func(rec *hostRecord) (bool, error) {
		older, err := h.olderLab(rec)
		if err != nil {
			return false, err
		}
		idle = len(rec.Labs) == 0 && !older
		vals, err = h.readSysctls()
		return false, err
	})
	if err != nil {
		t.Fatal(err)
	}
	return vals, idle
}

// checkLab checks one lab: its nodes, a pod on each, their connections.
func checkLab(t *testing.T, c *Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, n := range nodes.Items {
		names = append(names, n.Name)
		for _, a := range n.Status.Addresses {
			if ip, err := netip.ParseAddr(a.Address); a.Type == corev1.NodeInternalIP && (err != nil || !c.Slot.Fabric.Contains(ip)) {
				t.Errorf("slot %d: node %s at %s, outside the slot's fabric %v", c.Slot.Index, n.Name, a.Address, c.Slot.Fabric)
			}
		}
	}
	slices.Sort(names)
	if strings.Join(names, ",") != "node-1,node-2" {
		t.Errorf("slot %d: the API server knows nodes %v, want its own node-1 and node-2", c.Slot.Index, names)
	}

	ns := "labs-" + testenv.Suffix(6)
	c.MustKubectl("create", "namespace", ns)
	var pods []*corev1.Pod
	for _, n := range c.Nodes {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "web-" + n.Name, Namespace: ns},
			Spec: corev1.PodSpec{NodeName: n.Name, TerminationGracePeriodSeconds: new(int64),
				Containers: []corev1.Container{{Name: "agnhost", Image: c.Bins.AgnhostImage, ImagePullPolicy: corev1.PullNever,
					Args: []string{"netexec", "--http-port=8080"}}}},
		}
		if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range c.Nodes {
		var p *corev1.Pod
		if !testenv.Eventually(2*time.Minute, func() bool {
			p, err = c.Client.CoreV1().Pods(ns).Get(ctx, "web-"+n.Name, metav1.GetOptions{})
			return err == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != ""
		}) {
			t.Fatalf("slot %d: pod on %s not running after 2 minutes: %+v (%v)", c.Slot.Index, n.Name, p, err)
		}
		ip, err := netip.ParseAddr(p.Status.PodIP)
		if err != nil || !c.Slot.ClusterCIDR.Contains(ip) || !n.PodCIDR.Contains(ip) {
			t.Errorf("slot %d: pod on %s at %s, want it in the node's %v of the slot's %v", c.Slot.Index, n.Name, p.Status.PodIP, n.PodCIDR, c.Slot.ClusterCIDR)
		}
		pods = append(pods, p)
	}
	u, err := url.Parse(c.Server)
	if err != nil {
		t.Fatal(err)
	}
	for i, from := range pods {
		to := pods[1-i]
		for _, addr := range []string{to.Status.PodIP + ":8080", u.Host} {
			var out string
			if !testenv.Eventually(time.Minute, func() bool {
				out, err = c.Kubectl("-n", ns, "exec", from.Name, "--", "/agnhost", "connect", addr, "--timeout=2s")
				return err == nil
			}) {
				t.Errorf("slot %d: %s cannot reach %s: %v\n%s", c.Slot.Index, from.Name, addr, err, out)
			}
		}
	}
	t.Logf("slot %d: nodes %v, pods at %s and %s connect to each other and to the API server at %s",
		c.Slot.Index, names, pods[0].Status.PodIP, pods[1].Status.PodIP, u.Host)
}

// Package cni tests the CNI plugin (cmd/rampart-cni) as a container runtime runs it:
// through libcni, with a network configuration list in a file, the built plugin binary,
// namespaces the test makes as a runtime would, and a real agent.
package cni

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

var bins = testenv.Binaries{Packages: []string{"./cmd/rampart-cni"}}

func TestMain(m *testing.M) { bins.Main(m) }

// runtime is what a container runtime holds: the plugin directory, its result cache and
// the network configuration list.
type runtime struct {
	t    *testing.T
	cni  *libcni.CNIConfig
	list *libcni.NetworkConfigList
}

func newRuntime(t *testing.T, socket string) *runtime {
	t.Helper()
	confDir := t.TempDir()
	conf := `{
  "cniVersion": "1.1.0",
  "name": "rampart-test",
  "plugins": [{"type": "rampart-cni", "socket": "` + socket + `"}]
}`
	path := filepath.Join(confDir, "10-rampart.conflist")
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	list, err := libcni.ConfListFromFile(path)
	if err != nil {
		t.Fatalf("loading %s: %v", path, err)
	}
	return &runtime{
		t:    t,
		cni:  libcni.NewCNIConfigWithCacheDir([]string{bins.Dir(t)}, t.TempDir(), nil),
		list: list,
	}
}

// sandbox is a pod's namespace, made by the test as a runtime makes one.
type sandbox struct {
	id, netns string
	rt        *libcni.RuntimeConf
}

func newSandbox(t *testing.T, podNS, pod string) *sandbox {
	sfx := testenv.Suffix(8)
	path := testenv.NewNetns(t, "rp-cnitest-"+sfx)
	return &sandbox{
		id:    "ctr" + sfx,
		netns: path,
		rt: &libcni.RuntimeConf{
			ContainerID: "ctr" + sfx,
			NetNS:       path,
			IfName:      "eth0",
			Args:        [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", podNS}, {"K8S_POD_NAME", pod}},
		},
	}
}

func (r *runtime) add(sb *sandbox) *types100.Result {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	res, err := r.cni.AddNetworkList(ctx, r.list, sb.rt)
	if err != nil {
		r.t.Fatalf("ADD %s: %v", sb.id, err)
	}
	out, err := types100.NewResultFromResult(res)
	if err != nil {
		r.t.Fatalf("ADD %s result: %v", sb.id, err)
	}
	return out
}

func (r *runtime) del(sb *sandbox) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return r.cni.DelNetworkList(ctx, r.list, sb.rt)
}

func (r *runtime) check(sb *sandbox) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return r.cni.CheckNetworkList(ctx, r.list, sb.rt)
}

func (r *runtime) status() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return r.cni.GetStatusNetworkList(ctx, r.list)
}

// cniCode is the CNI error code of err (0 if it is not a CNI error).
func cniCode(err error) uint {
	var e *types.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

func endpointKeys(t *testing.T, env *agenttest.Env) []string {
	t.Helper()
	eps, err := env.Client.ListEndpoints(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, e := range eps {
		keys = append(keys, e.Namespace+"/"+e.Name)
	}
	return keys
}

// podAddr is the address of a result's container interface, checked to be the only one.
func podAddr(t *testing.T, res *types100.Result) netip.Addr {
	t.Helper()
	if len(res.IPs) != 1 || res.IPs[0].Interface == nil {
		t.Fatalf("result IPs %v, want one on an interface", res.IPs)
	}
	a, ok := netip.AddrFromSlice(res.IPs[0].Address.IP.To4())
	if !ok {
		t.Fatalf("result address %v", res.IPs[0].Address)
	}
	return a
}

const denyIngressStore = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-ingress, namespace: store}
spec:
  podSelector: {}
  policyTypes: [Ingress]
`

// The whole life of CNI attachments through libcni: ADD (result, address in the pod's
// namespace, traffic passes, a policy then drops it), CHECK, DEL twice, the agent down
// (STATUS and ADD answer the spec's errors) and restarted (it still knows its CNI
// endpoints), GC with a valid list, VERSION.
func TestCNIThroughLibcni(t *testing.T) {
	testenv.RequireRoot(t)
	env := agenttest.StartAgent(t, agenttest.Options{NoServers: true})
	rt := newRuntime(t, env.Socket())
	ctx := context.Background()

	// VERSION
	vi, err := rt.cni.GetVersionInfo(ctx, "rampart-cni")
	if err != nil {
		t.Fatalf("VERSION: %v", err)
	}
	if got := vi.SupportedVersions(); !slices.Contains(got, "1.0.0") || !slices.Contains(got, "1.1.0") {
		t.Fatalf("VERSION lists %v", got)
	}
	if err := rt.status(); err != nil {
		t.Fatalf("STATUS with the agent running: %v", err)
	}

	client := newSandbox(t, "shop", "client")
	server := newSandbox(t, "store", "server")
	resC := rt.add(client)
	resS := rt.add(server)

	// The result: the node side and the pod side of the veth, the address on the pod
	// side, the gateway the node's router.
	router := netip.MustParseAddr("198.18.0.1")
	for _, tc := range []struct {
		sb  *sandbox
		res *types100.Result
	}{{client, resC}, {server, resS}} {
		res := tc.res
		if res.CNIVersion != "1.1.0" || len(res.Interfaces) != 2 {
			t.Fatalf("result %s", res)
		}
		podIf := res.Interfaces[*res.IPs[0].Interface]
		if podIf.Name != "eth0" || podIf.Sandbox != tc.sb.netns || podIf.Mac == "" || res.Interfaces[0].Sandbox != "" || !strings.HasPrefix(res.Interfaces[0].Name, "rp") {
			t.Fatalf("result interfaces %+v %+v", res.Interfaces[0], res.Interfaces[1])
		}
		addr := podAddr(t, res)
		if !netip.MustParsePrefix("198.18.0.0/16").Contains(addr) || res.IPs[0].Address.String() != addr.String()+"/32" {
			t.Fatalf("result address %v", res.IPs[0].Address)
		}
		if gw, _ := netip.AddrFromSlice(res.IPs[0].Gateway.To4()); gw != router {
			t.Fatalf("result gateway %v, want %v", res.IPs[0].Gateway, router)
		}
		if len(res.Routes) != 1 || res.Routes[0].Dst.String() != "0.0.0.0/0" {
			t.Fatalf("result routes %v", res.Routes)
		}
		// The address is on the interface inside the pod's namespace, with the MAC the
		// result names.
		h := testenv.NetlinkHandle(t, tc.sb.netns)
		l, err := h.LinkByName("eth0")
		if err != nil {
			t.Fatalf("eth0 in %s: %v", tc.sb.netns, err)
		}
		addrs, err := h.AddrList(l, netlink.FAMILY_V4)
		if err != nil || len(addrs) != 1 || !addrs[0].IP.Equal(addr.AsSlice()) {
			t.Fatalf("eth0 in %s has %v (%v), want %v", tc.sb.netns, addrs, err, addr)
		}
		if l.Attrs().HardwareAddr.String() != podIf.Mac {
			t.Fatalf("eth0 MAC %v, result %s", l.Attrs().HardwareAddr, podIf.Mac)
		}
	}
	if keys := endpointKeys(t, env); !slices.Equal(keys, []string{"shop/client", "store/server"}) {
		t.Fatalf("agent endpoints %v", keys)
	}
	// The agent shows the attachment, and `rampart endpoint get` with it.
	if ep := env.Endpoint("store/server"); ep.CNI == nil || ep.CNI.ContainerID != server.id || ep.CNI.IfName != "eth0" || ep.Netns != server.netns || len(ep.Labels) != 0 {
		t.Fatalf("agent's view of the server: %+v (CNI %+v)", ep, ep.CNI)
	}
	if out := env.MustCLI("endpoint", "get", "store/server"); !strings.Contains(out, "container "+server.id+", interface eth0") {
		t.Fatalf("endpoint get:\n%s", out)
	}

	// Traffic between the pods passes with no policy and is dropped after a policy that
	// denies the server's ingress.
	srv, err := testenv.Serve(server.netns, []uint16{80}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	to := netip.AddrPortFrom(podAddr(t, resS), 80)
	if !testenv.Probe(client.netns, to, "tcp", 5*time.Second) {
		t.Fatal("client cannot reach server without policy")
	}
	if _, err := env.Client.Apply(ctx, api.ApplyRequest{Documents: []api.Document{{Source: "deny.yaml", Data: denyIngressStore}}}); err != nil {
		t.Fatal(err)
	}
	if testenv.Probe(client.netns, to, "tcp", 2*time.Second) {
		t.Fatal("client reaches server after the deny policy")
	}

	// CHECK: the attachment as made passes; an unknown container does not.
	if err := rt.check(client); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	ghost := &sandbox{id: "ghost", rt: &libcni.RuntimeConf{ContainerID: "ghost", NetNS: client.netns, IfName: "eth0"}}
	if err := rt.check(ghost); cniCode(err) != types.ErrUnknownContainer {
		t.Fatalf("CHECK of an unknown container: %v", err)
	}

	// DEL twice: the second succeeds too. The pod's namespace stays (the runtime's).
	if err := rt.del(client); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if err := rt.del(client); err != nil {
		t.Fatalf("second DEL: %v", err)
	}
	if _, err := testenv.NetlinkHandle(t, client.netns).LinkByName("eth0"); err == nil {
		t.Fatal("eth0 still in the pod's namespace after DEL")
	}
	if keys := endpointKeys(t, env); !slices.Equal(keys, []string{"store/server"}) {
		t.Fatalf("agent endpoints after DEL %v", keys)
	}

	// The agent down: STATUS says the plugin is not available, ADD to try again later.
	env.Stop()
	if err := rt.status(); cniCode(err) != types.ErrPluginNotAvailable {
		t.Fatalf("STATUS with the agent down: %v", err)
	}
	late := newSandbox(t, "shop", "late")
	ctxAdd, cancel := context.WithTimeout(ctx, 30*time.Second)
	_, err = rt.cni.AddNetworkList(ctxAdd, rt.list, late.rt)
	cancel()
	if cniCode(err) != types.ErrTryAgainLater {
		t.Fatalf("ADD with the agent down: %v", err)
	}
	// Restarted, it knows the server's attachment and still enforces the policy.
	env.Start()
	if err := rt.status(); err != nil {
		t.Fatalf("STATUS after restart: %v", err)
	}
	if err := rt.check(server); err != nil {
		t.Fatalf("CHECK after restart: %v", err)
	}
	if testenv.Probe(client.netns, to, "tcp", time.Second) {
		t.Fatal("server reachable after restart")
	}

	// GC: a runtime that still has the server only. GC from a runtime whose cache is
	// empty, so that the plugin's GC (not libcni's DEL of cached attachments) removes
	// the others; an endpoint made with `rampart endpoint add` is not the runtime's.
	other := newSandbox(t, "shop", "other")
	rt.add(other)
	env.AddEndpoint("shop", "plain", nil)
	fresh := newRuntime(t, env.Socket())
	ctxGC, cancel := context.WithTimeout(ctx, 30*time.Second)
	err = fresh.cni.GCNetworkList(ctxGC, fresh.list, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: server.id, IfName: "eth0"}}})
	cancel()
	if err != nil {
		t.Fatalf("GC: %v", err)
	}
	if keys := endpointKeys(t, env); !slices.Equal(keys, []string{"shop/plain", "store/server"}) {
		t.Fatalf("agent endpoints after GC %v", keys)
	}
	if _, err := testenv.NetlinkHandle(t, other.netns).LinkByName("eth0"); err == nil {
		t.Fatal("eth0 still in a collected pod's namespace")
	}

	// CHECK notices an attachment changed behind the agent's back: the address taken
	// off the pod's interface.
	h := testenv.NetlinkHandle(t, server.netns)
	l, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	addr := &netlink.Addr{IPNet: &resS.IPs[0].Address}
	if err := h.AddrDel(l, addr); err != nil {
		t.Fatal(err)
	}
	if err := rt.check(server); err == nil || !strings.Contains(err.Error(), "does not have address") {
		t.Fatalf("CHECK without the address: %v", err)
	}
	if err := h.AddrAdd(l, addr); err != nil {
		t.Fatal(err)
	}
	if err := rt.check(server); err != nil {
		t.Fatalf("CHECK with the address back: %v", err)
	}
	if err := rt.del(server); err != nil {
		t.Fatalf("DEL server: %v", err)
	}
	if keys := endpointKeys(t, env); !slices.Equal(keys, []string{"shop/plain"}) {
		t.Fatalf("agent endpoints after the last DEL %v", keys)
	}
}

// addErr runs ADD of sb and returns its error (nil if it succeeded).
func (r *runtime) addErr(sb *sandbox) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := r.cni.AddNetworkList(ctx, r.list, sb.rt)
	return err
}

// linkNames lists the interfaces of the namespace at path.
func linkNames(t *testing.T, path string) []string {
	t.Helper()
	links, err := testenv.NetlinkHandle(t, path).LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, l := range links {
		names = append(names, l.Attrs().Name)
	}
	slices.Sort(names)
	return names
}

// A CNI_NETNS that is not a new pod's namespace is refused, and nothing changes in it:
// the node's namespace, the runtime's own (where the plugin runs), another pod's, and one
// in use the way another node's is (an interface up). A new namespace whose only other
// interface is down (as the kernel's fallback tunnel devices are) is a pod's.
func TestCNIRefusesNamespacesInUse(t *testing.T) {
	testenv.RequireRoot(t)
	env := agenttest.StartAgent(t, agenttest.Options{NoServers: true})
	rt := newRuntime(t, env.Socket())
	nodePath := endpoint.NetnsPath(env.Config.NodeNetns)

	first := newSandbox(t, "shop", "first")
	resFirst := rt.add(first)

	inUse := newSandbox(t, "shop", "in-use")
	h := testenv.NetlinkHandle(t, inUse.netns)
	up := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "fabric0"}, PeerName: "fabric1"}
	if err := h.LinkAdd(up); err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(up); err != nil {
		t.Fatal(err)
	}

	nodeLinks := linkNames(t, nodePath)
	for _, tc := range []struct {
		name, netns, reason string
		code                uint
	}{
		{"the node's namespace", nodePath, "is the node's network namespace", types.ErrInvalidEnvironmentVariables},
		{"the runtime's own namespace", "/proc/self/ns/net", "own network namespace", types.ErrInvalidNetNS},
		{"another pod's namespace", first.netns, "has interface eth0 up already", types.ErrInvalidEnvironmentVariables},
		{"a namespace in use", inUse.netns, "has interface fabric0 up already", types.ErrInvalidEnvironmentVariables},
	} {
		sb := newSandbox(t, "shop", "intruder")
		sb.rt.NetNS = tc.netns
		before := linkNames(t, tc.netns)
		err := rt.addErr(sb)
		if err == nil {
			rt.del(sb)
			t.Fatalf("ADD into %s succeeded", tc.name)
		}
		if cniCode(err) != tc.code || !strings.Contains(err.Error(), tc.reason) {
			t.Errorf("ADD into %s: %v; want code %d saying %q", tc.name, err, tc.code, tc.reason)
		}
		if after := linkNames(t, tc.netns); !slices.Equal(after, before) {
			t.Errorf("ADD into %s changed its interfaces from %v to %v", tc.name, before, after)
		}
	}
	if after := linkNames(t, nodePath); !slices.Equal(after, nodeLinks) {
		t.Errorf("refused ADDs changed the node's interfaces from %v to %v", nodeLinks, after)
	}
	if keys := endpointKeys(t, env); !slices.Equal(keys, []string{"shop/first"}) {
		t.Fatalf("agent endpoints after the refused ADDs %v", keys)
	}
	if err := rt.check(first); err != nil {
		t.Fatalf("CHECK of the first pod after the refused ADDs: %v", err)
	}

	// An interface that is down does not make a namespace in use.
	quiet := newSandbox(t, "shop", "quiet")
	if err := testenv.NetlinkHandle(t, quiet.netns).LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "down0"}, PeerName: "down1"}); err != nil {
		t.Fatal(err)
	}
	if res := rt.add(quiet); podAddr(t, res) == podAddr(t, resFirst) {
		t.Fatalf("second pod got the first pod's address %v", podAddr(t, res))
	}
	if err := rt.del(quiet); err != nil {
		t.Fatal(err)
	}
	if err := rt.del(first); err != nil {
		t.Fatal(err)
	}
}

// A dual-stack node's ADD through libcni: the result has both addresses, each with its
// gateway (the router; the host veth's fe80::1), and a default route of each family,
// which the pod's interface has; CHECK (its prevResult has both) and DEL pass.
func TestCNIDualStack(t *testing.T) {
	testenv.RequireRoot(t)
	env := agenttest.StartAgent(t, agenttest.Options{NoServers: true, PodCIDR6: netip.MustParsePrefix("2001:2::/64")})
	rt := newRuntime(t, env.Socket())
	sb := newSandbox(t, "shop", "web")
	res := rt.add(sb)
	var ips, routes []string
	for _, ipc := range res.IPs {
		if ipc.Interface == nil || res.Interfaces[*ipc.Interface].Sandbox != sb.netns {
			t.Fatalf("result address %v not on the pod's interface", ipc.Address)
		}
		ips = append(ips, ipc.Address.String()+" via "+ipc.Gateway.String())
	}
	for _, r := range res.Routes {
		routes = append(routes, r.Dst.String()+" via "+r.GW.String())
	}
	if want := []string{"198.18.0.2/32 via 198.18.0.1", "2001:2::2/128 via fe80::1"}; !slices.Equal(ips, want) {
		t.Fatalf("result addresses %v, want %v", ips, want)
	}
	if want := []string{"0.0.0.0/0 via 198.18.0.1", "::/0 via fe80::1"}; !slices.Equal(routes, want) {
		t.Fatalf("result routes %v, want %v", routes, want)
	}
	if ep := env.Endpoint("shop/web"); ep.IP != "198.18.0.2" || ep.IP6 != "2001:2::2" {
		t.Fatalf("agent's view: %s %s", ep.IP, ep.IP6)
	}
	h := testenv.NetlinkHandle(t, sb.netns)
	l, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := h.AddrList(l, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, a := range addrs {
		got = append(got, a.IPNet.String())
	}
	slices.Sort(got)
	if want := []string{"2001:2::2/128", "fe80::2/64"}; !slices.Equal(got, want) {
		t.Fatalf("eth0's IPv6 addresses %v, want %v", got, want)
	}

	// IPv6 through the dataplane: the pod reaches the node's IPv6 router address (neighbour
	// discovery for fe80::1 included), until a policy that allows it no egress selects it.
	srv, err := testenv.Serve(endpoint.NetnsPath(env.Config.NodeNetns), []uint16{8080}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	to := netip.MustParseAddrPort("[2001:2::1]:8080")
	if !testenv.Eventually(10*time.Second, func() bool { return testenv.Probe(sb.netns, to, "tcp", 500*time.Millisecond) }) {
		t.Fatalf("the pod does not reach %v over IPv6", to)
	}
	deny := filepath.Join(t.TempDir(), "deny.yaml")
	if err := os.WriteFile(deny, []byte("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: no-egress, namespace: shop}\nspec:\n  podSelector: {}\n  policyTypes: [Egress]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, errs, code := env.CLI("apply", "-f", deny); code != 0 {
		t.Fatalf("apply: %s%s", out, errs)
	}
	if testenv.Probe(sb.netns, to, "tcp", 500*time.Millisecond) {
		t.Errorf("the pod reaches %v over IPv6 with no egress allowed", to)
	}
	if out, _, _ := env.CLI("observe", "--last", "50"); !strings.Contains(out, "-> [2001:2::1]:8080 egress DROPPED") {
		t.Errorf("no IPv6 drop among the flows:\n%s", out)
	}
	if err := rt.check(sb); err != nil {
		t.Fatalf("CHECK: %v", err)
	}
	if err := rt.del(sb); err != nil {
		t.Fatalf("DEL: %v", err)
	}
	if keys := endpointKeys(t, env); len(keys) != 0 {
		t.Fatalf("endpoints after DEL: %v", keys)
	}
}

package containerd

import (
	"context"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

var bins = testenv.Binaries{Packages: []string{"./cmd/rampart-cni"}}

func TestMain(m *testing.M) { bins.Main(m) }

const denyIngressStore = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: deny-ingress, namespace: store}
spec:
  podSelector: {}
  policyTypes: [Ingress]
`

// checkPod checks that a pod sandbox containerd runs is the agent's endpoint named after
// the pod: the attachment is the sandbox's, the address is of the agent's pod range and is
// the one containerd reports, it sits on eth0 in the sandbox's network namespace, and the
// sandbox's process (the pause program) lives in that namespace. It returns the endpoint.
func checkPod(t *testing.T, c *containerd, env *agenttest.Env, p pod) api.Endpoint {
	t.Helper()
	st := c.inspect(p)
	if st.Status.State != "SANDBOX_READY" || st.Status.Metadata.Namespace != p.namespace || st.Status.Metadata.Name != p.name {
		t.Fatalf("pod %s/%s: sandbox %+v", p.namespace, p.name, st.Status)
	}
	ep := env.Endpoint(p.namespace + "/" + p.name)
	if ep.CNI == nil || ep.CNI.ContainerID != p.id || ep.CNI.IfName != "eth0" {
		t.Fatalf("endpoint %s: attachment %+v, want container %s interface eth0", ep.Key(), ep.CNI, p.id)
	}
	addr, err := netip.ParseAddr(ep.IP)
	if err != nil || !env.Config.PodCIDR.Contains(addr) {
		t.Fatalf("endpoint %s: address %q not in the pod range %v", ep.Key(), ep.IP, env.Config.PodCIDR)
	}
	if st.Status.Network.IP != ep.IP {
		t.Fatalf("pod %s/%s: containerd reports address %q, the agent %s", p.namespace, p.name, st.Status.Network.IP, ep.IP)
	}
	h := testenv.NetlinkHandle(t, ep.Netns)
	l, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatalf("eth0 in %s: %v", ep.Netns, err)
	}
	addrs, err := h.AddrList(l, unix.AF_INET)
	if err != nil || len(addrs) != 1 || addrs[0].IP.String() != ep.IP {
		t.Fatalf("eth0 in %s has %v (%v), want %s", ep.Netns, addrs, err, ep.IP)
	}
	// The namespace the agent wired is the one the sandbox's process runs in.
	var want, got unix.Stat_t
	if err := unix.Stat(ep.Netns, &want); err != nil {
		t.Fatal(err)
	}
	if err := unix.Stat("/proc/"+strconv.Itoa(st.Info.Pid)+"/ns/net", &got); err != nil || st.Info.Pid <= 1 {
		t.Fatalf("pod %s/%s: sandbox process %d: %v", p.namespace, p.name, st.Info.Pid, err)
	}
	if want.Dev != got.Dev || want.Ino != got.Ino {
		t.Fatalf("pod %s/%s: sandbox process %d is not in the endpoint's namespace %s", p.namespace, p.name, st.Info.Pid, ep.Netns)
	}
	return ep
}

func endpointKeys(t *testing.T, env *agenttest.Env) []string {
	t.Helper()
	eps, err := env.Client.ListEndpoints(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, e := range eps {
		keys = append(keys, e.Key())
	}
	return keys
}

// serve starts an echo server on TCP 80 in a namespace, stopped when the test ends.
func serve(t *testing.T, netns string) *testenv.Servers {
	t.Helper()
	s, err := testenv.Serve(netns, []uint16{80}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// Pods that containerd's CRI plugin runs (crictl runp, as the kubelet asks it) get their
// network from rampart-cni and the agent: each sandbox is an endpoint named after its pod,
// with an address of the pod range on eth0 in the sandbox's namespace, carrying real
// traffic under the agent's policy. Stopping a pod (CNI DEL) deletes its endpoint; pods
// survive a containerd restart, after which new pods are attached as before, and an
// agent restart.
func TestPodsFromContainerd(t *testing.T) {
	testenv.RequireRoot(t)
	tl := findTools(t)
	env := agenttest.StartAgent(t, agenttest.Options{NoServers: true})
	// containerd 1.6 reads network configuration up to CNI spec 1.0.0.
	conflist := `{
  "cniVersion": "1.0.0",
  "name": "rampart",
  "plugins": [{"type": "rampart-cni", "socket": "` + env.Socket() + `"}]
}`
	c := newContainerd(t, tl, conflist, bins.Dir(t)+"/rampart-cni")
	c.importImage()
	ctx := context.Background()

	server := c.runPod("store", "server")
	client := c.runPod("shop", "client")
	epS := checkPod(t, c, env, server)
	epC := checkPod(t, c, env, client)
	if keys := endpointKeys(t, env); !slices.Equal(keys, []string{"shop/client", "store/server"}) {
		t.Fatalf("agent endpoints %v", keys)
	}

	// Real traffic: from the node and from the other pod to a server in the sandbox's
	// namespace; then a policy denying the server's ingress drops the pod's.
	srv := serve(t, epS.Netns)
	to := netip.AddrPortFrom(netip.MustParseAddr(epS.IP), 80)
	node := "/run/netns/" + env.Config.NodeNetns
	if !testenv.Probe(node, to, "tcp", 5*time.Second) {
		t.Fatal("the node cannot reach the server pod")
	}
	if !testenv.Probe(epC.Netns, to, "tcp", 5*time.Second) {
		t.Fatal("the client pod cannot reach the server pod without policy")
	}
	if _, err := env.Client.Apply(ctx, api.ApplyRequest{Documents: []api.Document{{Source: "deny.yaml", Data: denyIngressStore}}}); err != nil {
		t.Fatal(err)
	}
	if testenv.Probe(epC.Netns, to, "tcp", 2*time.Second) {
		t.Fatal("the client pod reaches the server pod after the deny policy")
	}

	// Stopping the pod tears its network down (CNI DEL): the endpoint goes. Removing it
	// removes the namespace containerd made.
	srv.Close()
	c.crictl("stopp", server.id)
	if keys := endpointKeys(t, env); !slices.Equal(keys, []string{"shop/client"}) {
		t.Fatalf("agent endpoints after stopp %v", keys)
	}
	c.crictl("rmp", server.id)
	if ids := c.podIDs(); !slices.Equal(ids, []string{client.id}) {
		t.Fatalf("pods after rmp %v, want %s", ids, client.id)
	}
	if _, err := os.Stat(epS.Netns); !os.IsNotExist(err) {
		t.Fatalf("server's namespace %s after rmp: %v", epS.Netns, err)
	}

	// containerd restarted: the running pod keeps its endpoint and its traffic, and a new
	// pod is attached as before.
	c.stop()
	c.start()
	if st := c.inspect(client); st.Status.State != "SANDBOX_READY" {
		t.Fatalf("client pod after the restart: %s", st.Status.State)
	}
	checkPod(t, c, env, client)
	second := c.runPod("shop", "second")
	ep2 := checkPod(t, c, env, second)
	if ep2.IP == epC.IP {
		t.Fatalf("second pod has the client's address %s", ep2.IP)
	}
	serve(t, epC.Netns)
	toC := netip.AddrPortFrom(netip.MustParseAddr(epC.IP), 80)
	if !testenv.Probe(ep2.Netns, toC, "tcp", 5*time.Second) {
		t.Fatal("the second pod cannot reach the client pod")
	}

	// The agent restarted under running pods: it still has their endpoints, the pods
	// still talk, and containerd's DELs below reach it.
	env.Restart()
	checkPod(t, c, env, client)
	checkPod(t, c, env, second)
	if !testenv.Probe(ep2.Netns, toC, "tcp", 5*time.Second) {
		t.Fatal("the second pod cannot reach the client pod after the agent's restart")
	}

	// Every pod stopped and removed: the agent has no endpoint left.
	for _, p := range []pod{client, second} {
		c.crictl("stopp", p.id)
		c.crictl("rmp", p.id)
	}
	if keys := endpointKeys(t, env); len(keys) != 0 {
		t.Fatalf("agent endpoints after every pod is removed %v", keys)
	}
	if ids := c.podIDs(); len(ids) != 0 {
		t.Fatalf("pods left %v", ids)
	}
}

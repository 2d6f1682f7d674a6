package realcluster

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/clustertest"
	"github.com/rampartnet/rampart/internal/testenv/nodetest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	clustertest.Bins.Remove()
	os.Exit(code)
}

// workloads: a server Deployment (agnhost netexec) and two client Deployments, each with
// one replica per node (spread by hostname, placed by kube-scheduler), and a policy
// admitting the server's port only from the "client" pods.
const workloads = `apiVersion: apps/v1
kind: Deployment
metadata: {name: %[1]s, namespace: %[2]s}
spec:
  replicas: 2
  selector: {matchLabels: {app: %[1]s}}
  template:
    metadata: {labels: {app: %[1]s}}
    spec:
      topologySpreadConstraints:
      - {maxSkew: 1, topologyKey: kubernetes.io/hostname, whenUnsatisfiable: DoNotSchedule, labelSelector: {matchLabels: {app: %[1]s}}}
      terminationGracePeriodSeconds: 1
      containers:
      - name: agnhost
        image: %[3]s
        args: [%[4]s]
`

const allowClients = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: web-from-client, namespace: %s}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {app: client}}}]
    ports: [{protocol: TCP, port: 8080}]
`

// Two real nodes: they register Ready with the kubelet's and containerd's versions and
// their InternalIP; ordinary Deployments (agnhost, no nodeName) are placed on both by
// kube-scheduler; kubectl exec and logs work through the kubelets; a NetworkPolicy is
// enforced by Rampart between pods on different nodes (one pair allowed, one denied, both
// connected before the policy); deleting the namespace completes (kube-controller-manager's
// namespace controller, the kubelets killing the pods). The agents run with
// --host-firewall: host policy locking the nodes down cuts neither the API server
// connections nor the pods' traffic (hostLockedDown).
func TestRealNodes(t *testing.T) {
	c := nodetest.Start(t, nodetest.Options{Nodes: 2, AgentFlags: []string{"--host-firewall"}})
	t.Logf("cluster start time: %v", c.Started.Round(time.Millisecond))
	ctx := context.Background()

	for _, n := range c.Nodes {
		node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		info := node.Status.NodeInfo
		if info.KubeletVersion != "v1.37.2" || info.ContainerRuntimeVersion != "containerd://2.4.2" {
			t.Errorf("node %s: kubelet %q, runtime %q; want v1.37.2, containerd://2.4.2", n.Name, info.KubeletVersion, info.ContainerRuntimeVersion)
		}
		if ip := internalIP(node); ip != n.Address.String() {
			t.Errorf("node %s: InternalIP %q, want %s", n.Name, ip, n.Address)
		}
	}

	ns := "real-" + testenv.Suffix(6)
	c.MustKubectl("create", "namespace", ns)
	pods := deployWebClientOther(t, c, ns) // app -> node -> pod

	out := c.MustKubectl("-n", ns, "logs", pods["web"]["node-1"].Name)
	if !strings.Contains(out, "Started HTTP server on port 8080") {
		t.Errorf("kubectl logs of a web pod: %q, want netexec's start line", out)
	}

	checkServices(t, c, ns, pods)

	enforcedAcrossNodes(t, c, ns, pods)

	hostLockedDown(t, c, ns, pods["client"]["node-1"].Name, pods["other"]["node-1"].Name, pods["web"]["node-2"].Status.PodIP+":8080")

	t.Logf("resident memory with 6 pods:\n%s", c.RSSReport())

	began := time.Now()
	if out, err := c.Kubectl("delete", "namespace", ns, "--timeout=3m"); err != nil {
		t.Fatalf("kubectl delete namespace %s: %v\n%s", ns, err, out)
	}
	if _, err := c.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{}); err == nil {
		t.Fatalf("namespace %s still exists after kubectl delete returned", ns)
	}
	t.Logf("namespace deleted in %v", time.Since(began).Round(time.Millisecond))
}

// enforcedAcrossNodes checks, between node-1's client and other pods and node-2's web
// pod, that both connect before any policy, and that under allowClients (applied here)
// the client still connects while the other is dropped (agnhost's TIMEOUT: not refused or
// failed otherwise).
func enforcedAcrossNodes(t *testing.T, c *nodetest.Cluster, ns string, pods map[string]map[string]corev1.Pod) {
	t.Helper()
	web := pods["web"]["node-2"].Status.PodIP + ":8080"
	client, other := pods["client"]["node-1"].Name, pods["other"]["node-1"].Name
	for _, from := range []string{client, other} {
		if !eventuallyConnects(c, ns, from, web, true) {
			t.Fatalf("%s cannot reach %s before any policy", from, web)
		}
	}
	c.KubectlApply(fmt.Sprintf(allowClients, ns))
	if !eventuallyConnects(c, ns, other, web, false) {
		t.Fatalf("%s still reaches %s under a policy admitting only app=client", other, web)
	}
	if out, err := c.Kubectl("-n", ns, "exec", other, "--", "/agnhost", "connect", web, "--timeout=1s"); err == nil || !strings.Contains(out, "TIMEOUT") {
		t.Errorf("%s to %s under the policy: %v, %q; want a TIMEOUT", other, web, err, out)
	}
	if !connects(c, ns, client, web) {
		t.Errorf("%s cannot reach %s, which the policy admits", client, web)
	}
}

func internalIP(n *corev1.Node) string {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			return a.Address
		}
	}
	return ""
}

// runningOnEveryNode waits until app's pods run, one on each node, and returns them by
// node name.
func runningOnEveryNode(t *testing.T, c *nodetest.Cluster, ns, app string) map[string]corev1.Pod {
	t.Helper()
	var byNode map[string]corev1.Pod
	var last []corev1.Pod
	if !testenv.Eventually(3*time.Minute, func() bool {
		list, err := c.Client.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{
			LabelSelector: labels.SelectorFromSet(labels.Set{"app": app}).String()})
		if err != nil {
			return false
		}
		last = list.Items
		byNode = map[string]corev1.Pod{}
		for _, p := range list.Items {
			if p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" && p.DeletionTimestamp == nil {
				byNode[p.Spec.NodeName] = p
			}
		}
		return len(byNode) == len(c.Nodes)
	}) {
		var s []string
		for _, p := range last {
			s = append(s, fmt.Sprintf("%s on %q: %s %v", p.Name, p.Spec.NodeName, p.Status.Phase, p.Status.Conditions))
		}
		t.Fatalf("%s's pods not running on every node after 3 minutes:\n%s\n%s", app, strings.Join(s, "\n"),
			c.MustKubectl("-n", ns, "get", "events"))
	}
	return byNode
}

// webServices are a ClusterIP and a NodePort Service in front of the web pods.
const webServices = `apiVersion: v1
kind: Service
metadata: {name: web, namespace: %[1]s}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
---
apiVersion: v1
kind: Service
metadata: {name: web-np, namespace: %[1]s}
spec:
  type: NodePort
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
`

// egressTo admits app's egress to the given /32s only (TCP 8080).
const egressTo = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: %[2]s-egress, namespace: %[1]s}
spec:
  podSelector: {matchLabels: {app: %[2]s}}
  policyTypes: [Egress]
  egress:
  - to: [%[3]s]
`

// checkServices checks Services on the real nodes: the ClusterIP Service answers pods on
// every node (Rampart's socket-level translation, attached to the node's cgroupRoot), the
// NodePort Service answers at every node's address from the host (kube-proxy's nftables:
// the host's sockets are not the pods'), and egress policy is judged on the backend after
// translation, as upstream's e2e assumes: a pod admitted only to the backends' /32s
// reaches the Service, and a pod admitted only to the Service's own cluster IP does not.
// The policies are removed again before it returns.
func checkServices(t *testing.T, c *nodetest.Cluster, ns string, pods map[string]map[string]corev1.Pod) {
	t.Helper()
	ctx := context.Background()
	began := time.Now()
	defer func() { t.Logf("Services checked in %v", time.Since(began).Round(time.Millisecond)) }()
	c.KubectlApply(fmt.Sprintf(webServices, ns))
	svc, err := c.Client.CoreV1().Services(ns).Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	clusterIP := svc.Spec.ClusterIP + ":80"
	for _, node := range c.Nodes {
		from := pods["client"][node.Name].Name
		if !eventuallyConnects(c, ns, from, clusterIP, true) {
			t.Fatalf("%s on %s cannot reach the ClusterIP Service %s", from, node.Name, clusterIP)
		}
	}

	np, err := c.Client.CoreV1().Services(ns).Get(ctx, "web-np", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	webPods := map[string]bool{}
	for _, p := range pods["web"] {
		webPods[p.Name] = true
	}
	for _, node := range c.Nodes {
		url := fmt.Sprintf("http://%s:%d/hostname", node.Address, np.Spec.Ports[0].NodePort)
		var got string
		if !testenv.Eventually(30*time.Second, func() bool {
			got = httpGet(url)
			return webPods[got]
		}) {
			t.Fatalf("NodePort %s from the host answered %q; want a web pod's name", url, got)
		}
	}

	var backends []string
	for _, p := range pods["web"] {
		backends = append(backends, fmt.Sprintf("{ipBlock: {cidr: %s/32}}", p.Status.PodIP))
	}
	allowed := fmt.Sprintf(egressTo, ns, "client", strings.Join(backends, ", "))
	denied := fmt.Sprintf(egressTo, ns, "other", fmt.Sprintf("{ipBlock: {cidr: %s/32}}", svc.Spec.ClusterIP))
	c.KubectlApply(allowed)
	c.KubectlApply(denied)
	for _, node := range c.Nodes {
		other := pods["other"][node.Name].Name
		if !eventuallyConnects(c, ns, other, clusterIP, false) {
			t.Errorf("%s on %s reaches the Service %s with egress admitted to its cluster IP only", other, node.Name, clusterIP)
		}
		// Twice: each connection may be sent to either backend.
		for range 2 {
			if client := pods["client"][node.Name].Name; !connects(c, ns, client, clusterIP) {
				t.Errorf("%s on %s cannot reach the Service %s with egress admitted to its backends' /32s", client, node.Name, clusterIP)
			}
		}
	}
	c.KubectlDelete(allowed)
	c.KubectlDelete(denied)
}

// httpGet returns the body of a GET of url (1 s timeout), or "" on any error.
func httpGet(url string) string {
	client := http.Client{Timeout: time.Second}
	resp, err := client.Get(url)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// connects runs agnhost connect in pod from (kubectl exec, through its node's kubelet).
func connects(c *nodetest.Cluster, ns, from, to string) bool {
	_, err := c.Kubectl("-n", ns, "exec", from, "--", "/agnhost", "connect", to, "--timeout=1s")
	return err == nil
}

// eventuallyConnects polls connects until it says want (30 s at most).
func eventuallyConnects(c *nodetest.Cluster, ns, from, to string, want bool) bool {
	return testenv.Eventually(30*time.Second, func() bool { return connects(c, ns, from, to) == want })
}

// deployWebClientOther runs, on every node of c, a web pod (agnhost netexec on 8080), a
// client pod and an other pod (both agnhost pause), labelled app=web, app=client and
// app=other, and returns them by app and node once running.
func deployWebClientOther(t *testing.T, c *nodetest.Cluster, ns string) map[string]map[string]corev1.Pod {
	t.Helper()
	for _, d := range []struct{ name, args string }{
		{"web", `netexec, "--http-port=8080"`},
		{"client", "pause"},
		{"other", "pause"},
	} {
		c.KubectlApply(fmt.Sprintf(workloads, d.name, ns, c.Bins.AgnhostImage, d.args))
	}
	pods := map[string]map[string]corev1.Pod{}
	for _, app := range []string{"web", "client", "other"} {
		pods[app] = runningOnEveryNode(t, c, ns, app)
	}
	return pods
}

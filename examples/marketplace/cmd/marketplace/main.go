package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/rampartnet/rampart/examples/marketplace"
	"github.com/rampartnet/rampart/internal/api"
)

const usage = `usage:
  marketplace pods -kubeconfig FILE -image AGNHOST
      print the marketplace's pods (one per organisation and node, agnhost netexec on
      8080/TCP) as a manifest for kubectl apply
  marketplace check -kubeconfig FILE -expected FILE -scenario NAME [-timeout 30s]
      probe every ordered pod pair (kubectl exec SOURCE -- /agnhost connect) until the
      matrix is the expected one twice in a row or the timeout passes; print it; exit 1 if
      it is not the expected one
  marketplace explain -kubeconfig FILE -expected FILE -scenario NAME
      rampart policy trace, in the Rampart agent pod of both nodes, of a cross-node pair
      the scenario denies, and the destination's recent flows`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "the cluster's kubeconfig (scripts/cluster.sh start prints its path)")
	kubectl := fs.String("kubectl", "kubectl", "the kubectl binary")
	image := fs.String("image", "", "pods: the agnhost image the pods run")
	expected := fs.String("expected", "", "check, explain: the table of allowed pairs (expected.txt)")
	scenario := fs.String("scenario", "", "check, explain: the scenario's name in the table")
	timeout := fs.Duration("timeout", 30*time.Second, "check: how long the matrix may take to become the expected one")
	fs.Parse(os.Args[2:])
	if *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "marketplace: -kubeconfig is required")
		os.Exit(2)
	}
	c, err := connect(*kubeconfig, *kubectl)
	if err != nil {
		fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout+2*time.Minute)
	defer cancel()
	switch os.Args[1] {
	case "pods":
		if *image == "" {
			fail(fmt.Errorf("-image is required"))
		}
		m, err := podsManifest(ctx, c, *image)
		if err != nil {
			fail(err)
		}
		fmt.Print(m)
		return
	case "check", "explain":
	default:
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	table, err := marketplace.ReadExpected(*expected)
	if err != nil {
		fail(err)
	}
	allowed, ok := table[*scenario]
	if !ok {
		fail(fmt.Errorf("scenario %q is not in %s", *scenario, *expected))
	}
	pods, err := findPods(ctx, c)
	if err != nil {
		fail(err)
	}
	if os.Args[1] == "explain" {
		if err := explain(c, pods, allowed); err != nil {
			fail(err)
		}
		return
	}
	if !check(c, pods, allowed, *timeout) {
		os.Exit(1)
	}
}

// cluster is how the driver reaches the cluster: the API for pods and nodes, kubectl for
// what a user runs in pods.
type cluster struct {
	kubeconfig, kubectl string
	client              *kubernetes.Clientset
}

func connect(kubeconfig, kubectl string) (*cluster, error) {
	rc, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	rc.Timeout = 10 * time.Second
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	return &cluster{kubeconfig: kubeconfig, kubectl: kubectl, client: cs}, nil
}

// command is kubectl with the cluster's kubeconfig, bounded by timeout.
func (c *cluster) command(timeout time.Duration, args ...string) (*exec.Cmd, context.CancelFunc) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	return exec.CommandContext(ctx, c.kubectl, append([]string{"--kubeconfig", c.kubeconfig}, args...)...), cancel
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "marketplace:", err)
	os.Exit(1)
}

// orgs are the organisations: namespace org-<x>, pod label id.pod: Organization<X>.
var orgs = marketplace.Orgs

func podName(org, node string) string {
	return org + "-" + strings.TrimPrefix(node, "node-")
}

// podsManifest is one pod of each organisation on each node, running agnhost netexec
// (an HTTP server) on 8080/TCP, Ready once the port answers.
func podsManifest(ctx context.Context, c *cluster, image string) (string, error) {
	nodes, err := c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return "", fmt.Errorf("listing nodes: %w", err)
	}
	var b strings.Builder
	for _, o := range orgs {
		for _, n := range nodes.Items {
			fmt.Fprintf(&b, `---
apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
  labels: {%s}
spec:
  nodeName: %s
  terminationGracePeriodSeconds: 1
  containers:
  - name: server
    image: %s
    imagePullPolicy: Never
    args: [netexec, --http-port=8080, --udp-port=-1]
    readinessProbe:
      tcpSocket: {port: 8080}
      periodSeconds: 1
`, podName(o, n.Name), marketplace.Namespace(o), podLabels(o), n.Name, image)
		}
	}
	return b.String(), nil
}

// podLabels renders an organisation's pod labels as a YAML flow mapping's content.
func podLabels(org string) string {
	l := marketplace.PodLabels(org)
	var kv []string
	for _, k := range slices.Sorted(maps.Keys(l)) {
		kv = append(kv, k+": "+l[k])
	}
	return strings.Join(kv, ", ")
}

// pod is one marketplace pod as the probes need it.
type pod struct {
	Org  string // a, b, c
	Name string // pod name
	Node string
	IP   string
}

func (p pod) Key() string   { return marketplace.Namespace(p.Org) + "/" + p.Name }
func (p pod) Label() string { return strings.ToUpper(p.Org) + "@" + p.Node }

// findPods lists the pods of the three namespaces from the API (node, podIP): one of each
// organisation on each node, all Ready.
func findPods(ctx context.Context, c *cluster) ([]pod, error) {
	nodes, err := c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing nodes: %w", err)
	}
	var pods []pod
	for _, o := range orgs {
		list, err := c.client.CoreV1().Pods(marketplace.Namespace(o)).List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, fmt.Errorf("listing pods of org-%s: %w", o, err)
		}
		for _, p := range list.Items {
			if p.Status.PodIP == "" || !ready(&p) {
				return nil, fmt.Errorf("pod %s/%s is not ready", p.Namespace, p.Name)
			}
			pods = append(pods, pod{Org: o, Name: p.Name, Node: p.Spec.NodeName, IP: p.Status.PodIP})
		}
	}
	if len(pods) != len(orgs)*len(nodes.Items) {
		return nil, fmt.Errorf("%d pods in org-a, org-b, org-c; want %d (one of each organisation per node)", len(pods), len(orgs)*len(nodes.Items))
	}
	return pods, nil
}

func ready(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// explain runs rampart policy trace for a cross-node pair the scenario denies, on the
// source's node and on the destination's: a pod on the other node is known to an agent by
// its address, and each node's trace answers for the sides of the connection that node
// judges (the source's node its egress, the destination's node its ingress). The traces of
// the nodes that deny come first, each said with the sides it judged, so that what the
// demo announces is what the evidence under it shows; then the destination's recent flows,
// which name the pods of the other node with their node. It prefers a pair whose source
// may reach some pod and whose destination may be reached by some: a denial that depends
// on who the peer is, not a pod that accepts or sends nothing.
func explain(c *cluster, pods []pod, allowed map[[2]string]bool) error {
	sends, receives := map[string]bool{}, map[string]bool{}
	for k, v := range allowed {
		if v {
			sends[k[0]], receives[k[1]] = true, true
		}
	}
	var pick *[2]pod
	for _, from := range pods {
		for _, to := range pods {
			if from.Node == to.Node || allowed[[2]string{from.Org, to.Org}] {
				continue
			}
			if pick == nil || sends[from.Org] && receives[to.Org] && !(sends[pick[0].Org] && receives[pick[1].Org]) {
				pick = &[2]pod{from, to}
			}
		}
	}
	if pick == nil {
		return fmt.Errorf("the scenario denies no cross-node pair")
	}
	from, to := pick[0], pick[1]
	fmt.Printf("%s (%s) -> %s (%s), 8080/TCP: denied\n", from.Key(), from.Label(), to.Key(), to.Label())
	fmt.Println("A connection between nodes passes only if both allow it: the source's node judges its egress,")
	fmt.Println("the destination's node its ingress. Each node's policy trace answers for the sides it judges.")
	var traces []nodeTrace
	for _, side := range []struct{ node, from, to string }{
		{from.Node, from.Key(), to.IP},
		{to.Node, from.IP, to.Key()},
	} {
		tr := nodeTrace{Node: side.node, Args: []string{"policy", "trace", "--from", side.from, "--to", side.to, "--port", "8080/TCP"}}
		out, err := rampartOutput(c, side.node, append(tr.Args, "-o", "json")...)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(out, &tr.Result); err != nil {
			return fmt.Errorf("rampart policy trace -o json on %s: %w", side.node, err)
		}
		traces = append(traces, tr)
	}
	ordered, err := denyingFirst(traces)
	if err != nil {
		return err
	}
	for _, tr := range ordered {
		if err := rampart(c, tr.Node, "which judges "+judged(tr.Result), tr.Args...); err != nil {
			return err
		}
		fmt.Println(conclusion(tr, ordered))
	}
	// The drops only: the kubelet's readiness probes from the node are flows to the pod
	// every second, and would push the denied pair's out of the last few.
	return rampart(c, to.Node, "the destination's node", "observe", "--endpoint", to.Key(), "--verdict", "dropped", "--last", "6")
}

// nodeTrace is one node's policy trace of a pair.
type nodeTrace struct {
	Node   string
	Args   []string // the CLI's arguments
	Result api.TraceResult
}

// denyingFirst orders the traces of a pair that is denied: the traces that deny it first.
// A pair that no node's trace denies has no explanation to show: that is an error, not
// an ALLOWED under a "denied".
func denyingFirst(ts []nodeTrace) ([]nodeTrace, error) {
	var deny, allow []nodeTrace
	for _, t := range ts {
		if t.Result.Allowed {
			allow = append(allow, t)
		} else {
			deny = append(deny, t)
		}
	}
	if len(deny) == 0 {
		var nodes []string
		for _, t := range ts {
			nodes = append(nodes, t.Node)
		}
		return nil, fmt.Errorf("the pair is denied, but no node's policy trace denies it (traced on %s)", strings.Join(nodes, ", "))
	}
	return append(deny, allow...), nil
}

// judged names the sides a trace judged: "the egress at org-c/c-1".
func judged(r api.TraceResult) string {
	if len(r.Sides) == 0 {
		return "no side of the pair"
	}
	var sides []string
	for _, s := range r.Sides {
		sides = append(sides, "the "+s.Direction+" at "+s.Endpoint)
	}
	return strings.Join(sides, " and ")
}

// conclusion says what a trace shows about the pair: the sides it denies and why, or,
// for a trace that allows, that its sides allow and which node denies instead.
func conclusion(t nodeTrace, all []nodeTrace) string {
	if !t.Result.Allowed {
		var denied []string
		for _, s := range t.Result.Sides {
			if !s.Allowed {
				denied = append(denied, fmt.Sprintf("the %s at %s (%s)", s.Direction, s.Endpoint, s.Reason))
			}
		}
		if len(denied) == 0 {
			return fmt.Sprintf("=> %s denies the pair", t.Node)
		}
		return fmt.Sprintf("=> %s denies the pair: %s", t.Node, strings.Join(denied, " and "))
	}
	var others []string
	for _, o := range all {
		if !o.Result.Allowed {
			others = append(others, o.Node)
		}
	}
	return fmt.Sprintf("=> %s allows the sides it judges (%s); the pair is denied on %s", t.Node, judged(t.Result), strings.Join(others, " and "))
}

// rampart runs the CLI in node's agent pod, showing the command and what it answers for.
func rampart(c *cluster, node, note string, args ...string) error {
	fmt.Printf("\n$ rampart %s   # on %s, %s\n", strings.Join(args, " "), node, note)
	out, err := rampartOutput(c, node, args...)
	os.Stdout.Write(out)
	return err
}

// rampartOutput runs the CLI in node's agent pod (kubectl exec, as a user asks an agent)
// and returns what it prints.
func rampartOutput(c *cluster, node string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	agents, err := c.client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{
		LabelSelector: "app.kubernetes.io/name=rampart", FieldSelector: "spec.nodeName=" + node})
	if err != nil || len(agents.Items) != 1 {
		return nil, fmt.Errorf("the Rampart agent pod of %s: %d pods, %v", node, len(agents.Items), err)
	}
	cmd, cancel := c.command(30*time.Second, append([]string{"-n", "kube-system", "exec", agents.Items[0].Name, "-c", "rampartd", "--",
		"/usr/local/bin/rampart"}, args...)...)
	defer cancel()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("rampart %s on %s: %w: %s", strings.Join(args, " "), node, err, stderr.String())
	}
	return out, nil
}

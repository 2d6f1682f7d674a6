package realcluster

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/cli"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/browser"
	"github.com/rampartnet/rampart/internal/testenv/k8stest"
	"github.com/rampartnet/rampart/internal/testenv/nodetest"
)

// observedOnTheCluster checks what an operator sees of a running cluster whose agents
// deploy/ installed, under allowClients: node-1's client (admitted) and other (denied)
// connect to node-2's web pod, and
//   - `rampart observe --cluster` shows both nodes' flows in one time order, each naming
//     its node: the client's connection leaving node-1 and entering node-2, and the other
//     pod's dropped at node-2 by the default deny the policy makes; -o jsonpb names the
//     node as Hubble does;
//   - each agent's Prometheus metrics, on its node's address as the DaemonSet serves them,
//     count the drop on node-2;
//   - `rampart ui --cluster`, loaded in headless Chromium, draws the pods of both nodes,
//     the admitted edge and the denied one marked with its reason and policy;
//   - the real hubble CLI on node-2's Hubble socket shows the drop;
//   - `rampart policy suggest --cluster` turns those flows into policy that admits the
//     client and not the other pod (whose connection left node-1 but was dropped at
//     node-2), and, applied in audit mode in place of allowClients, it lets the client
//     through as FORWARDED and the other pod through as AUDIT naming the suggested
//     policy.
func observedOnTheCluster(t *testing.T, c *nodetest.Cluster, ns string, pods map[string]map[string]corev1.Pod) {
	t.Helper()
	client, other, web := pods["client"]["node-1"], pods["other"]["node-1"], pods["web"]["node-2"]
	webAddr := web.Status.PodIP + ":8080"
	since := time.Now().Add(-time.Second).UTC().Format(time.RFC3339Nano)
	traffic := func() {
		if !connects(c, ns, client.Name, webAddr) {
			t.Errorf("%s cannot reach %s, which the policy admits", client.Name, webAddr)
		}
		if connects(c, ns, other.Name, webAddr) {
			t.Errorf("%s reaches %s, which the policy denies", other.Name, webAddr)
		}
	}
	traffic()

	observe := func(args ...string) (string, string, int) {
		var out, errOut bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		code := cli.Run(ctx, append([]string{"observe", "--cluster", "--kubeconfig", c.Kubeconfig, "--namespace", ns, "--since", since}, args...),
			cli.IO{In: strings.NewReader(""), Out: &out, Err: &errOut})
		return out.String(), errOut.String(), code
	}
	wantPolicy := "NetworkPolicy/" + ns + "/web-from-client"
	var (
		flows          []api.Flow
		stdout, stderr string
		code           int
	)
	seen := func() (leftNode1, enteredNode2, droppedNode2 bool) {
		for _, f := range flows {
			switch {
			case f.Node == "node-1" && f.Source.Name == client.Name && f.Dest.IP == web.Status.PodIP && f.Verdict == "FORWARDED" && f.Direction == "egress":
				leftNode1 = true
			case f.Node == "node-2" && f.Source.IP == client.Status.PodIP && f.Dest.Name == web.Name && f.Verdict == "FORWARDED" && f.Direction == "ingress":
				enteredNode2 = true
			case f.Node == "node-2" && f.Source.IP == other.Status.PodIP && f.Dest.Name == web.Name && f.Verdict == "DROPPED" && slices.Contains(f.DefaultDenyBy, wantPolicy):
				droppedNode2 = true
			}
		}
		return
	}
	// The agents read their flow events asynchronously: poll, with traffic again now and
	// then in case a round fell between reads.
	rounds := 0
	if !testenv.Eventually(time.Minute, func() bool {
		if rounds++; rounds%5 == 0 {
			traffic()
		}
		stdout, stderr, code = observe("-o", "json")
		flows = flows[:0]
		sc := bufio.NewScanner(strings.NewReader(stdout))
		for sc.Scan() {
			var f api.Flow
			if err := json.Unmarshal(sc.Bytes(), &f); err != nil {
				t.Fatalf("observe --cluster -o json: %v in %q", err, sc.Text())
			}
			flows = append(flows, f)
		}
		a, b, d := seen()
		return code == 0 && a && b && d
	}) {
		a, b, d := seen()
		t.Fatalf("observe --cluster (exit %d): left node-1 %v, entered node-2 %v, dropped at node-2 by %s %v; stderr %q; flows:\n%s", code, a, b, wantPolicy, d, stderr, stdout)
	}
	perNode := map[string]int{}
	for _, f := range flows {
		perNode[f.Node]++
	}
	t.Logf("observe --cluster: flows by node %v, %d rounds", perNode, rounds)
	if stderr != "" {
		t.Errorf("observe --cluster reported nodes missing from the view: %s", stderr)
	}
	if !slices.IsSortedFunc(flows, func(a, b api.Flow) int { return a.Time.Compare(b.Time) }) {
		t.Errorf("observe --cluster flows not in time order:\n%s", stdout)
	}

	// Hubble's JSON, one node's drops.
	stdout, stderr, code = observe("--verdict", "dropped", "--from-pod", ns+"/"+other.Name, "-o", "jsonpb")
	if code != 0 || !hubbleDrop(stdout, other.Name, "node-2") {
		t.Errorf("observe --cluster --verdict dropped -o jsonpb (exit %d, stderr %q): no drop from %s at node-2 as Hubble writes it in\n%s", code, stderr, other.Name, stdout)
	}

	// Metrics on node-2's address, where the DaemonSet serves them.
	n2 := c.Nodes[1]
	url := "http://" + n2.Address.String() + ":9962/metrics"
	var drops float64
	if !testenv.Eventually(30*time.Second, func() bool {
		drops = 0
		for _, line := range strings.Split(httpGet(url), "\n") {
			if strings.HasPrefix(line, "rampart_flows_total{") && strings.Contains(line, `verdict="DROPPED"`) && strings.Contains(line, `direction="ingress"`) {
				v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
				if err == nil {
					drops += v
				}
			}
		}
		return drops > 0
	}) {
		t.Errorf("%s: no rampart_flows_total of ingress drops on node-2", url)
	}
	t.Logf("node-2's metrics: %v ingress drops", drops)

	t.Run("ui", func(t *testing.T) { serviceMapOfTheCluster(t, c, ns, client.Name, other.Name, web.Name, wantPolicy) })

	t.Run("hubble", func(t *testing.T) {
		vers := k8stest.Versions(t, filepath.Join(testenv.ModuleRoot(t), "tools", "hubble", "versions.env"))
		hubble := filepath.Join(k8stest.Cache(), "hubble-"+vers["HUBBLE_VERSION"], "hubble")
		if _, err := os.Stat(hubble); err != nil {
			testenv.SkipOrFail(t, "hubble CLI missing (build with scripts/build-hubble.sh): %v", err)
		}
		// A short path to the socket in node-2's /run/rampart: a socket's path must fit in
		// 108 bytes and the node's directory is deep.
		link := filepath.Join(os.TempDir(), "rp-hub-"+testenv.Suffix(6))
		if err := os.Symlink(filepath.Join(n2.Dir, "run", "rampart"), link); err != nil {
			t.Fatal(err)
		}
		defer os.Remove(link)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, hubble, "observe", "--server", "unix://"+link+"/hubble.sock",
			"--since", since, "--verdict", "DROPPED", "--from-pod", ns+"/"+other.Name, "-o", "json").CombinedOutput()
		if err != nil || !hubbleDrop(string(out), other.Name, "node-2") {
			t.Errorf("hubble observe on node-2's socket: %v\n%s", err, out)
		}
	})

	t.Run("suggest and audit", func(t *testing.T) { suggestedThenAudited(t, c, ns, pods, since, observe) })
}

// hubbleDrop says whether lines, GetFlowsResponses in Hubble's JSON, hold a drop from pod
// seen on node.
func hubbleDrop(lines, pod, node string) bool {
	for _, line := range strings.Split(strings.TrimSpace(lines), "\n") {
		var resp struct {
			NodeName string `json:"node_name"`
			Flow     struct {
				NodeName string `json:"node_name"`
				Verdict  string
				Source   struct {
					PodName string `json:"pod_name"`
				}
			}
		}
		if json.Unmarshal([]byte(line), &resp) == nil && resp.NodeName == node && resp.Flow.NodeName == node &&
			resp.Flow.Verdict == "DROPPED" && resp.Flow.Source.PodName == pod {
			return true
		}
	}
	return false
}

// serviceMapOfTheCluster serves `rampart ui --cluster` and loads it in headless Chromium.
func serviceMapOfTheCluster(t *testing.T, c *nodetest.Cluster, ns, client, other, web, policy string) {
	br := browser.New(t)
	ctx, cancel := context.WithCancel(context.Background())
	var out, errOut testenv.SyncBuffer
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, []string{"ui", "--cluster", "--kubeconfig", c.Kubeconfig, "--address", "127.0.0.1:0"},
			cli.IO{In: strings.NewReader(""), Out: &out, Err: &errOut})
	}()
	defer func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("rampart ui --cluster exited %d: %s", code, errOut.String())
		}
	}()
	var url string
	if !testenv.Eventually(20*time.Second, func() bool {
		_, after, ok := strings.Cut(out.String(), "serving the service map on ")
		url = strings.TrimSpace(after)
		return ok && strings.HasSuffix(url, "/")
	}) {
		t.Fatalf("rampart ui --cluster does not say where it serves: %q %q", out.String(), errOut.String())
	}
	client, other, web = ns+"/"+client, ns+"/"+other, ns+"/"+web
	var dom string
	var problems []string
	if !testenv.Eventually(60*time.Second, func() bool {
		dom = br.Run("--dump-dom", url)
		problems = nil
		for _, n := range []string{client, other, web} {
			if browser.Element(dom, "g", "data-node", n, "data-kind", "endpoint") == nil {
				problems = append(problems, "no endpoint "+n)
			}
		}
		if e := browser.Element(dom, "g", "data-edge", client+"->"+web); e == nil || e["data-verdict"] != "FORWARDED" {
			problems = append(problems, "admitted edge not forwarded: "+browser.Describe(e))
		}
		if e := browser.Element(dom, "g", "data-edge", other+"->"+web); e == nil || e["data-verdict"] != "DROPPED" ||
			!strings.Contains(e["data-reasons"], "policy-default-deny") || !strings.Contains(e["data-policies"], policy) {
			problems = append(problems, "denied edge not marked dropped with its reason and policy: "+browser.Describe(e))
		}
		return len(problems) == 0
	}) {
		t.Fatalf("the cluster's service map does not show what happened:\n%s\nstderr %s\npage:\n%s", strings.Join(problems, "\n"), errOut.String(), dom)
	}
	if errOut.String() != "" {
		t.Errorf("rampart ui --cluster left nodes out: %s", errOut.String())
	}
}

// suggestedThenAudited: suggest from the cluster's flows, then the suggestion in audit
// mode in place of the enforced policy.
func suggestedThenAudited(t *testing.T, c *nodetest.Cluster, ns string, pods map[string]map[string]corev1.Pod, since string,
	observe func(args ...string) (string, string, int)) {
	client, other, web := pods["client"]["node-1"], pods["other"]["node-1"], pods["web"]["node-2"]
	webAddr := web.Status.PodIP + ":8080"
	dir := t.TempDir()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if code := cli.Run(ctx, []string{"policy", "suggest", "--cluster", "--kubeconfig", c.Kubeconfig, "--namespace", ns, "--since", since, "--audit", "-o", dir},
		cli.IO{In: strings.NewReader(""), Out: &out, Err: &errOut}); code != 0 || errOut.Len() > 0 {
		t.Fatalf("policy suggest --cluster: exit %d, stderr %s", code, errOut.String())
	}
	ingress, err := os.ReadFile(filepath.Join(dir, ns+"-suggested-web-ingress.yaml"))
	if err != nil {
		t.Fatalf("no ingress policy for web: %v\n%s", err, out.String())
	}
	if !strings.Contains(string(ingress), "app: client") || strings.Contains(string(ingress), "app: other") ||
		!strings.Contains(string(ingress), "policy.rampart.io/audit") {
		t.Fatalf("suggested web ingress should admit app=client only, in audit:\n%s\n%s", ingress, out.String())
	}

	c.MustKubectl("-n", ns, "delete", "networkpolicy", "web-from-client")
	c.MustKubectl("apply", "-f", dir)
	auditedAt := time.Now().UTC().Format(time.RFC3339Nano)
	// In audit, nothing is dropped: the other pod connects too (once the change reached
	// node-2), and its flow says the suggested policy would have dropped it.
	if !eventuallyConnects(c, ns, other.Name, webAddr, true) {
		t.Fatalf("%s does not reach %s with only audited policy", other.Name, webAddr)
	}
	wantPolicy := "NetworkPolicy/" + ns + "/suggested-web-ingress"
	var flows string
	if !testenv.Eventually(30*time.Second, func() bool {
		if !connects(c, ns, client.Name, webAddr) || !connects(c, ns, other.Name, webAddr) {
			return false
		}
		stdout, _, code := observe("--since", auditedAt, "--verdict", "audit", "-o", "json")
		flows = stdout
		if code != 0 {
			return false
		}
		found := false
		for _, line := range strings.Split(strings.TrimSpace(stdout), "\n") {
			var f api.Flow
			if json.Unmarshal([]byte(line), &f) != nil {
				continue
			}
			if f.Source.IP == client.Status.PodIP {
				t.Fatalf("the client's connection, which the suggestion admits, is audited: %s", line)
			}
			found = found || (f.Node == "node-2" && f.Source.IP == other.Status.PodIP && slices.Contains(f.DefaultDenyBy, wantPolicy))
		}
		return found
	}) {
		t.Fatalf("no AUDIT flow of %s at node-2 naming %s:\n%s", other.Name, wantPolicy, flows)
	}
}

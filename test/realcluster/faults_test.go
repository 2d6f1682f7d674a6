package realcluster

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/nodetest"
)

// Faults on the real stack of node-2, one after the other, under traffic probed every
// 300 ms from the pods' own network namespaces (not through kubectl exec, which needs the
// kubelet the faults stop): the kubelet restarted, containerd restarted, rampartd restarted,
// and the node rebooted (all its processes, containers included, killed at once and its
// services started again). Throughout, no connection the policy denies is ever made. While
// the pods live (every fault but the reboot) every allowed connection succeeds and a
// long-lived allowed connection keeps answering; after each fault the node converges: Ready,
// its pods running, and the same verdicts for fresh connections.
func TestRealNodeFaults(t *testing.T) {
	c := nodetest.Start(t, nodetest.Options{Nodes: 2})
	ns := "faults-" + testenv.Suffix(6)
	c.MustKubectl("create", "namespace", ns)
	pods := deployWebClientOther(t, c, ns) // app -> node -> pod
	c.KubectlApply(fmt.Sprintf(allowClients, ns))
	web2 := pods["web"]["node-2"].Status.PodIP + ":8080"
	if !eventuallyConnects(c, ns, pods["other"]["node-1"].Name, web2, false) {
		t.Fatalf("other pods still reach %s under a policy admitting only app=client", web2)
	}

	p := &prober{c: c, ns: ns, netns: map[string]string{}}
	if !testenv.Eventually(time.Minute, func() bool { r := p.round(); return r.allowedFailed == 0 && r.allowedOK == 4 && r.deniedBlocked == 4 }) {
		t.Fatalf("probes before any fault: %+v", p.round())
	}
	node2 := c.Nodes[1]
	faults := []struct {
		name     string
		podsLive bool
		inject   func() error
	}{
		{"kubelet restarted", true, node2.RestartKubelet},
		{"containerd restarted", true, node2.RestartContainerd},
		{"rampartd restarted", true, func() error { node2.Node.Stop(); node2.Node.Start(); return nil }},
		{"node rebooted", false, node2.Reboot},
	}
	for _, f := range faults {
		var long *longConn
		if f.podsLive {
			var err error
			if long, err = p.dialLong(pods["client"]["node-1"], web2); err != nil {
				t.Fatalf("%s: opening the long-lived connection: %v", f.name, err)
			}
		}
		stop := p.run(long)
		began := time.Now()
		if err := f.inject(); err != nil {
			stop()
			t.Fatalf("%s: %v", f.name, err)
		}
		ok := testenv.Eventually(3*time.Minute, func() bool { return p.converged(began) })
		tally := stop()
		t.Logf("%s: converged in %v; probes %+v", f.name, time.Since(began).Round(time.Millisecond), tally)
		if tally.deniedPassed > 0 {
			t.Errorf("%s: %d denied connections were made: %s", f.name, tally.deniedPassed, strings.Join(tally.errors, "; "))
		}
		if f.podsLive && (tally.allowedFailed > 0 || tally.longBroken != "") {
			t.Errorf("%s: %d allowed connections failed (%s), long-lived connection: %q", f.name, tally.allowedFailed, strings.Join(tally.errors, "; "), tally.longBroken)
		}
		if !ok {
			t.Fatalf("%s: node-2 did not converge in 3 minutes; last probes %+v", f.name, p.round())
		}
	}
}

// prober probes, from every node's client and other pods, the web pod of every node: the
// policy admits client pods and denies the others.
type prober struct {
	c     *nodetest.Cluster
	ns    string
	mu    sync.Mutex
	netns map[string]string // pod UID + IP -> its network namespace
	seen  tally             // every round's results since run began
}

type tally struct {
	allowedOK, allowedFailed, deniedBlocked, deniedPassed, skipped int
	// longAnswered counts the requests answered on the long-lived connection.
	longAnswered int
	longBroken   string
	errors       []string
}

func (a *tally) add(b tally) {
	a.allowedOK += b.allowedOK
	a.allowedFailed += b.allowedFailed
	a.deniedBlocked += b.deniedBlocked
	a.deniedPassed += b.deniedPassed
	a.skipped += b.skipped
	if len(a.errors) < 5 {
		a.errors = append(a.errors, b.errors...)
	}
}

// round probes every pair once, in parallel, with a 1 s timeout each. Pairs whose pods are
// not running (or whose sandbox cannot be found, while containerd is down) are skipped.
func (p *prober) round() tally {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	list, err := p.c.Client.CoreV1().Pods(p.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return tally{skipped: 1}
	}
	byApp := map[string][]corev1.Pod{}
	for _, pod := range list.Items {
		if pod.Status.Phase == corev1.PodRunning && pod.Status.PodIP != "" && pod.DeletionTimestamp == nil {
			byApp[pod.Labels["app"]] = append(byApp[pod.Labels["app"]], pod)
		}
	}
	var mu sync.Mutex
	var t tally
	var wg sync.WaitGroup
	for _, app := range []string{"client", "other"} {
		for _, from := range byApp[app] {
			for _, web := range byApp["web"] {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := p.probe(from, netip.MustParseAddrPort(web.Status.PodIP+":8080"), app == "client")
					mu.Lock()
					t.add(r)
					mu.Unlock()
				}()
			}
		}
	}
	wg.Wait()
	p.mu.Lock()
	p.seen.add(t)
	p.mu.Unlock()
	return t
}

func (p *prober) probe(from corev1.Pod, to netip.AddrPort, allowed bool) tally {
	path, err := p.podNetns(from)
	if err != nil {
		return tally{skipped: 1, errors: []string{err.Error()}}
	}
	c, err := testenv.Dial(path, "tcp", to, time.Second)
	desc := fmt.Sprintf("%s (%s) -> %s", from.Name, from.Status.PodIP, to)
	switch {
	case err == nil && allowed:
		c.Close()
		return tally{allowedOK: 1}
	case err == nil:
		c.Close()
		return tally{deniedPassed: 1, errors: []string{desc + " connected"}}
	case allowed:
		return tally{allowedFailed: 1, errors: []string{desc + ": " + err.Error()}}
	default:
		return tally{deniedBlocked: 1}
	}
}

// podNetns finds a pod's network namespace through its node's containerd, once per
// sandbox (a pod's UID and address).
func (p *prober) podNetns(pod corev1.Pod) (string, error) {
	key := string(pod.UID) + "/" + pod.Status.PodIP
	p.mu.Lock()
	path, ok := p.netns[key]
	p.mu.Unlock()
	if ok {
		return path, nil
	}
	for _, n := range p.c.Nodes {
		if n.Name != pod.Spec.NodeName {
			continue
		}
		path, err := n.PodNetns(filepath.Join(p.c.Bins.CRI, "crictl"), pod.Namespace, pod.Name)
		if err != nil {
			return "", err
		}
		p.mu.Lock()
		p.netns[key] = path
		p.mu.Unlock()
		return path, nil
	}
	return "", fmt.Errorf("pod %s is on no node of the cluster", pod.Name)
}

// longConn is one HTTP/1.1 keep-alive connection from a client pod to a web pod.
type longConn struct {
	http *testenv.RawHTTP
	to   string
}

func (p *prober) dialLong(from corev1.Pod, to string) (*longConn, error) {
	path, err := p.podNetns(from)
	if err != nil {
		return nil, err
	}
	c, err := testenv.DialRawHTTP(path, netip.MustParseAddrPort(to), 5*time.Second)
	if err != nil {
		return nil, err
	}
	return &longConn{http: c, to: to}, nil
}

// ask sends one request on the connection and reads its answer within 2 s.
func (l *longConn) ask() error {
	l.http.Conn.SetDeadline(time.Now().Add(2 * time.Second))
	if err := l.http.Send("GET /hostname HTTP/1.1\r\nHost: " + l.to + "\r\n\r\n"); err != nil {
		return err
	}
	resp, _, err := l.http.Response(nil)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s", resp.Status)
	}
	return nil
}

// run probes every 300 ms, and asks on long (if not nil) every 50 ms on a goroutine of its
// own (so that a gap in its answers shorter than a round is seen), until the returned
// function is called, which returns the sum of what every round since run began saw
// (converged's included).
func (p *prober) run(long *longConn) func() tally {
	p.mu.Lock()
	p.seen = tally{}
	p.mu.Unlock()
	var broken string
	answered := 0
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(300 * time.Millisecond)
		defer tick.Stop()
		for {
			p.round()
			select {
			case <-quit:
				return
			case <-tick.C:
			}
		}
	}()
	if long != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(50 * time.Millisecond)
			defer tick.Stop()
			for broken == "" {
				if err := long.ask(); err != nil {
					broken = err.Error()
				} else {
					answered++
				}
				select {
				case <-quit:
					return
				case <-tick.C:
				}
			}
		}()
	}
	return func() tally {
		close(quit)
		wg.Wait()
		if long != nil {
			long.http.Close()
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		sum := p.seen
		sum.longBroken = broken
		sum.longAnswered = answered
		return sum
	}
}

// converged says whether every node is Ready, its kubelet has renewed its Lease since
// the fault and its containerd answers, every app runs on every node, and a round of fresh
// probes gives the policy's verdicts on all of them.
func (p *prober) converged(since time.Time) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	nodes, err := p.c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil || len(nodes.Items) != len(p.c.Nodes) {
		return false
	}
	for _, n := range nodes.Items {
		if !ready(&n) {
			return false
		}
	}
	for _, n := range p.c.Nodes {
		lease, err := p.c.Client.CoordinationV1().Leases("kube-node-lease").Get(ctx, n.Name, metav1.GetOptions{})
		if err != nil || lease.Spec.RenewTime == nil || lease.Spec.RenewTime.Time.Before(since) {
			return false
		}
		if _, err := n.Output(filepath.Join(p.c.Bins.CRI, "crictl"), "--runtime-endpoint", "unix:///run/containerd/containerd.sock", "--timeout", "2s", "version"); err != nil {
			return false
		}
	}
	r := p.round()
	n := len(p.c.Nodes)
	return r.skipped == 0 && r.allowedOK == n*n && r.deniedBlocked == n*n
}

func ready(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

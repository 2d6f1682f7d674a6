package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/rampartnet/rampart/internal/api"
)

// clusterDemo is the driver of the cluster form (scripts/demo-dvdrental.sh --cluster):
// the store's pods run (examples/dvdrental/cluster/), and it plays the one-node demo's
// story through the Kubernetes API as a user would: kubectl apply for the connection
// policy, kubectl exec in the pods for the customer's requests, the attacks and the
// checks, and the rampart CLI in the agent pods for the tap policy.
type clusterDemo struct {
	kubeconfig, kubectl string
	agents              map[string]string // node -> agent pod
	ips                 map[string]string // app -> pod IP
	failures            int
}

// Where the pods run (examples/dvdrental/cluster/store.yaml): each redirect's monitor on
// its source's node, as a redirect needs.
const (
	dbNode       = "node-1" // db, ids-pg, mq, user-update, dvd-update, customer
	contractNode = "node-2" // contract-update, ids-http, user-create, shipping, dvd-return
)

func runCluster(args []string) error {
	fs := flag.NewFlagSet("cluster", flag.ExitOnError)
	kubeconfig := fs.String("kubeconfig", "", "the cluster's kubeconfig")
	kubectl := fs.String("kubectl", "kubectl", "the kubectl binary")
	examples := fs.String("examples", "examples/dvdrental", "the demo's manifests")
	fs.Parse(args)
	if *kubeconfig == "" {
		return errors.New("--kubeconfig is required")
	}
	d := &clusterDemo{kubeconfig: *kubeconfig, kubectl: *kubectl, agents: map[string]string{}, ips: map[string]string{}}
	for _, node := range []string{dbNode, contractNode} {
		out, err := d.kube(nil, "-n", "kube-system", "get", "pods", "-l", "app.kubernetes.io/name=rampart",
			"--field-selector", "spec.nodeName="+node, "-o", "jsonpath={.items[0].metadata.name}")
		if err != nil || out == "" {
			return fmt.Errorf("the agent pod of %s: %v %s", node, err, out)
		}
		d.agents[node] = out
	}
	for _, app := range append(services, "ids-pg", "ids-http") {
		out, err := d.kube(nil, "-n", storeNS, "get", "pod", app, "-o", "jsonpath={.status.podIP}")
		if err != nil || out == "" {
			return fmt.Errorf("the address of pod %s/%s: %v %s", storeNS, app, err, out)
		}
		d.ips[app] = out
	}
	step("the store's pods (namespace dvd)")
	if err := d.show("get", "pods", "-n", storeNS, "-o", "wide"); err != nil {
		return err
	}

	step("connection policy (kubectl apply -f examples/dvdrental/01-connection-policy.yaml)")
	if err := d.show("apply", "-f", filepath.Join(*examples, "01-connection-policy.yaml")); err != nil {
		return err
	}
	// The agents take the policy from the API at their next sync: wait until both nodes
	// enforce it (a probe from shipping, on node-2, to the database, on node-1, times out),
	// then play the story.
	d.eventually("the policy in force: shipping -> db:5432 blocked", 30*time.Second, func() bool { return d.probeDB("shipping") == 3 })

	step("a rental: alice rents d1 at contract-update")
	d.expect("rental r1 accepted", d.rent("r1", "alice", "d1") == nil)
	d.expect("alice billed for r1, nobody else", d.chargesFor("r1") == "r1 alice 399")
	d.eventually("d1 shipped to alice", 10*time.Second, func() bool {
		out, _ := d.kube(nil, "-n", storeNS, "logs", "shipping")
		return strings.Contains(out, `"rental":"r1","user":"alice"`)
	})

	step("connection policy: a compromised shipping or dvd-return connects to the database")
	for _, from := range []string{"shipping", "dvd-return"} {
		d.expect(from+" -> db:5432 blocked", d.probeDB(from) == 3)
	}
	d.expect("user-update -> db:5432 connects (control)", d.probeDB("user-update") == 0)

	step("request integrity, no monitor: a compromised contract-update bills bob for alice's rental")
	if err := d.compromise("contract-update", "bill-other"); err != nil {
		return err
	}
	d.expect("rental r2 accepted", d.rent("r2", "alice", "d2") == nil)
	d.expect("bob billed for alice's r2: the attack goes unseen", d.chargesFor("r2") == "r2 bob 399")
	if err := d.compromise("contract-update", ""); err != nil {
		return err
	}

	step("request-specific connection policy, no monitor: a compromised user-create reads a customer's record")
	if err := d.compromise("user-create", "read-user"); err != nil {
		return err
	}
	d.expect("carol created", d.createUser("carol") == nil)
	logs, _ := d.kube(nil, "-n", storeNS, "logs", "user-create")
	d.expect("user-create read alice's balance: the leak goes unseen", strings.Contains(logs, "read alice's balance"))

	step("monitors: the pods dvd/ids-pg (PostgreSQL, inline, on db's node) and dvd/ids-http (HTTP, passive, on contract-update's node), each running Suricata 7")
	if err := d.monitor("ids-pg", dbNode, "ips", fmt.Sprintf(
		`drop tcp %s any -> %s %d (msg:"request-specific: user-create may insert customers, not read them"; flow:to_server,established; content:"SELECT"; nocase; sid:2000001; rev:1;)`,
		d.ips["user-create"], d.ips["db"], pgPort)); err != nil {
		return err
	}
	integrity := func(action string) string {
		return fmt.Sprintf(`%s http any any -> any %d (msg:"request integrity: a rental billed to another customer than the renter"; flow:to_server,established; lua:integrity.lua; sid:2000002; rev:1;)`, action, httpPort)
	}
	if err := d.monitor("ids-http", contractNode, "passive", integrity("alert")); err != nil {
		return err
	}
	policy := filepath.Join(*examples, "02-tap-policy.mg")
	step("tap policy (" + policy + ") on each node: what it derives on " + dbNode + ", and why")
	if err := d.rampart(dbNode, policy, "tap", "compile", "-f", "-", "--explain"); err != nil {
		return err
	}
	if err := d.tapPolicy(policy); err != nil {
		return err
	}

	step("request-specific connection policy, inline monitor: the compromised user-create inserts dave, its query is dropped")
	d.expect("dave's creation fails at the read", d.createUser("dave") != nil)
	d.expect("dave exists: the insert passed the monitor", strings.Contains(d.customers(), "dave"))
	d.expect("the monitor dropped user-create's SELECT", d.waitAlert("ids-pg", 2000001, "blocked"))
	if err := d.compromise("user-create", ""); err != nil {
		return err
	}
	d.expect("an honest rental through the PostgreSQL monitor: alice billed for r3",
		d.rent("r3", "alice", "d3") == nil && d.chargesFor("r3") == "r3 alice 399")

	step("request integrity, mirror: the compromised contract-update bills bob for alice's rental, the monitor sees it")
	if err := d.compromise("contract-update", "bill-other"); err != nil {
		return err
	}
	d.expect("rental r4 accepted", d.rent("r4", "alice", "d1") == nil)
	d.expect("bob billed for r4: a mirror only watches", d.chargesFor("r4") == "r4 bob 399")
	d.expect("the monitor raised the integrity alert", d.waitAlert("ids-http", 2000002, "allowed"))

	inline := filepath.Join(*examples, "03-tap-policy-inline.mg")
	step("request integrity, inline (" + inline + "): the billing request for another customer is dropped")
	if err := d.monitor("ids-http", contractNode, "ips", integrity("drop")); err != nil {
		return err
	}
	if err := d.tapPolicy(inline); err != nil {
		return err
	}
	d.expect("rental r5 refused: its billing never reached user-update", d.rent("r5", "alice", "d2") != nil)
	d.expect("nobody billed for r5", d.chargesFor("r5") == "")
	d.expect("the monitor dropped the billing request", d.waitAlert("ids-http", 2000002, "blocked"))
	if err := d.compromise("contract-update", ""); err != nil {
		return err
	}
	d.expect("an honest rental through both inline monitors: alice billed for r6",
		d.rent("r6", "alice", "d3") == nil && d.chargesFor("r6") == "r6 alice 399")

	step("fail closed: Suricata stops in the inline HTTP monitor's pod (the pod, its tap interfaces and the contract stay)")
	if err := d.monitor("ids-http", "", "off"); err != nil {
		return err
	}
	d.expect("rental r7 refused while its monitor is down: no way around it", d.rent("r7", "alice", "d1") != nil)
	d.expect("nobody billed for r7", d.chargesFor("r7") == "")
	if err := d.rampart(contractNode, "", "tap", "list"); err != nil {
		return err
	}

	if d.failures > 0 {
		return fmt.Errorf("%d outcome(s) differ from what the policies say", d.failures)
	}
	fmt.Println("\nevery outcome as expected")
	return nil
}

// kube runs kubectl with the cluster's kubeconfig (stdin, if given, fed to it) and
// returns its output, trimmed; each call is bounded to 60 s.
func (d *clusterDemo) kube(stdin []byte, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.kubectl, append([]string{"--kubeconfig", d.kubeconfig}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

// show runs kubectl and prints the command and its output.
func (d *clusterDemo) show(args ...string) error {
	fmt.Printf("\n$ kubectl %s\n", strings.Join(args, " "))
	out, err := d.kube(nil, args...)
	fmt.Println(out)
	if err != nil {
		return fmt.Errorf("kubectl %s: %w", strings.Join(args, " "), err)
	}
	return nil
}

// in runs dvdrental ARGS in pod (namespace ns) with kubectl exec: in the pod's network
// namespace, so the policy judges it as the pod's own traffic. It returns the output and
// the command's exit code (-1: kubectl failed otherwise).
func (d *clusterDemo) in(ns, pod string, args ...string) (string, int) {
	out, err := d.kube(nil, append([]string{"-n", ns, "exec", pod, "--", "/usr/local/bin/dvdrental"}, args...)...)
	// kubectl's own line about the exit code: the code is returned.
	if i := strings.LastIndex(out, "command terminated with exit code"); i >= 0 {
		out = strings.TrimSpace(out[:i])
	}
	var ee *exec.ExitError
	switch {
	case err == nil:
		return out, 0
	case errors.As(err, &ee):
		return out, ee.ExitCode()
	}
	return out + ": " + err.Error(), -1
}

func (d *clusterDemo) expect(what string, ok bool) {
	if ok {
		fmt.Printf("  ok    %s\n", what)
		return
	}
	d.failures++
	fmt.Printf("  FAIL  %s\n", what)
}

// eventually expects cond to hold within timeout: what the cluster makes true at the
// agents' next sync or asynchronously (the queue).
func (d *clusterDemo) eventually(what string, timeout time.Duration, cond func() bool) {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			d.expect(what, false)
			return
		}
		time.Sleep(200 * time.Millisecond) // between polls of what another process changes
	}
	d.expect(what, true)
}

// rent is alice's (or another customer's) rental, from the customer's pod.
func (d *clusterDemo) rent(rental, user, dvd string) error {
	return d.customerDo("rent", "contract-update", "--rental", rental, "--user", user, "--dvd", dvd)
}

func (d *clusterDemo) createUser(user string) error {
	return d.customerDo("create-user", "user-create", "--user", user)
}

// customerDo sends a customer's request to a store service by its name (a headless
// Service: the pod's address).
func (d *clusterDemo) customerDo(what, app string, args ...string) error {
	url := fmt.Sprintf("http://%s.%s:%d", app, storeNS, httpPort)
	out, code := d.in(customerNS, "customer", append([]string{what, "--url", url}, args...)...)
	if code != 0 {
		fmt.Printf("        %s\n", out)
		return fmt.Errorf("%s: exit %d", what, code)
	}
	return nil
}

// chargesFor reads the charges of rental from user-update's pod (the policy lets it
// reach the database).
func (d *clusterDemo) chargesFor(rental string) string {
	out, code := d.in(storeNS, "user-update", "charges", "--db", fmt.Sprintf("db:%d", pgPort))
	if code != 0 {
		return "error: " + out
	}
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, rental+" ") {
			lines = append(lines, l)
		}
	}
	fmt.Printf("        charges of %s: %q\n", rental, lines)
	return strings.Join(lines, "; ")
}

func (d *clusterDemo) customers() string {
	out, code := d.in(storeNS, "user-update", "customers", "--db", fmt.Sprintf("db:%d", pgPort))
	if code != 0 {
		return "error: " + out
	}
	fmt.Printf("        customers: %s\n", strings.Join(strings.Fields(out), ", "))
	return out
}

// probeDB is what a compromised service tries, from its pod: 0 connected and read, 3 no
// connection.
func (d *clusterDemo) probeDB(from string) int {
	out, code := d.in(storeNS, from, "probe-db", "--db", fmt.Sprintf("db:%d", pgPort), "--timeout", "1s")
	fmt.Printf("        %s: %s\n", from, out)
	return code
}

func (d *clusterDemo) compromise(app, mode string) error {
	args := []string{"compromise"}
	if mode != "" {
		args = append(args, mode)
	}
	if out, code := d.in(storeNS, app, args...); code != 0 {
		return fmt.Errorf("compromising %s: %s", app, out)
	}
	if mode == "" {
		fmt.Printf("  %s runs as built again\n", app)
	} else {
		fmt.Printf("  %s compromised (%s)\n", app, mode)
	}
	return nil
}

// monitor has the monitor pod run Suricata in mode with rules, and waits until its
// node's agent no longer shows it down, so that what is sent next reaches it ("off"
// stops Suricata and does not wait).
func (d *clusterDemo) monitor(pod, node, mode string, rules ...string) error {
	args := []string{"monitor-ctl", "--mode", mode}
	for _, r := range rules {
		args = append(args, "--rule", r)
		if strings.Contains(r, "lua:") {
			args = append(args, "--lua")
		}
	}
	out, code := d.in(storeNS, pod, args...)
	if code != 0 {
		return fmt.Errorf("Suricata in %s/%s: %s", storeNS, pod, out)
	}
	fmt.Printf("  %s/%s: %s\n", storeNS, pod, out)
	if mode == "off" {
		return nil
	}
	key := storeNS + "/" + pod
	deadline := time.Now().Add(15 * time.Second)
	for {
		var st api.Status
		raw, err := d.kube(nil, "-n", "kube-system", "exec", d.agents[node], "-c", "rampartd", "--", "/usr/local/bin/rampart", "status", "-o", "json")
		if err == nil && json.Unmarshal([]byte(raw), &st) == nil {
			down := false
			if st.Monitors != nil {
				for _, m := range st.Monitors.Down {
					down = down || strings.HasPrefix(m, key+": ")
				}
			}
			if !down {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the agent of %s still shows monitor %s down after 15 s: %v %s", node, key, err, raw)
		}
		time.Sleep(200 * time.Millisecond) // polling the agent's status
	}
}

func (d *clusterDemo) waitAlert(pod string, sid int, action string) bool {
	out, code := d.in(storeNS, pod, "wait-alert", "--sid", fmt.Sprint(sid), "--action", action, "--timeout", "15s")
	fmt.Printf("        monitor: %s\n", out)
	return code == 0
}

// rampart runs the rampart CLI in node's agent pod, as a user asks an agent, with file
// (if any) on its standard input, and prints the command and its output.
func (d *clusterDemo) rampart(node, file string, args ...string) error {
	var stdin []byte
	shown := strings.Join(args, " ")
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		stdin = b
		shown += " < " + file
	}
	fmt.Printf("\n$ scripts/cluster.sh rampart %s %s\n", node, shown)
	kargs := []string{"-n", "kube-system", "exec", d.agents[node], "-c", "rampartd"}
	if stdin != nil {
		kargs = append(kargs, "-i")
	}
	out, err := d.kube(stdin, append(append(kargs, "--", "/usr/local/bin/rampart"), args...)...)
	fmt.Println(out)
	if err != nil {
		return fmt.Errorf("rampart %s on %s: %w", strings.Join(args, " "), node, err)
	}
	return nil
}

// tapPolicy applies a tap policy on every node: it is each agent's own (docs/taps.md), and
// each places the requests of its own pods on its own monitors.
func (d *clusterDemo) tapPolicy(file string) error {
	for _, node := range []string{dbNode, contractNode} {
		if err := d.rampart(node, file, "tap", "policy", "apply", "-f", "-"); err != nil {
			return err
		}
	}
	return nil
}

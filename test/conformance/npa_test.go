package conformance

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/controlplane"
	"github.com/rampartnet/rampart/internal/testenv/nodetest"
	"github.com/rampartnet/rampart/test/conformance/npa"

	npaconformance "sigs.k8s.io/network-policy-api/conformance"
)

// npaAgnhost is the image upstream's base manifests run (network-policy-api v0.3.0),
// without a pull policy: IfNotPresent for a tag that is not latest.
const npaAgnhost = "registry.k8s.io/e2e-test-images/agnhost:2.45"

// npaSubset is the tests CI runs on every change: ingress and egress over TCP in the
// admin tier and the baseline tier's ingress over UDP (the CIDR tests probe SCTP too,
// which this kernel lacks).
var npaSubset = []string{"CNPAdminTierIngressTCP", "CNPAdminTierEgressTCP", "CNPBaselineTierIngressUDP"}

// TestNetworkPolicyAPISubset runs npaSubset on two real nodes in a budget of 10 minutes
// (the cluster's start not counted) and fails listing each test that did not pass.
func TestNetworkPolicyAPISubset(t *testing.T) {
	rs := runNPA(t, "TestNPASuite$/^("+strings.Join(npaSubset, "|")+")$", false, 10*time.Minute)
	var passed int
	for _, r := range rs {
		if r.Subtest == "" && r.Status == "pass" {
			passed++
		}
	}
	if passed != len(npaSubset) {
		t.Errorf("%d tests passed; want the subset's %d", passed, len(npaSubset))
	}
}

// TestNetworkPolicyAPI runs every ClusterNetworkPolicy conformance test of
// network-policy-api v0.3.0 (test/conformance/npa: the standard channel and named ports;
// the SCTP tests and the node-selector ones skipped) when RAMPART_NPA=full
// (scripts/conformance.sh --npa), then the supplement (package npa/nosctp: the six tests
// that probe SCTP without being about it, without those probes, as <test>WithoutSCTP).
// RAMPART_NPA_TIMEOUT bounds the run (default 1h); RAMPART_NPA_RUN, a go test -run
// pattern for the tests (e.g. 'WithoutSCTP$'), narrows it.
func TestNetworkPolicyAPI(t *testing.T) {
	if os.Getenv("RAMPART_NPA") != "full" {
		t.Skip("the full network-policy-api conformance run takes about 20 minutes; RAMPART_NPA=full runs it (scripts/conformance.sh --npa)")
	}
	budget := time.Hour
	if d, err := time.ParseDuration(os.Getenv("RAMPART_NPA_TIMEOUT")); err == nil && d > 0 {
		budget = d
	}
	run := "TestNPASuite$"
	if r := os.Getenv("RAMPART_NPA_RUN"); r != "" {
		run += "/" + r
	}
	runNPA(t, run, true, budget)
}

// npaResult is one test of the suite (Subtest empty) or one of its subtests.
type npaResult struct {
	Test, Subtest string
	// Status is pass, fail or skip; "not run" if go test ended before it did; "blocked" for
	// a failure at an SCTP probe alone (classifySCTP).
	Status  string
	Seconds float64
	Output  []string // the test's own lines (a skip's reason, a failure's evidence)
}

// runNPA starts a cluster of two real nodes, tags the nodes' agnhost image as npaAgnhost,
// runs test/conformance/npa's TestNPASuite (the -run pattern run) against it with
// go test -json, writes the results to the report directory
// (RAMPART_CONFORMANCE_REPORT_DIR, else a temporary one) as npa.json, npa.log and
// npa-summary.txt, and fails the test listing each test and subtest that failed.
//
// With noSCTP it adds the supplement (package nosctp, npa.NoSCTP): the six tests that
// probe SCTP without being about it, their SCTP probes taken out, written to a temporary
// directory and added to the package with go test -overlay.
func runNPA(t *testing.T, run string, noSCTP bool, budget time.Duration) []*npaResult {
	root := testenv.ModuleRoot(t)
	report := os.Getenv("RAMPART_CONFORMANCE_REPORT_DIR")
	if report == "" {
		report = t.TempDir()
	} else if err := os.MkdirAll(report, 0o755); err != nil {
		t.Fatal(err)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}

	c := nodetest.Start(t, nodetest.Options{Nodes: 2})
	for _, n := range c.Nodes {
		if out, err := n.Exec(filepath.Join(c.Bins.Node, "ctr"), "--address", "/run/containerd/containerd.sock",
			"--namespace", "k8s.io", "images", "tag", "--force", c.Bins.AgnhostImage, npaAgnhost); err != nil {
			t.Fatalf("node %s: tagging %s as %s: %v\n%s", n.Name, c.Bins.AgnhostImage, npaAgnhost, err, out)
		}
	}

	jsonPath, logPath := filepath.Join(report, "npa.json"), filepath.Join(report, "npa.log")
	jsonFile, err := os.Create(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	defer jsonFile.Close()
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()

	args := []string{"test", "-json", "-count=1", "-v", "-timeout=" + budget.String(), "-run=" + run}
	if noSCTP {
		args = append(args, "-overlay="+noSCTPOverlay(t, root))
	}
	ctx, cancel := context.WithTimeout(context.Background(), budget+2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, append(args, "./test/conformance/npa")...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "RAMPART_NPA_KUBECONFIG="+c.Kubeconfig)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logFile
	began := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	rs, parseErr := parseNPA(out, jsonFile, logFile)
	runErr := cmd.Wait()
	took := time.Since(began)
	if parseErr != nil {
		t.Errorf("reading go test's output: %v", parseErr)
	}

	classifySCTP(rs)
	summary := npaSummary(rs, took)
	if err := os.WriteFile(filepath.Join(report, "npa-summary.txt"), []byte(summary), 0o644); err != nil {
		t.Error(err)
	}
	t.Logf("results in %s:\n%s", report, summary)
	if len(rs) == 0 {
		t.Fatalf("go test: %v; no test listed; %s ends:\n%s", runErr, logPath, controlplane.LogTail(logPath, 40))
	}
	var failed, blocked int
	for _, r := range rs {
		switch {
		case r.Status == "fail" || r.Status == "not run":
			failed++
			if r.Subtest != "" || !hasSubtests(rs, r.Test) {
				t.Errorf("%s %s (%.1f s):\n%s", strings.ToUpper(r.Status), r.name(), r.Seconds, strings.Join(tail(r.Output, 60), "\n"))
			}
		case r.Status == "blocked":
			blocked++
			if r.Subtest != "" {
				t.Logf("BLOCKED %s (%.1f s) at an SCTP probe (no SCTP in this kernel):\n%s", r.name(), r.Seconds, strings.Join(tail(r.Output, 8), "\n"))
			}
		}
	}
	// A blocked subtest fails go test too.
	if runErr != nil && failed == 0 && blocked == 0 {
		t.Errorf("go test: %v with no failed test; %s ends:\n%s", runErr, logPath, controlplane.LogTail(logPath, 40))
	}
	return rs
}

func (r *npaResult) name() string {
	if r.Subtest == "" {
		return r.Test
	}
	return r.Test + "/" + r.Subtest
}

func hasSubtests(rs []*npaResult, test string) bool {
	for _, r := range rs {
		if r.Test == test && r.Subtest != "" {
			return true
		}
	}
	return false
}

// parseNPA reads go test -json's events, copying them to raw and their output to log, and
// returns TestNPASuite's tests and subtests in the order they started. The suite's own
// lines (its setup) are kept under the test "(setup)".
func parseNPA(r interface{ Read([]byte) (int, error) }, raw, log *os.File) ([]*npaResult, error) {
	var rs []*npaResult
	byName := map[string]*npaResult{}
	setup := &npaResult{Test: "(setup)", Status: "pass"}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Bytes()
		fmt.Fprintf(raw, "%s\n", line)
		var ev struct {
			Action  string
			Test    string
			Elapsed float64
			Output  string
		}
		if err := json.Unmarshal(line, &ev); err != nil {
			fmt.Fprintf(log, "%s\n", line)
			continue
		}
		if ev.Output != "" {
			fmt.Fprint(log, ev.Output)
		}
		name, ok := strings.CutPrefix(ev.Test, "TestNPASuite/")
		if !ok {
			if ev.Test == "TestNPASuite" {
				switch ev.Action {
				case "output":
					if s := strings.TrimRight(ev.Output, "\n"); !strings.HasPrefix(strings.TrimSpace(s), "=== ") &&
						!strings.HasPrefix(strings.TrimSpace(s), "--- ") {
						setup.Output = append(setup.Output, s)
					}
				case "fail":
					setup.Seconds = ev.Elapsed
					if !hasFailure(rs) {
						setup.Status = "fail"
						rs = append([]*npaResult{setup}, rs...)
					}
				}
			}
			continue
		}
		res := byName[name]
		if res == nil {
			test, sub, _ := strings.Cut(name, "/")
			res = &npaResult{Test: test, Subtest: sub, Status: "not run"}
			byName[name] = res
			rs = append(rs, res)
		}
		switch ev.Action {
		case "pass", "fail", "skip":
			res.Status, res.Seconds = ev.Action, ev.Elapsed
		case "output":
			s := strings.TrimRight(ev.Output, "\n")
			if t := strings.TrimSpace(s); !strings.HasPrefix(t, "=== ") && !strings.HasPrefix(t, "--- ") {
				res.Output = append(res.Output, s)
			}
		}
	}
	return rs, sc.Err()
}

func hasFailure(rs []*npaResult) bool {
	for _, r := range rs {
		if r.Status == "fail" {
			return true
		}
	}
	return false
}

// npaSummary is one line per test and subtest (status, seconds, name; a skip's reason),
// then the tests' counts and the run's wall time.
func npaSummary(rs []*npaResult, took time.Duration) string {
	var b strings.Builder
	counts := map[string]int{}
	for _, r := range rs {
		name := r.Test
		if r.Subtest != "" {
			name = "  " + r.Subtest
		} else {
			counts[r.Status]++
		}
		line := fmt.Sprintf("%-7s %6.1fs  %s", r.Status, r.Seconds, name)
		switch {
		case r.Status == "skip" && len(r.Output) > 0:
			line += "  (" + skipReason(r.Output) + ")"
		case r.Status == "blocked" && r.Subtest != "":
			line += "  (an SCTP probe: no SCTP in this kernel; the probes after it did not run)"
		}
		b.WriteString(line + "\n")
	}
	fmt.Fprintf(&b, "tests: passed %d, failed %d, blocked by an SCTP probe %d, skipped %d, not run %d; go test ran %v\n",
		counts["pass"], counts["fail"], counts["blocked"], counts["skip"], counts["not run"], took.Round(time.Second))
	return b.String()
}

// skipReason is the last line a skipped test logged, without its file:line prefix.
func skipReason(out []string) string {
	s := strings.TrimSpace(out[len(out)-1])
	if i := strings.Index(s, ": "); i > 0 && strings.Contains(s[:i], ".go:") {
		s = s[i+2:]
	}
	return s
}

// tail is the last n of lines.
func tail(lines []string, n int) []string {
	if len(lines) > n {
		return lines[len(lines)-n:]
	}
	return lines
}

// classifySCTP marks "blocked" each failed subtest whose only failed probes are SCTP ones
// that could not open a socket ("protocol not supported": this kernel has no SCTP), and
// each failed test whose failed subtests are all so. Six tests that are not about SCTP
// (the CIDR, gress and port-range ones of both tiers) probe SCTP too, between their TCP
// and UDP probes; such a probe fails whatever the policy, and ends its subtest (the probes
// after it do not run): that is the kernel's, not a verdict on Rampart.
func classifySCTP(rs []*npaResult) {
	blocked := map[string]bool{}
	for _, r := range rs {
		if r.Subtest == "" || r.Status != "fail" {
			continue
		}
		var probes, sctp int
		unsupported := false
		for _, l := range r.Output {
			if strings.Contains(l, "FAILED Command was") {
				probes++
				if strings.Contains(l, "--protocol=sctp") {
					sctp++
				}
			}
			if strings.Contains(l, "protocol not supported") {
				unsupported = true
			}
		}
		if probes > 0 && probes == sctp && unsupported {
			r.Status = "blocked"
			blocked[r.Test] = true
		}
	}
	for _, r := range rs {
		if r.Subtest != "" || r.Status != "fail" || !blocked[r.Test] {
			continue
		}
		all := true
		for _, s := range rs {
			if s.Test == r.Test && s.Subtest != "" && s.Status == "fail" {
				all = false
			}
		}
		if all {
			r.Status = "blocked"
		}
	}
}

// noSCTPOverlay writes npa.NoSCTP of each of npa.NoSCTPFiles to a temporary directory and
// returns the path of a go build overlay adding them to test/conformance/npa/nosctp.
func noSCTPOverlay(t *testing.T, root string) string {
	dir := t.TempDir()
	replace := map[string]string{}
	for _, name := range npa.NoSCTPFiles {
		src, err := fs.ReadFile(npaconformance.Manifests, "tests/"+name)
		if err != nil {
			t.Fatal(err)
		}
		out, err := npa.NoSCTP(name, string(src))
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		replace[filepath.Join(root, "test", "conformance", "npa", "nosctp", name)] = path
	}
	b, err := json.Marshal(map[string]any{"Replace": replace})
	if err != nil {
		t.Fatal(err)
	}
	overlay := filepath.Join(dir, "overlay.json")
	if err := os.WriteFile(overlay, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return overlay
}

package conformance

import (
	"bufio"
	"context"
	"encoding/xml"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/controlplane"
	"github.com/rampartnet/rampart/internal/testenv/k8stest"
	"github.com/rampartnet/rampart/internal/testenv/nodetest"
)

// cyclonusExclude is what cyclonus' generate leaves out by default (multi-peer,
// upstream-e2e, example, end-port, namespaces-by-default-label: its DefaultExcludeTags), and
// sctp: this kernel has no SCTP, no pod can serve it (the servers are TCP and UDP only).
const cyclonusExclude = "multi-peer,upstream-e2e,example,end-port,namespaces-by-default-label,sctp"

// cyclonusSubset is the tags of the cases CI runs on every change: ipBlock peers with and
// without an except, ingress and egress (4 cases), the specs Cilium skips upstream; pod
// selectors are in the e2e subset. Each probes the 81 pod pairs on both ports and both
// protocols, about 30 s a case here alone and up to 75 s beside CI's other packages.
const cyclonusSubset = "peer-ipblock"

// TestCyclonusSubset runs cyclonus' cases of cyclonusSubset (4) on two real nodes, in a
// budget of 7 minutes for cyclonus (the cluster's start not counted), and fails listing each
// case that did not pass with its probe matrix.
func TestCyclonusSubset(t *testing.T) {
	cs := runCyclonus(t, cyclonusRun{include: cyclonusSubset, budget: 7 * time.Minute})
	if n := len(cs.passed()); n != 4 {
		t.Errorf("%d cases passed; want the subset's 4", n)
	}
}

// TestCyclonus runs every case cyclonus generates by default but the SCTP ones (102 in
// v0.5.6) when RAMPART_CYCLONUS=full (scripts/conformance.sh --cyclonus): about an hour on a
// 2-core machine, too long for every change. RAMPART_CYCLONUS_TIMEOUT bounds the run
// (default 100m); RAMPART_CYCLONUS_INCLUDE runs only the cases of those tags and
// RAMPART_CYCLONUS_EXCLUDE leaves out those of these too (cyclonus tags, comma-separated).
func TestCyclonus(t *testing.T) {
	if os.Getenv("RAMPART_CYCLONUS") != "full" {
		t.Skip("the full cyclonus run takes about an hour; RAMPART_CYCLONUS=full runs it (scripts/conformance.sh --cyclonus)")
	}
	budget := 100 * time.Minute
	if d, err := time.ParseDuration(os.Getenv("RAMPART_CYCLONUS_TIMEOUT")); err == nil && d > 0 {
		budget = d
	}
	include, exclude := os.Getenv("RAMPART_CYCLONUS_INCLUDE"), os.Getenv("RAMPART_CYCLONUS_EXCLUDE")
	cs := runCyclonus(t, cyclonusRun{include: include, exclude: exclude, budget: budget})
	if include == "" && exclude == "" && len(cs.passed()) < 102 {
		t.Errorf("%d cases passed; want all 102 that are not SCTP", len(cs.passed()))
	}
}

// cyclonusRun is one run of cyclonus generate.
type cyclonusRun struct {
	include string        // tags of the cases to run; empty: all but cyclonusExclude
	exclude string        // tags of cases left out besides cyclonusExclude
	budget  time.Duration // for cyclonus, from its start to its summary
}

// runCyclonus starts a cluster of two real nodes with DNS (cyclonus probes its Services
// by name), tags the nodes' agnhost image with the tag cyclonus asks for, runs cyclonus
// generate, writes its output to the report directory (RAMPART_CONFORMANCE_REPORT_DIR,
// else a temporary one) as cyclonus.log, cyclonus-junit.xml and cyclonus-summary.txt, and
// fails the test listing each case that did not pass.
//
// cyclonus makes namespaces x, y and z, pods a, b and c in each serving TCP and UDP on
// ports 80 and 81, and Services for them; per case it removes every policy there, applies
// the case's, waits --perturbation-wait-seconds and probes every pod pair with `agnhost
// connect` run through the API's exec, comparing with the verdicts of its own model.
func runCyclonus(t *testing.T, r cyclonusRun) cyclonusCases {
	root := testenv.ModuleRoot(t)
	vers := k8stest.Versions(t, filepath.Join(root, "tools", "cyclonus", "versions.env"))
	bin := filepath.Join(k8stest.Cache(), "cyclonus-"+vers["CYCLONUS_VERSION"], "cyclonus")
	if _, err := os.Stat(bin); err != nil {
		testenv.SkipOrFail(t, "cyclonus missing (build with scripts/build-cyclonus.sh): %v", err)
	}
	report := os.Getenv("RAMPART_CONFORMANCE_REPORT_DIR")
	if report == "" {
		report = t.TempDir()
	} else if err := os.MkdirAll(report, 0o755); err != nil {
		t.Fatal(err)
	}

	c := nodetest.Start(t, nodetest.Options{Nodes: 2, DNS: true})
	// cyclonus asks for registry.k8s.io/e2e-test-images/agnhost:<its tag> with
	// IfNotPresent; the nodes have agnhost under upstream e2e's tag, and no registry.
	image := "registry.k8s.io/e2e-test-images/agnhost:" + vers["CYCLONUS_AGNHOST_TAG"]
	for _, n := range c.Nodes {
		if out, err := n.Exec(filepath.Join(c.Bins.Node, "ctr"), "--address", "/run/containerd/containerd.sock",
			"--namespace", "k8s.io", "images", "tag", "--force", c.Bins.AgnhostImage, image); err != nil {
			t.Fatalf("node %s: tagging %s as %s: %v\n%s", n.Name, c.Bins.AgnhostImage, image, err, out)
		}
	}

	args := []string{"generate",
		"--server-protocol=TCP,UDP", "--exclude=" + strings.Trim(cyclonusExclude+","+r.exclude, ","),
		// A pod reaching itself (through its own Service too) stays in its network
		// namespace, where no policy is judged; upstream's e2e ignores those pairs too.
		"--ignore-loopback=true",
		// A probe refused by policy waits this long; 2 s rather than 10 keeps a case of
		// 324 probes under a minute. A probe that disagrees is tried once more.
		"--job-timeout-seconds=2", "--retries=1",
		// Rampart enforces a policy in well under a second (docs/benchmarks.md); the
		// retry above covers a straggler.
		"--perturbation-wait-seconds=2",
		"--pod-creation-timeout-seconds=180",
		"--junit-results-file=" + filepath.Join(report, "cyclonus-junit.xml")}
	if r.include != "" {
		args = append(args, "--include="+r.include)
	}
	if d := os.Getenv("RAMPART_CYCLONUS_DESTINATION"); d != "" {
		args = append(args, "--destination-type="+d)
	}
	logPath := filepath.Join(report, "cyclonus.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()

	ctx, cancel := context.WithTimeout(context.Background(), r.budget)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = logFile
	began := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting cyclonus: %v", err)
	}
	p := &cyclonusParser{now: time.Now}
	copyErr := p.read(io.TeeReader(out, logFile))
	runErr := cmd.Wait()
	took := time.Since(began)
	if copyErr != nil {
		t.Errorf("reading cyclonus' output: %v", copyErr)
	}
	cs := p.cases
	if err := cs.applyJUnit(filepath.Join(report, "cyclonus-junit.xml")); err != nil && runErr == nil {
		t.Errorf("cyclonus finished but: %v", err)
	}

	summary := cs.summary(took)
	if err := os.WriteFile(filepath.Join(report, "cyclonus-summary.txt"), []byte(summary), 0o644); err != nil {
		t.Error(err)
	}
	t.Logf("results in %s:\n%s", report, summary)
	if len(cs) == 0 {
		t.Fatalf("cyclonus: %v; no case listed; %s ends:\n%s", runErr, logPath, controlplane.LogTail(logPath, 40))
	}
	for _, k := range cs {
		switch {
		case !k.done:
			t.Errorf("NOT RUN #%d %s", k.num, k.desc)
		case !k.passed:
			t.Errorf("FAILED #%d %s (%.1f s):\n%s", k.num, k.desc, k.seconds, strings.Join(k.diffs, "\n"))
		}
	}
	if runErr != nil {
		t.Errorf("cyclonus: %v (budget %v); %s ends:\n%s", runErr, r.budget, logPath, controlplane.LogTail(logPath, 20))
	}
	return cs
}

// cyclonusCase is one generated case as cyclonus' output tells it.
type cyclonusCase struct {
	num     int
	desc    string
	tags    string
	done    bool // cyclonus printed its result
	passed  bool // done, and no step's last probe round disagreed with the model
	seconds float64
	// wrong, ignored and correct add up the steps' last probe rounds.
	wrong, ignored, correct int
	// diffs are the steps that disagreed: the step's line and cyclonus' "actual vs
	// expected" matrix (a pair marked X got the other verdict than the model's).
	diffs []string
}

type cyclonusCases []*cyclonusCase

func (cs cyclonusCases) passed() cyclonusCases {
	var out cyclonusCases
	for _, k := range cs {
		if k.passed {
			out = append(out, k)
		}
	}
	return out
}

// cyclonusParser follows cyclonus generate's standard output (pkg/cli/generate.go and
// pkg/connectivity/printer.go of v0.5.6): "test #N: DESC" and " - tags: ..." list the
// cases first; then per case "starting test case #N", per step "step K ..." then "W wrong,
// I ignored, C correct" (after "Discrepancy found:" when W > 0, followed by the matrices,
// the last "Actual vs expected (last round):"), and "finished policy #N".
type cyclonusParser struct {
	now   func() time.Time
	cases cyclonusCases

	cur      *cyclonusCase
	started  time.Time
	step     string
	matrix   []string // lines of the "Actual vs expected" table being read
	inMatrix bool
}

func (p *cyclonusParser) read(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 4*1024*1024)
	for sc.Scan() {
		p.line(sc.Text())
	}
	return sc.Err()
}

func (p *cyclonusParser) byNum(n int) *cyclonusCase {
	for _, k := range p.cases {
		if k.num == n {
			return k
		}
	}
	k := &cyclonusCase{num: n}
	p.cases = append(p.cases, k)
	return k
}

func (p *cyclonusParser) line(l string) {
	if p.inMatrix {
		if strings.TrimSpace(l) != "" {
			p.matrix = append(p.matrix, l)
			return
		}
		if len(p.matrix) > 0 {
			p.inMatrix = false
			if p.cur != nil {
				p.cur.diffs = append(p.cur.diffs, p.step+"\n"+strings.Join(p.matrix, "\n"))
			}
		}
		return
	}
	var n, w, i, c int
	switch {
	case strings.HasPrefix(l, "test #"):
		num, desc, ok := strings.Cut(strings.TrimPrefix(l, "test #"), ": ")
		if v, err := strconv.Atoi(num); ok && err == nil {
			p.byNum(v).desc = desc
		}
	case strings.HasPrefix(l, " - tags: ") && len(p.cases) > 0 && p.cur == nil:
		p.cases[len(p.cases)-1].tags = strings.TrimPrefix(l, " - tags: ")
	case scan(l, "starting test case #%d", &n):
		p.cur, p.started = p.byNum(n), p.now()
	case strings.HasPrefix(l, "step "):
		p.step = l
	case scan(strings.TrimPrefix(l, "Discrepancy found:"), "%d wrong, %d ignored, %d correct", &w, &i, &c):
		if p.cur != nil {
			p.cur.wrong += w
			p.cur.ignored += i
			p.cur.correct += c
		}
	case strings.HasPrefix(l, "Actual vs expected (last round):"):
		p.inMatrix, p.matrix = true, nil
	case scan(l, "finished policy #%d", &n):
		if p.cur != nil && p.cur.num == n {
			p.cur.done = true
			p.cur.passed = p.cur.wrong == 0
			p.cur.seconds = p.now().Sub(p.started).Seconds()
		}
		p.cur = nil
	}
}

// scan is fmt.Sscanf that reports only whether every value was read.
func scan(s, format string, vals ...any) bool {
	n, err := fmt.Sscanf(s, format, vals...)
	return err == nil && n == len(vals)
}

// applyJUnit checks the cases against cyclonus' JUnit report, written at the end of the
// run, one test case per case in order: a case it reports failed is failed whatever the
// output said.
func (cs cyclonusCases) applyJUnit(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var suite struct {
		Cases []struct {
			Name    string    `xml:"name,attr"`
			Failure *struct{} `xml:"failure"`
		} `xml:"testcase"`
	}
	if err := xml.Unmarshal(b, &suite); err != nil {
		return fmt.Errorf("parsing %s: %w", path, err)
	}
	var done cyclonusCases
	for _, k := range cs {
		if k.done {
			done = append(done, k)
		}
	}
	if len(suite.Cases) != len(done) {
		return fmt.Errorf("%s lists %d cases, the output %d finished", path, len(suite.Cases), len(done))
	}
	for i, j := range suite.Cases {
		if j.Name != done[i].desc {
			return fmt.Errorf("%s: case %d is %q, the output's %q", path, i+1, j.Name, done[i].desc)
		}
		if j.Failure != nil && done[i].passed {
			done[i].passed = false
			done[i].diffs = append(done[i].diffs, "failed in the JUnit report")
		}
	}
	return nil
}

// summary is one line per case (result, seconds, number, description, tags), then the
// counts and cyclonus' wall time.
func (cs cyclonusCases) summary(took time.Duration) string {
	var b strings.Builder
	var failed, notRun, wrong int
	for _, k := range cs {
		status := "passed"
		switch {
		case !k.done:
			status = "not-run"
			notRun++
		case !k.passed:
			status = "failed"
			failed++
		}
		wrong += k.wrong
		fmt.Fprintf(&b, "%-8s %6.1fs  #%d %s [%s]", status, k.seconds, k.num, k.desc, k.tags)
		if k.wrong > 0 {
			fmt.Fprintf(&b, " (%d probes wrong)", k.wrong)
		}
		b.WriteString("\n")
	}
	fmt.Fprintf(&b, "passed %d, failed %d, not run %d; cyclonus ran %v\n",
		len(cs.passed()), failed, notRun, took.Round(time.Second))
	return b.String()
}

// TestCyclonusParser checks the parser on output in cyclonus v0.5.6's shape: a case that
// passed, one whose step disagreed (its matrix kept), one cut off before its result.
func TestCyclonusParser(t *testing.T) {
	out := `testing 3 cases

test #1: set namespace to x
 - tags: target, target-namespace
test #2: ipblock with except
 - tags: direction, egress, ip-block-with-except, peer-ipblock
test #3: egress: deny all
 - tags: deny-all, direction, egress, rule
starting test case #1
evaluating test case: set namespace to x
step 1 on port 80, protocol TCP:
0 wrong, 9 ignored, 72 correct
finished policy #1
starting test case #2
evaluating test case: ipblock with except
step 1 on all available ports/protocols:
Discrepancy found:1 wrong, 9 ignored, 71 correct
Actual vs expected (last round):
+-----+-----+-----+
|     | X/A | X/B |
| x/a | .   | X   |
+-----+-----+-----+

finished policy #2
starting test case #3
`
	now := time.Unix(0, 0)
	p := &cyclonusParser{now: func() time.Time { now = now.Add(time.Second); return now }}
	if err := p.read(strings.NewReader(out)); err != nil {
		t.Fatal(err)
	}
	cs := p.cases
	if len(cs) != 3 {
		t.Fatalf("%d cases, want 3", len(cs))
	}
	if k := cs[0]; !k.done || !k.passed || k.correct != 72 || k.ignored != 9 || k.tags != "target, target-namespace" || k.seconds != 1 {
		t.Errorf("case 1: %+v, want passed, 72 correct, 9 ignored, its tags, 1 s", *k)
	}
	if k := cs[1]; !k.done || k.passed || k.wrong != 1 || len(k.diffs) != 1 ||
		!strings.HasPrefix(k.diffs[0], "step 1 on all available") || !strings.Contains(k.diffs[0], "| x/a | .   | X   |") {
		t.Errorf("case 2: %+v, want failed with 1 wrong and its matrix", *k)
	}
	if k := cs[2]; k.done || k.desc != "egress: deny all" {
		t.Errorf("case 3: %+v, want not done", *k)
	}
	if got := len(cs.passed()); got != 1 {
		t.Errorf("%d passed, want 1", got)
	}
	if s := cs.summary(time.Minute); !strings.Contains(s, "passed 1, failed 1, not run 1; cyclonus ran 1m0s") {
		t.Errorf("summary:\n%s", s)
	}
}

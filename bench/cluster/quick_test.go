package cluster

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/nodetest"
)

// TestQuickRun runs the benchmark command in quick mode on simulated nodes
// (--control-plane k8s: a pod runner in place of kubelet and containerd), as CI's smoke
// test of every experiment and mode, and checks
// that every experiment produced numbers for every mode the agent accepts (a mode it
// refuses is reported as not available, with the reason), that the fragmenting UDP
// datagrams crossed the nodes, that the enforcement checks passed, and that the run left
// nothing behind. It asserts no speed: targets belong in the benchmark's output.
func TestQuickRun(t *testing.T) {
	benchkit.RequireQuickRun(t, "builds three binaries and runs the benchmark for about a minute", "iperf3", "nsenter", "taskset", "ip", "go")
	// Where scripts/build-k8s.sh keeps the control plane (CI builds it before the tests).
	dirOut, err := exec.Command("bash", "../../scripts/build-k8s.sh", "--dir").Output()
	if err != nil {
		t.Fatalf("scripts/build-k8s.sh --dir: %v", err)
	}
	k8sBin := strings.TrimSpace(string(dirOut))
	if _, err := os.Stat(filepath.Join(k8sBin, "kube-apiserver")); err != nil {
		testenv.SkipOrFail(t, "control plane not built (scripts/build-k8s.sh): %v", err)
	}
	q := benchkit.BuildQuickRun(t, 8*time.Minute, "clusterbench", "./cmd/rampart-cni", "./test/rampart-podrunner")
	out := q.Out
	stdout, _ := benchkit.RunForTest(t, q.Ctx, q.Bin, "--quick", "--control-plane", "k8s", "--bin-dir", q.Dir, "--k8s-bin-dir", k8sBin, "--out", out)
	if !strings.Contains(stdout, "## Published") {
		t.Error("no table printed")
	}
	var rep Report
	benchkit.ReadReportForTest(t, out, "cluster", &rep)
	if rep.Schema != Schema || !rep.Settings.Quick || rep.Incomplete || len(rep.Errors) > 0 || rep.Settings.Control != ControlK8s {
		t.Fatalf("schema %q, quick %v, incomplete %v, errors %v, control plane %q", rep.Schema, rep.Settings.Quick, rep.Incomplete, rep.Errors, rep.Settings.Control)
	}

	available := map[string]bool{}
	for _, m := range rep.Modes {
		available[m.Name] = m.Available
		if !m.Available && (m.Name == "native" || m.Name == "vxlan" || !strings.Contains(m.Reason, "tunnel")) {
			t.Errorf("mode %s not available: %q", m.Name, m.Reason)
		}
	}
	for _, m := range rep.Settings.Modes {
		if _, ok := available[m]; !ok {
			t.Errorf("mode %s not reported", m)
		}
	}

	// Pods: every available mode, traffic, policy variant and pair count has a sample.
	if rep.Pods == nil || len(rep.Pods.Errors) > 0 {
		t.Fatalf("pods: %+v", rep.Pods)
	}
	want := 0
	for _, m := range rep.Settings.Modes {
		if available[m] {
			want += len(rep.Settings.Pairs) * len(rep.Settings.Traffic) * 2
		}
	}
	if len(rep.Pods.Samples) != want || len(rep.Pods.Summary) != want {
		t.Errorf("pods: %d samples and %d summaries, want %d", len(rep.Pods.Samples), len(rep.Pods.Summary), want)
	}
	for _, s := range rep.Pods.Samples {
		if len(s.PairBps) != s.Pairs || s.Bps <= 0 {
			t.Errorf("pods sample without numbers: %+v", s)
		}
		for _, p := range s.PairBps {
			if p <= 0 {
				t.Errorf("pods %s %s %d pairs: a pair carried nothing: %v", s.Mode, s.Traffic, s.Pairs, s.PairBps)
			}
		}
		// 8000-byte datagrams fragment at every pod MTU, and pass with the policy.
		if s.Traffic == "udp-8000" && !s.Fragments {
			t.Errorf("pods %s udp-8000 not marked as fragmenting", s.Mode)
		}
	}
	for _, s := range rep.Pods.Summary {
		if !s.Ratio.Valid() || s.Ratio <= 0 {
			t.Errorf("pods summary without a ratio: %+v", s)
		}
	}

	// Overlay: the fabric, native twice and every available tunnel, measured.
	if rep.Overlay == nil {
		t.Fatal("no overlay result")
	}
	for _, c := range rep.Overlay.Cases {
		if !c.Available {
			if available[c.Mode] || c.Mode == "" || c.Mode == "native" {
				t.Errorf("overlay %s not measured: %s", c.Name, c.Reason)
			}
			continue
		}
		if len(c.Errors) > 0 || len(c.Samples) != rep.Settings.Repeats || !c.Summary.VsNativeBps.Valid() ||
			!c.Summary.VsFabricTPS.Valid() || c.Summary.P50Us <= 0 {
			t.Errorf("overlay %s: errors %v, %d samples, summary %+v", c.Name, c.Errors, len(c.Samples), c.Summary)
		}
	}

	// Policies: each count enforced (entries in the map, probes) before it was measured.
	if rep.Policies == nil || len(rep.Policies.Cases) != 2+len(rep.Settings.PolicyCounts) {
		t.Fatalf("policies: %+v", rep.Policies)
	}
	for i, c := range rep.Policies.Cases {
		wantSamples := rep.Settings.Repeats
		if i == 0 {
			wantSamples *= len(rep.Policies.Cases) - 1
		}
		if len(c.Errors) > 0 || len(c.Samples) != wantSamples || c.Summary.Verdict == VerdictInvalid {
			t.Errorf("policies %s: errors %v, %d samples (want %d), verdict %s", c.Name, c.Errors, len(c.Samples), wantSamples, c.Summary.Verdict)
			continue
		}
		for _, s := range c.Samples {
			if c.Policies > 0 && (s.MapEntries < c.Policies+1 || s.EnforcedSeconds <= 0 || s.Probes["5203"] != "timeout" || s.Probes["5202"] != "connected") {
				t.Errorf("policies %s: %d entries, enforced %.3f s, probes %v", c.Name, s.MapEntries, s.EnforcedSeconds, s.Probes)
			}
			if c.Policies == 0 && s.Probes["5203"] != "refused" {
				t.Errorf("policies %s: probes %v, want the closed port refused", c.Name, s.Probes)
			}
		}
	}

	// Nothing left behind: namespaces and pins carry the run's prefix.
	if rep.Settings.Prefix == "" {
		t.Fatal("no prefix reported")
	}
	benchkit.CheckLeftBehindForTest(t, []string{rep.Settings.Prefix}, filepath.Join("/sys/fs/bpf/rampart", rep.Settings.Prefix+"*"))
}

// TestQuickRunRealNodes runs every experiment on real nodes (--control-plane nodes:
// kubelet, containerd and kube-proxy per node, pods made by the kubelet), small and short,
// with one tunnel mode: three clusters live at once (VXLAN, native routing and its A/A
// control), each in a lab slot of the host. Every pair carried traffic, with and without
// the allow policy; every overlay path was measured; each policy count was enforced
// (entries in the map, probes) before it was measured; the labs left no host link. It
// asserts no speed.
func TestQuickRunRealNodes(t *testing.T) {
	benchkit.RequireQuickRun(t, "starts three clusters of two real nodes and runs the benchmark for a few minutes", "iperf3", "nsenter", "taskset", "ip", "go")
	nodetest.FindBins(t, false)
	dir := t.TempDir()
	// A few minutes, plus the wait for slots other real-node tests hold.
	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Minute)
	defer cancel()
	benchkit.BuildForTest(t, ctx, "..", dir, "./cmd/clusterbench")
	out := filepath.Join(dir, "results")
	benchkit.RunForTest(t, ctx, filepath.Join(dir, "clusterbench"), "--quick",
		"--modes", "vxlan", "--policy-tunnel", "vxlan", "--traffic", "tcp",
		"--policies", "1,100", "--out", out)
	var rep Report
	benchkit.ReadReportForTest(t, out, "cluster", &rep)
	if rep.Incomplete || len(rep.Errors) > 0 || rep.Settings.Control != ControlNodes {
		t.Fatalf("incomplete %v, errors %v, control plane %q", rep.Incomplete, rep.Errors, rep.Settings.Control)
	}
	if rep.Pods == nil || len(rep.Pods.Errors) > 0 || len(rep.Pods.Samples) != len(rep.Settings.Pairs)*2 {
		t.Fatalf("pods: %+v", rep.Pods)
	}
	for _, s := range rep.Pods.Samples {
		for _, p := range s.PairBps {
			if len(s.PairBps) != s.Pairs || p <= 0 {
				t.Errorf("pods %s %s %d pairs: a pair carried nothing: %v", s.Mode, s.Traffic, s.Pairs, s.PairBps)
			}
		}
	}
	if rep.Overlay == nil {
		t.Fatal("no overlay result")
	}
	for _, c := range rep.Overlay.Cases {
		if !c.Available {
			if c.Mode == "vxlan" || c.Mode == "native" || c.Mode == "" {
				t.Errorf("overlay %s not measured: %s", c.Name, c.Reason)
			}
			continue
		}
		if len(c.Errors) > 0 || len(c.Samples) != rep.Settings.Repeats || !c.Summary.VsNativeBps.Valid() {
			t.Errorf("overlay %s: errors %v, %d samples, summary %+v", c.Name, c.Errors, len(c.Samples), c.Summary)
		}
	}
	if rep.Policies == nil || len(rep.Policies.Cases) != 2+len(rep.Settings.PolicyCounts) {
		t.Fatalf("policies: %+v", rep.Policies)
	}
	for _, c := range rep.Policies.Cases {
		if len(c.Errors) > 0 || c.Summary.Verdict == VerdictInvalid {
			t.Errorf("policies %s: errors %v, verdict %s", c.Name, c.Errors, c.Summary.Verdict)
		}
		for _, s := range c.Samples {
			if c.Policies > 0 && (s.MapEntries < c.Policies+1 || s.EnforcedSeconds <= 0 || s.Probes["5203"] != "timeout" || s.Probes["5202"] != "connected") {
				t.Errorf("policies %s: %d entries, enforced %.3f s, probes %v", c.Name, s.MapEntries, s.EnforcedSeconds, s.Probes)
			}
		}
	}
	if links, err := nodetest.LeftoverHostLinks(); err != nil || len(links) > 0 {
		t.Errorf("the real nodes' host links left behind: %v (%v)", links, err)
	}
}

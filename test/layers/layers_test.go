// Package layers checks the import rules of docs/architecture.md ("Layers"): the pure core
// (policy, labels, identity, map state, the L7 plan and tables, the flow vocabulary) is
// plain Go that can be read, changed and tested without a kernel, Envoy, an API server or
// root. A pure package that reaches the kernel edge, Envoy, gRPC or the Kubernetes client,
// even through another package, fails the test, which names the chain of imports that
// leads there.
package layers

import (
	"bufio"
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/testenv"
)

const module = "github.com/rampartnet/rampart"

// pure are the packages of the pure core.
var pure = []string{
	"internal/labels",
	"internal/fqdn",
	"internal/tap",
	"internal/policy",
	"internal/identity",
	"internal/mapstate",
	"internal/l7plan",
	"internal/l7table",
	"internal/flow",
	"internal/tappolicy",
	"internal/service",
	"internal/podaddr",
	"internal/suggest",
}

// forbiddenPrefixes are the import paths a pure package must not depend on: the kernel
// (BPF, netlink, raw system calls), Envoy, gRPC and the Kubernetes client.
var forbiddenPrefixes = []string{
	"k8s.io/client-go",
	"github.com/cilium/ebpf",
	"github.com/vishvananda/netlink",
	"golang.org/x/sys/unix",
	"github.com/envoyproxy/",
	"google.golang.org/grpc",
}

// forbiddenInternal are the project's kernel-edge and agent packages (with their
// subpackages).
var forbiddenInternal = []string{
	"internal/datapath",
	"internal/proxy",
	"internal/endpoint",
	"internal/agent",
	"internal/api",
	"internal/cli",
	"internal/netns",
	"internal/cidrtable",
	"internal/sockverdict",
	"internal/overlay",
	"internal/monitor",
}

func forbidden(path string) bool {
	for _, p := range forbiddenPrefixes {
		if path == strings.TrimSuffix(p, "/") || strings.HasPrefix(path, strings.TrimSuffix(p, "/")+"/") {
			return true
		}
	}
	for _, p := range forbiddenInternal {
		p = module + "/" + p
		if path == p || strings.HasPrefix(path, p+"/") {
			return true
		}
	}
	return false
}

// importGraph runs go list -deps on pkgs and returns every package's direct imports.
func importGraph(t *testing.T, pkgs ...string) map[string][]string {
	t.Helper()
	args := []string{"list", "-deps", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}"}
	for _, p := range pkgs {
		args = append(args, module+"/"+p)
	}
	cmd := exec.Command(testenv.GoTool(), args...)
	cmd.Dir = testenv.ModuleRoot(t)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, stderr.Bytes())
	}
	g := map[string][]string{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) > 0 {
			g[f[0]] = f[1:]
		}
	}
	return g
}

// violations returns, for each forbidden package that root reaches without going through
// another forbidden package, the shortest chain of imports from root to it.
func violations(g map[string][]string, root string) [][]string {
	prev := map[string]string{root: ""}
	queue := []string{root}
	var found [][]string
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p != root && forbidden(p) {
			var chain []string
			for q := p; q != ""; q = prev[q] {
				chain = append(chain, q)
			}
			slices.Reverse(chain)
			found = append(found, chain)
			continue // what it imports in turn is its own business
		}
		imports := slices.Clone(g[p])
		slices.Sort(imports)
		for _, q := range imports {
			if _, seen := prev[q]; !seen {
				prev[q] = p
				queue = append(queue, q)
			}
		}
	}
	return found
}

func short(chain []string) string {
	out := make([]string, len(chain))
	for i, p := range chain {
		out[i] = strings.TrimPrefix(p, module+"/")
	}
	return strings.Join(out, " -> ")
}

func TestPureCoreImports(t *testing.T) {
	g := importGraph(t, pure...)
	for _, p := range pure {
		root := module + "/" + p
		if _, ok := g[root]; !ok {
			t.Errorf("%s: not in go list's output", p)
			continue
		}
		for _, chain := range violations(g, root) {
			t.Errorf("%s must stay pure, but reaches %s: %s", p, short(chain[len(chain)-1:]), short(chain))
		}
	}
}

// The check itself finds what it looks for: the proxy (Envoy, gRPC) and the agent (the
// whole kernel edge) are reported, with chains that start at the package and follow real
// imports.
func TestImpurePackagesAreReported(t *testing.T) {
	for _, tc := range []struct {
		pkg  string
		want string // a forbidden package among those reported
	}{
		{"internal/proxy", "github.com/envoyproxy/go-control-plane"},
		{"internal/agent", module + "/internal/datapath"},
		{"internal/k8s/identities", "k8s.io/client-go"},
	} {
		root := module + "/" + tc.pkg
		g := importGraph(t, tc.pkg)
		found := violations(g, root)
		hit := false
		for _, chain := range found {
			if chain[0] != root {
				t.Errorf("%s: chain %s does not start at the package", tc.pkg, short(chain))
			}
			for i := 1; i < len(chain); i++ {
				if !slices.Contains(g[chain[i-1]], chain[i]) {
					t.Errorf("%s: chain %s: %s does not import %s", tc.pkg, short(chain), chain[i-1], chain[i])
				}
			}
			if strings.HasPrefix(chain[len(chain)-1], tc.want) {
				hit = true
			}
		}
		if !hit {
			t.Errorf("%s: want a chain to %s, found %s", tc.pkg, tc.want, fmt.Sprint(found))
		}
	}
}

// layers ranks every package of the module, from the bottom (docs/architecture.md,
// "Layers"). A package may import only packages of a lower rank: the ranks are the drawing
// in the docs, and a new package must be given one before it builds a test run green.
var layers = []struct {
	name string
	pkgs []string
}{
	{"manifests", []string{"deploy"}},
	{"leaves", []string{"internal/version", "internal/labels", "internal/fqdn", "internal/netns", "internal/podaddr", "internal/proxy/http1", "internal/testenv/alloc", "internal/testenv/promtest", "internal/cidrtable/cidrtest", "internal/testenv/controlplane", "internal/k8s/crds", "internal/cniinstall", "internal/hubble/flowpb", "internal/hubble/relaypb", "examples/marketplace"}},
	{"core: tap contracts, Services", []string{"internal/tap", "internal/service"}},
	{"core: policy, identities", []string{"internal/policy", "internal/identity", "internal/testenv", "internal/labels/labelstest"}},
	{"core: map state, flow vocabulary", []string{"internal/mapstate", "internal/flow"}},
	{"core: L7 plan, tap policy, suggested policy", []string{"internal/l7plan", "internal/tappolicy", "internal/suggest"}},
	{"core: send-side tables", []string{"internal/l7table", "internal/l7plan/l7plantest"}},
	{"kernel edge and proxy", []string{"internal/datapath", "internal/cidrtable", "internal/sockverdict", "internal/endpoint", "internal/proxy", "internal/dnsproxy", "internal/overlay", "internal/testenv/k8stest", "internal/testenv/browser", "internal/k8s/identities", "internal/testenv/podrunner", "internal/monitor/suricata"}},
	{"API contract", []string{"internal/api", "internal/hubble/observerpb"}},
	{"agent subsystems", []string{"internal/agent/taps"}},
	{"agent; CLI input parsers; monitor alert join; Hubble, metrics and service map servers", []string{"internal/agent", "internal/cidrlist", "internal/monitor/join", "internal/hubble", "internal/metrics", "internal/servicemap", "internal/relay"}},
	{"CLI; Kubernetes watcher; simulated cluster", []string{"internal/cli", "internal/k8s/watcher", "internal/testenv/simcluster"}},
	{"binaries and test harness", []string{"cmd/rampartd", "cmd/rampart", "cmd/rampart-cni", "test/rampart-podrunner", "internal/testenv/agenttest", "internal/testenv/clustertest"}},
	{"real-node harness", []string{"internal/testenv/nodetest"}},
	{"tests and examples", []string{"test/...", "examples/...", "internal/flow/internal/gen"}},
}

// rankOf returns the rank of module package p (its path without the module prefix), or -1.
func rankOf(p string) int {
	for i, l := range layers {
		for _, q := range l.pkgs {
			if q == p || strings.HasSuffix(q, "/...") && strings.HasPrefix(p, strings.TrimSuffix(q, "...")) {
				return i
			}
		}
	}
	return -1
}

// listModule runs go list ./... in dir (relative to the repository's root) and returns
// one line per package: its import path, then its imports (not its tests').
func listModule(t *testing.T, dir string) []string {
	t.Helper()
	cmd := exec.Command(testenv.GoTool(), "list", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", "./...")
	cmd.Dir = filepath.Join(testenv.ModuleRoot(t), dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list ./... in %s: %v\n%s", dir, err, stderr.Bytes())
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// TestLayers checks the product module and the examples module (examples/go.mod), whose
// packages import the product's.
func TestLayers(t *testing.T) {
	lines := listModule(t, ".")
	if len(lines) < 20 {
		t.Fatalf("go list ./... listed %d packages; want the whole module", len(lines))
	}
	lines = append(lines, listModule(t, "examples")...)
	for _, v := range layerViolations(lines) {
		t.Error(v)
	}
}

// layerViolations checks go list lines ("package import import ...") against layers.
func layerViolations(lines []string) []string {
	var out []string
	for _, line := range lines {
		f := strings.Fields(line)
		p := strings.TrimPrefix(f[0], module+"/")
		r := rankOf(p)
		if r < 0 {
			out = append(out, fmt.Sprintf("%s has no layer: give it one in this file and in docs/architecture.md", p))
			continue
		}
		for _, imp := range f[1:] {
			q, ok := strings.CutPrefix(imp, module+"/")
			if !ok {
				continue
			}
			if rq := rankOf(q); rq >= r {
				out = append(out, fmt.Sprintf("%s (%s) imports %s (%s): a package may import only layers below its own", p, layers[r].name, q, layerName(rq)))
			}
		}
	}
	return out
}

func layerName(r int) string {
	if r < 0 {
		return "no layer"
	}
	return layers[r].name
}

// labOnly are what exists for tests, demos and benchmarks: the product (productPackage)
// imports none of them outside its _test.go files.
var labOnly = []string{"internal/testenv", "examples", "test", "bench"}

// productPackage tells whether p (a path without the module prefix) is the product's: the
// commands and the internal packages but the test helpers.
func productPackage(p string) bool {
	under := func(dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }
	return (under("cmd") || under("internal")) && !under("internal/testenv")
}

// labImports checks go list lines ("package import import ...", the imports of the
// package's non-test files) for product packages that import a lab-only one.
func labImports(lines []string) []string {
	var out []string
	for _, line := range lines {
		f := strings.Fields(line)
		p := strings.TrimPrefix(f[0], module+"/")
		if !productPackage(p) {
			continue
		}
		for _, imp := range f[1:] {
			q, ok := strings.CutPrefix(imp, module+"/")
			if !ok {
				continue
			}
			for _, l := range labOnly {
				if q == l || strings.HasPrefix(q, l+"/") {
					out = append(out, fmt.Sprintf("%s imports %s: the product may import test helpers, examples and benchmarks only in _test.go files", p, q))
				}
			}
		}
	}
	return out
}

// TestProductImportsNoLab: no command or internal package outside internal/testenv imports
// internal/testenv/..., examples/..., test/... or bench/... in its non-test files.
func TestProductImportsNoLab(t *testing.T) {
	lines := listModule(t, ".")
	if len(lines) < 20 {
		t.Fatalf("go list ./... listed %d packages; want the whole module", len(lines))
	}
	for _, v := range labImports(lines) {
		t.Error(v)
	}
}

// The check reports a command or an internal package importing a test helper or an
// example, and passes the helpers' own imports and the tests'.
func TestLabImportsReported(t *testing.T) {
	m := module + "/"
	got := labImports([]string{
		m + "cmd/rampartd " + m + "internal/agent " + m + "internal/testenv",
		m + "internal/agent " + m + "internal/testenv/controlplane fmt",
		m + "internal/cli " + m + "examples/marketplace",
		m + "internal/testenv/nodetest " + m + "internal/testenv/controlplane",
		m + "test/cluster " + m + "internal/testenv/nodetest",
		m + "internal/testenvx " + m + "internal/api",
	})
	wantReports(t, got, "cmd/rampartd imports internal/testenv:", "internal/agent imports internal/testenv/controlplane:", "internal/cli imports examples/marketplace:")
}

// wantReports checks that a check's reports start with want's, in order.
func wantReports(t *testing.T, got []string, want ...string) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d reports %q, want %d", len(got), got, len(want))
	}
	for i := range want {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("report %d: %q, want it to start with %q", i, got[i], want[i])
		}
	}
}

// The check reports an upward import, an import within a layer and a package without a
// layer, and passes a downward import.
func TestLayerViolationsReported(t *testing.T) {
	m := module + "/"
	got := layerViolations([]string{
		m + "internal/agent " + m + "internal/datapath fmt",
		m + "internal/datapath " + m + "internal/agent",
		m + "internal/proxy " + m + "internal/endpoint",
		m + "internal/newthing fmt",
	})
	wantReports(t, got, "internal/datapath (kernel edge and proxy) imports internal/agent", "internal/proxy (kernel edge and proxy) imports internal/endpoint", "internal/newthing has no layer")
}

package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/testenv/agenttest"
)

// manifestDir writes files (name -> content) into a new directory.
func manifestDir(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func renamed(name string) string { return strings.Replace(allowXAtoB, "allow-x-a", name, 1) }

// apply -f DIR refuses two files that give the same object (which would win is an
// accident of file order), naming both; delete -f DIR deletes what exists, names what
// does not with its file, and exits non-zero.
func TestApplyDeleteDirectory(t *testing.T) {
	e := agenttest.StartAgent(t, agenttest.Options{NoServers: true})
	dup := manifestDir(t, map[string]string{
		"a.yaml": renamed("p1"),
		"b.yaml": strings.Replace(renamed("p1"), "port: 80", "port: 81", 1),
	})
	out, stderr, code := e.CLI("apply", "-f", dup)
	if code == 0 || !strings.Contains(stderr, filepath.Join(dup, "a.yaml")) || !strings.Contains(stderr, filepath.Join(dup, "b.yaml")) || !strings.Contains(stderr, `"p1"`) {
		t.Fatalf("apply of a directory giving p1 twice: exit %d\n%s%s", code, out, stderr)
	}
	if got := e.MustCLI("get", "policies"); strings.Contains(got, "p1") {
		t.Fatalf("a refused apply stored a policy:\n%s", got)
	}

	e.MustCLI("apply", "-f", manifestDir(t, map[string]string{"a.yaml": renamed("p1"), "b.yaml": renamed("p2")}))
	del := manifestDir(t, map[string]string{"a.yaml": renamed("p1"), "c.yaml": renamed("p3")})
	out, stderr, code = e.CLI("delete", "-f", del)
	if code == 0 || !strings.Contains(out, "networkpolicy/p1 deleted") ||
		!strings.Contains(stderr, "networkpolicy/p3 (namespace y) (in "+filepath.Join(del, "c.yaml")) {
		t.Fatalf("delete with p3 missing: exit %d\n%s%s", code, out, stderr)
	}
	if got := e.MustCLI("get", "policies"); strings.Contains(got, "p1") || !strings.Contains(got, "p2") {
		t.Fatalf("after the delete:\n%s", got)
	}
	// --ignore-not-found: the same report, exit 0.
	if out, stderr, code := e.CLI("delete", "--ignore-not-found", "-f", del); code != 0 || !strings.Contains(out, "networkpolicy/p1 not found") {
		t.Fatalf("delete --ignore-not-found: exit %d\n%s%s", code, out, stderr)
	}
}

// apply --dry-run checks manifests with the agent's parser and rules, with no agent: it
// lists what it would apply, and fails naming the file and field, or both files of an
// object given twice.
func TestApplyDryRunWithoutAgent(t *testing.T) {
	noAgent := []string{"--socket", filepath.Join(t.TempDir(), "none.sock"), "apply", "--dry-run"}
	good := manifestDir(t, map[string]string{"a.yaml": renamed("p1"), "b.yaml": renamed("p2")})
	out, stderr, code := rampart(append(noAgent, "-f", good)...)
	if code != 0 || !strings.Contains(out, "networkpolicy/p1 (namespace y) valid ("+filepath.Join(good, "a.yaml")+": document 1)") ||
		!strings.Contains(out, "networkpolicy/p2 (namespace y) valid") || !strings.Contains(out, "2 objects checked, nothing applied") {
		t.Fatalf("dry run of valid manifests: exit %d\n%s%s", code, out, stderr)
	}
	bad := writeFile(t, "bad.yaml", strings.Replace(allowXAtoB, "policyTypes:", "policyTypez:", 1))
	if out, stderr, code := rampart(append(noAgent, "-f", bad)...); code == 0 || !strings.Contains(stderr, bad+": document 1") || !strings.Contains(stderr, "spec.policyTypez") {
		t.Fatalf("dry run of a bad manifest: exit %d\n%s%s", code, out, stderr)
	}
	dup := manifestDir(t, map[string]string{"a.yaml": renamed("p1"), "b.yaml": renamed("p1")})
	if out, stderr, code := rampart(append(noAgent, "-f", dup)...); code == 0 || !strings.Contains(stderr, filepath.Join(dup, "a.yaml")) || !strings.Contains(stderr, filepath.Join(dup, "b.yaml")) {
		t.Fatalf("dry run of an object given twice: exit %d\n%s%s", code, out, stderr)
	}
}

package nodetest

import (
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
)

// BuildImage builds (or finds, for a clean tree) the image of this tree with
// scripts/build-image.sh and returns the archive and its versioned reference (the archive
// also holds rampart.io/rampart:latest, deploy/'s). Skipped (failed when CI=true) without
// Envoy, which the image carries.
func BuildImage(t testing.TB) (archive, ref string) {
	t.Helper()
	root := testenv.ModuleRoot(t)
	return buildImageIn(t, root)
}

// BuildImageOf builds (or finds) the image of an earlier commit of this repository, the
// release a user upgrades from: the commit is checked out in a shared clone of the
// repository (the working tree is left alone) and built by its own
// scripts/build-image.sh, so the archive holds that commit's binaries. A clean commit's
// archive is cached by version, as the tree's is. Fails when the commit is not in the
// repository's history (a shallow clone).
func BuildImageOf(t testing.TB, commit string) (archive, ref string) {
	t.Helper()
	root := testenv.ModuleRoot(t)
	if out, err := exec.Command("git", "-C", root, "cat-file", "-e", commit+"^{commit}").CombinedOutput(); err != nil {
		t.Fatalf("commit %s is not in this repository's history (a shallow clone?): %v %s", commit, err, out)
	}
	tree := filepath.Join(t.TempDir(), "tree")
	for _, args := range [][]string{
		{"clone", "-q", "--shared", "--no-checkout", root, tree},
		{"-C", tree, "-c", "advice.detachedHead=false", "checkout", "-q", commit},
	} {
		if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
			t.Fatalf("git %s: %v %s", strings.Join(args, " "), err, out)
		}
	}
	return buildImageIn(t, tree)
}

// buildImageIn runs the scripts/build-image.sh of the tree at root.
func buildImageIn(t testing.TB, root string) (archive, ref string) {
	t.Helper()
	if out, err := exec.Command("python3", "-c", "import envoy").CombinedOutput(); err != nil {
		testenv.SkipOrFail(t, "no Envoy for the image (scripts/setup.sh installs it): %v %s", err, out)
	}
	cmd := exec.Command("bash", filepath.Join(root, "scripts", "build-image.sh"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "PATH=/usr/local/go/bin:"+os.Getenv("PATH"))
	cmd.Stderr = t.Output()
	began := time.Now()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s/scripts/build-image.sh: %v", root, err)
	}
	archive = strings.TrimSpace(string(out))
	t.Logf("image %s in %v", archive, time.Since(began).Round(100*time.Millisecond))
	// The archive's own version (rampart-<version>.tar), not the tree's now: a commit
	// while the image builds would name a tag the archive does not hold.
	version, ok := strings.CutPrefix(strings.TrimSuffix(filepath.Base(archive), ".tar"), "rampart-")
	if !ok {
		t.Fatalf("scripts/build-image.sh made %s, want rampart-<version>.tar", archive)
	}
	return archive, "rampart.io/rampart:" + version
}

// DeployManifests copies deploy/ into a temporary directory with its ConfigMap edited as
// a user edits it for this cluster: the agents reach the API server at its address (there
// is no kube-proxy route to the kubernetes Service before a CNI exists) and attach the
// Service translation to an empty cgroup of the lab's (kube-proxy serves the pods'
// Services; the host's sockets stay as they are). settings are more of the ConfigMap's
// keys to set (tunnel: vxlan, ...).
func (c *Cluster) DeployManifests(settings map[string]string) string {
	t := c.T
	t.Helper()
	root := testenv.ModuleRoot(t)
	dir := t.TempDir()
	src := filepath.Join(root, "deploy")
	err := filepath.WalkDir(src, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, path)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dir, rel), 0o755)
		}
		if !strings.HasSuffix(path, ".yaml") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dir, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(c.Server)
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "config.yaml")
	b, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	edits := [][2]string{
		{`service-cgroup: ""`, "service-cgroup: " + testenv.NewCgroup(t)},
		{"# k8s-service-host: 10.0.0.1", "k8s-service-host: " + u.Hostname()},
		{`# k8s-service-port: "6443"`, fmt.Sprintf("k8s-service-port: %q", u.Port())},
	}
	for k, v := range settings {
		line, ok := configLine(s, k)
		if !ok {
			t.Fatalf("deploy/config.yaml has no key %q", k)
		}
		edits = append(edits, [2]string{line, fmt.Sprintf("  %s: %q", k, v)})
	}
	for _, r := range edits {
		if !strings.Contains(s, r[0]) {
			t.Fatalf("deploy/config.yaml has no %q to edit", r[0])
		}
		s = strings.Replace(s, r[0], r[1], 1)
	}
	if err := os.WriteFile(cfg, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// configLine finds the ConfigMap's line of key in deploy/config.yaml.
func configLine(s, key string) (string, bool) {
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, "  "+key+": ") {
			return l, true
		}
	}
	return "", false
}

// InstallRampart installs Rampart as a user does, on a cluster started WithoutAgents
// whose nodes hold its image (Options.Images, BuildImage's archive): `kubectl apply -R -f`
// of DeployManifests(settings), then it waits until every node is Ready, which the agent
// pods make them once they have installed the CNI, and for a cluster with DNS until the
// cluster DNS answers. It returns how long the nodes took to be Ready.
func (c *Cluster) InstallRampart(settings map[string]string) time.Duration {
	c.T.Helper()
	return c.InstallRampartImage("", settings)
}

// InstallRampartImage is InstallRampart with the DaemonSet running image ref (a version
// the nodes hold, e.g. BuildImageOf's) instead of deploy/'s rampart.io/rampart:latest, as
// a user pins a version; "" keeps deploy/'s.
func (c *Cluster) InstallRampartImage(ref string, settings map[string]string) time.Duration {
	t := c.T
	t.Helper()
	manifests := c.DeployManifests(settings)
	if ref != "" {
		ds := filepath.Join(manifests, "daemonset.yaml")
		b, err := os.ReadFile(ds)
		if err != nil {
			t.Fatal(err)
		}
		const latest = "image: rampart.io/rampart:latest"
		if strings.Count(string(b), latest) != 1 {
			t.Fatalf("deploy/daemonset.yaml: want one %q to pin", latest)
		}
		if err := os.WriteFile(ds, []byte(strings.Replace(string(b), latest, "image: "+ref, 1)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	applied := time.Now()
	c.MustKubectl("apply", "-R", "-f", manifests)
	if err := c.WaitNodesReady(3 * time.Minute); err != nil {
		out, _ := c.Kubectl("-n", "kube-system", "get", "pods", "-o", "wide")
		t.Fatalf("after kubectl apply -R -f deploy/: %v\n%s", err, out)
	}
	ready := time.Since(applied)
	if c.dns {
		c.startDNS()
	}
	return ready
}

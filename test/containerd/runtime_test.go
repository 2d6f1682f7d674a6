package containerd

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/testenv"
)

// tools is what scripts/build-cri.sh builds: crictl, the loopback plugin and the sandbox
// image's archive with its name.
type tools struct {
	crictl, loopback, pauseTar, pauseRef string
}

// findTools locates containerd (from the Debian package) and the tools build-cri.sh built.
// Without them the test is skipped (failed when CI=true).
func findTools(t *testing.T) tools {
	t.Helper()
	for _, b := range []string{"containerd", "ctr", "containerd-shim-runc-v2", "runc"} {
		if _, err := exec.LookPath(b); err != nil {
			testenv.SkipOrFail(t, "%s not installed (scripts/build-cri.sh installs containerd): %v", b, err)
		}
	}
	out, err := exec.Command("bash", filepath.Join(testenv.ModuleRoot(t), "scripts", "build-cri.sh"), "--dir").Output()
	if err != nil {
		t.Fatalf("scripts/build-cri.sh --dir: %v", err)
	}
	dir := strings.TrimSpace(string(out))
	tl := tools{
		crictl:   filepath.Join(dir, "crictl"),
		loopback: filepath.Join(dir, "loopback"),
		pauseTar: filepath.Join(dir, "pause.tar"),
	}
	for _, f := range []string{tl.crictl, tl.loopback, tl.pauseTar} {
		if _, err := os.Stat(f); err != nil {
			testenv.SkipOrFail(t, "%s missing (build with scripts/build-cri.sh): %v", f, err)
		}
	}
	ref, err := os.ReadFile(filepath.Join(dir, "pause.ref"))
	if err != nil {
		testenv.SkipOrFail(t, "sandbox image name missing (build with scripts/build-cri.sh): %v", err)
	}
	tl.pauseRef = strings.TrimSpace(string(ref))
	return tl
}

// containerd is a containerd of the test's own: root, state, socket, configuration, CNI
// configuration and plugin directories all under one temporary directory. The system's
// containerd (its socket, /var/lib/containerd) is never touched.
type containerd struct {
	t     *testing.T
	tools tools
	dir   string
	sock  string
	// cgroup is the parent cgroup of the test's pods, named after dir: without one
	// containerd puts them under /k8s.io, a cgroup it leaves behind in every hierarchy.
	cgroup string
	cmd    *exec.Cmd
	done   chan struct{}
}

// newContainerd writes the configuration of a containerd whose CRI plugin runs the CNI
// plugins in binDir (copied) with the network configuration list conflist, and starts it.
// Everything it made is removed when the test ends, also when it fails: pods, shims,
// mounts, the directory.
func newContainerd(t *testing.T, tl tools, conflist string, plugins ...string) *containerd {
	t.Helper()
	// A short path: the sockets under it are limited to 108 bytes.
	dir, err := os.MkdirTemp("", "rp-ctrd-")
	if err != nil {
		t.Fatal(err)
	}
	c := &containerd{t: t, tools: tl, dir: dir, sock: filepath.Join(dir, "containerd.sock"), cgroup: "/" + filepath.Base(dir)}
	t.Cleanup(c.cleanup)
	for _, d := range []string{"cni/bin", "cni/conf", "logs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range append([]string{tl.loopback}, plugins...) {
		copyFile(t, p, filepath.Join(dir, "cni/bin", filepath.Base(p)))
	}
	if err := os.WriteFile(filepath.Join(dir, "cni/conf/10-rampart.conflist"), []byte(conflist), 0o644); err != nil {
		t.Fatal(err)
	}
	// The native snapshotter (plain directories) works on any file system the temporary
	// directory is on, overlayfs not on every one. The network namespaces go under the
	// state directory, the runc state under the root: nothing shared with another
	// containerd but the shims' socket directory (/run/containerd/s, one socket per
	// containerd address and sandbox). restrict_oom_score_adj: the sandbox's OOM score
	// (-998) is kept no lower than containerd's own, since a process without
	// CAP_SYS_RESOURCE (a CI container, this machine) may not lower it and runc's create
	// fails.
	config := fmt.Sprintf(`version = 2
root = %[1]q
state = %[2]q
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.overlayfs"]
[grpc]
  address = %[3]q
[plugins."io.containerd.internal.v1.opt"]
  path = %[4]q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %[5]q
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "native"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = %[6]q
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %[7]q
    conf_dir = %[8]q
`, filepath.Join(dir, "root"), filepath.Join(dir, "state"), c.sock, filepath.Join(dir, "opt"), tl.pauseRef,
		filepath.Join(dir, "runc"), filepath.Join(dir, "cni/bin"), filepath.Join(dir, "cni/conf"))
	if err := os.WriteFile(filepath.Join(dir, "config.toml"), []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	// crictl reads a configuration file; this one names the test's socket.
	crictlConf := fmt.Sprintf("runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 60\n", c.sock, c.sock)
	if err := os.WriteFile(filepath.Join(dir, "crictl.yaml"), []byte(crictlConf), 0o644); err != nil {
		t.Fatal(err)
	}
	c.start()
	return c
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	data, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, data, 0o755); err != nil {
		t.Fatal(err)
	}
}

// start starts containerd and waits until its CRI plugin says the runtime and the
// network (the CNI configuration loaded) are ready.
func (c *containerd) start() {
	c.t.Helper()
	logf, err := os.OpenFile(filepath.Join(c.dir, "containerd.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	cmd := exec.Command("containerd", "--config", filepath.Join(c.dir, "config.toml"))
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group: a signal to the test's group does not reach it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		c.t.Fatalf("starting containerd: %v", err)
	}
	c.cmd, c.done = cmd, make(chan struct{})
	go func() {
		cmd.Wait()
		logf.Close()
		close(c.done)
	}()
	ready := testenv.Eventually(30*time.Second, func() bool {
		out, err := c.crictlErr("info", "-o", "json")
		if err != nil {
			return false
		}
		var info struct {
			Status struct {
				Conditions []struct {
					Type   string `json:"type"`
					Status bool   `json:"status"`
				} `json:"conditions"`
			} `json:"status"`
		}
		if json.Unmarshal([]byte(out), &info) != nil {
			return false
		}
		n := 0
		for _, cond := range info.Status.Conditions {
			if (cond.Type == "RuntimeReady" || cond.Type == "NetworkReady") && cond.Status {
				n++
			}
		}
		return n == 2
	})
	if !ready {
		c.t.Fatalf("containerd not ready within 30s\n%s", c.logTail())
	}
}

// stop stops containerd as its service manager does (SIGTERM). Pods keep running: their
// shims are not containerd's children.
func (c *containerd) stop() {
	c.t.Helper()
	if c.cmd == nil {
		return
	}
	if !testenv.Terminate(c.cmd.Process, c.done, 20*time.Second) {
		c.t.Errorf("containerd did not stop within 20s of SIGTERM")
	}
	c.cmd = nil
}

// cleanup removes the test's pods (their CNI DEL included: the agent is still up, its
// cleanup registered earlier runs later), stops containerd, and removes what a failed
// test may leave: shims, mounts, the directory.
func (c *containerd) cleanup() {
	if c.t.Failed() {
		c.t.Logf("containerd log:\n%s", c.logTail())
	}
	if c.cmd != nil {
		if out, err := c.crictlErr("rmp", "--all", "--force"); err != nil {
			c.t.Errorf("removing the pods: %v\n%s", err, out)
		}
		c.stop()
	}
	// Shims of pods that could not be removed outlive containerd; they name its address.
	for _, pid := range c.shims() {
		unix.Kill(pid, unix.SIGKILL)
		c.t.Errorf("killed shim %d left behind", pid)
	}
	// Mounts left under the directory (sandbox root file systems, network namespaces),
	// deepest first.
	if mounts := c.mounts(); len(mounts) > 0 {
		c.t.Errorf("mounts left behind: %v", mounts)
		for _, m := range slices.Backward(mounts) {
			unix.Unmount(m, unix.MNT_DETACH)
		}
	}
	if err := os.RemoveAll(c.dir); err != nil {
		c.t.Errorf("removing containerd's directory: %v", err)
	}
	// The pods' parent cgroup, in each hierarchy (cgroup v1) or the one (v2); runc
	// removed the pods' own.
	hier, _ := filepath.Glob("/sys/fs/cgroup/*")
	for _, h := range append(hier, "/sys/fs/cgroup") {
		if err := os.Remove(filepath.Join(h, c.cgroup)); err != nil && !os.IsNotExist(err) && !errors.Is(err, unix.ENOTDIR) {
			c.t.Errorf("removing the pods' cgroup: %v", err)
		}
	}
}

// shims lists the shim processes serving this containerd.
func (c *containerd) shims() []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		var pid int
		if _, err := fmt.Sscan(e.Name(), &pid); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		if strings.HasSuffix(args[0], "containerd-shim-runc-v2") && slices.Contains(args, c.sock) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// mounts lists the mount points under the directory, in mount order.
func (c *containerd) mounts() []string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], c.dir+"/") {
			out = append(out, fields[4])
		}
	}
	return out
}

func (c *containerd) logTail() string {
	f, err := os.Open(filepath.Join(c.dir, "containerd.log"))
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	data, _ := io.ReadAll(f)
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) > 60 {
		lines = lines[len(lines)-60:]
	}
	return strings.Join(lines, "\n")
}

// run runs a command with a timeout and returns its stdout; stderr goes into the error.
func run(timeout time.Duration, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var stderr strings.Builder
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w\n%s", name, strings.Join(args, " "), err, stderr.String())
	}
	return string(out), nil
}

func (c *containerd) crictlErr(args ...string) (string, error) {
	return run(90*time.Second, c.tools.crictl, append([]string{"--config", filepath.Join(c.dir, "crictl.yaml")}, args...)...)
}

// crictl runs crictl against this containerd and fails the test if it fails.
func (c *containerd) crictl(args ...string) string {
	c.t.Helper()
	out, err := c.crictlErr(args...)
	if err != nil {
		c.t.Fatalf("%v\n%s", err, c.logTail())
	}
	return out
}

// importImage imports the sandbox image into the CRI plugin's namespace (k8s.io), unpacked
// for its snapshotter, as `ctr images import` does for an image pulled elsewhere.
func (c *containerd) importImage() {
	c.t.Helper()
	if out, err := run(60*time.Second, "ctr", "--address", c.sock, "--namespace", "k8s.io", "images", "import",
		"--snapshotter", "native", c.tools.pauseTar); err != nil {
		c.t.Fatalf("importing the sandbox image: %v\n%s", err, out)
	}
}

// pod is a pod sandbox crictl ran.
type pod struct {
	id, namespace, name string
}

// runPod runs a pod sandbox (`crictl runp`) named namespace/name.
func (c *containerd) runPod(namespace, name string) pod {
	c.t.Helper()
	cfg := map[string]any{
		"metadata": map[string]any{
			"name": name, "namespace": namespace, "uid": name + "-" + testenv.Suffix(8), "attempt": 0,
		},
		"log_directory": filepath.Join(c.dir, "logs", namespace+"_"+name),
		"linux":         map[string]any{"cgroup_parent": c.cgroup},
	}
	data, err := json.Marshal(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	path := filepath.Join(c.dir, "pod-"+namespace+"-"+name+".json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		c.t.Fatal(err)
	}
	began := time.Now()
	id := strings.TrimSpace(c.crictl("runp", path))
	c.t.Logf("crictl runp %s/%s: %v", namespace, name, time.Since(began).Round(time.Millisecond))
	if id == "" {
		c.t.Fatalf("crictl runp %s/%s printed no pod ID", namespace, name)
	}
	return pod{id: id, namespace: namespace, name: name}
}

// sandboxStatus is what `crictl inspectp` tells of a pod sandbox.
type sandboxStatus struct {
	Status struct {
		ID       string `json:"id"`
		State    string `json:"state"`
		Metadata struct {
			Name      string `json:"name"`
			Namespace string `json:"namespace"`
		} `json:"metadata"`
		Network struct {
			IP string `json:"ip"`
		} `json:"network"`
	} `json:"status"`
	Info struct {
		Pid int `json:"pid"`
	} `json:"info"`
}

func (c *containerd) inspect(p pod) sandboxStatus {
	c.t.Helper()
	var st sandboxStatus
	if err := json.Unmarshal([]byte(c.crictl("inspectp", "-o", "json", p.id)), &st); err != nil {
		c.t.Fatalf("crictl inspectp %s: %v", p.id, err)
	}
	return st
}

// podIDs lists the pod sandboxes containerd has.
func (c *containerd) podIDs() []string {
	c.t.Helper()
	return strings.Fields(c.crictl("pods", "--quiet"))
}

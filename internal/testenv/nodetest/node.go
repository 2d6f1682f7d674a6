package nodetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/clustertest"
)

// Node is one real node: its namespaces, containerd, kubelet and kube-proxy, and (the
// embedded clustertest.Node) its rampartd.
type Node struct {
	*clustertest.Node
	// Dir holds the node's configuration, logs and the directories its mount namespace puts
	// over the host's (Dir/var/lib/kubelet...).
	Dir string
	// CgroupRoot is the kubelet's cgroupRoot.
	CgroupRoot string
	// ClusterDNS is the nameserver the kubelet gives pods (none if not valid).
	ClusterDNS netip.Addr

	holder, containerd, kubelet, kubeProxy *proc
	// dirs are the host paths the node's mount namespace has its own directories over;
	// images the archives imported besides pause and agnhost (Options).
	dirs, images []string
}

// start starts the node's namespaces, containerd (with the images imported), kubelet and
// kube-proxy (its clusterCIDR the lab's pod range). With rampartCNI, the node's network is the host rampartd's: the plugin and
// a configuration naming its socket are put in place; without, the node has no CNI
// configuration until an agent pod writes one.
func (n *Node) start(b Bins, kubeconfig string, clusterCIDR netip.Prefix, rampartCNI string) error {
	var err error
	if n.holder, err = holdNamespaces(n.Dir, n.Netns, n.dirs); err != nil {
		return err
	}
	// Fixed now: a holder that ended would make pid() 0, which startProc takes as the host.
	ns := n.holder.pid()
	files := []struct{ path, text string }{
		{"containerd.toml", containerdConfig(filepath.Join(b.Node, "runc"), b.PauseImage)},
		{"kubelet.yaml", kubeletConfig(n.CgroupRoot, n.ClusterDNS)},
		{"kube-proxy.yaml", KubeProxyConfig(kubeconfig, n.Name, clusterCIDR.String())},
	}
	if rampartCNI != "" {
		files = append(files, struct{ path, text string }{"etc/cni/net.d/10-rampart.conflist", cniConfList(n.Socket())})
	}
	for _, f := range files {
		if err := os.WriteFile(filepath.Join(n.Dir, f.path), []byte(f.text), 0o644); err != nil {
			return err
		}
	}
	if rampartCNI != "" {
		if err := copyFile(rampartCNI, filepath.Join(n.Dir, "opt/cni/bin/rampart-cni")); err != nil {
			return err
		}
	}
	if err := makeCgroupRoot(n.CgroupRoot); err != nil {
		return err
	}
	// The shim runc-v2 containerd starts is found on PATH, next to containerd.
	n.containerd, err = startProc("containerd", n.path("containerd.log"), ns,
		"env", "PATH="+b.Node+":"+os.Getenv("PATH"), filepath.Join(b.Node, "containerd"), "--config", n.path("containerd.toml"))
	if err != nil {
		return err
	}
	if err := n.waitContainerd(); err != nil {
		return err
	}
	images := []string{filepath.Join(b.CRI, "pause.tar"), filepath.Join(b.Node, "agnhost.tar")}
	if b.CoreDNS != "" {
		images = append(images, filepath.Join(b.CoreDNS, "coredns.tar"))
	}
	for _, img := range append(images, n.images...) {
		// --local: the archive has no platform index for the transfer service to unpack by.
		if out, err := n.Exec(filepath.Join(b.Node, "ctr"), "--address", "/run/containerd/containerd.sock",
			"--namespace", "k8s.io", "images", "import", "--local", img); err != nil {
			return fmt.Errorf("node %s: importing %s: %v\n%s", n.Name, img, err, out)
		}
	}
	n.kubelet, err = startProc("kubelet", n.path("kubelet.log"), ns, filepath.Join(b.Node, "kubelet"),
		"--config", n.path("kubelet.yaml"), "--kubeconfig", kubeconfig,
		"--node-ip", n.Address.String(), "--hostname-override", n.Name)
	if err != nil {
		return err
	}
	n.kubeProxy, err = startProc("kube-proxy", n.path("kube-proxy.log"), ns, filepath.Join(b.Node, "kube-proxy"),
		"--config", n.path("kube-proxy.yaml"))
	return err
}

func (n *Node) path(rel string) string { return filepath.Join(n.Dir, rel) }

// waitContainerd waits for containerd to accept connections on its socket (the socket
// file of a containerd that was killed stays behind until the next one starts).
func (n *Node) waitContainerd() error {
	if !testenv.Eventually(30*time.Second, func() bool {
		c, err := net.DialTimeout("unix", n.path("run/containerd/containerd.sock"), time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil || n.containerd.exited()
	}) || n.containerd.exited() {
		return fmt.Errorf("node %s: containerd did not start; its log %s", n.Name, n.containerd.log)
	}
	return nil
}

// Exec runs a command in the node's network and mount namespaces and returns its output.
func (n *Node) Exec(argv ...string) (string, error) {
	cmd, cancel, err := n.command(argv)
	if err != nil {
		return "", err
	}
	defer cancel()
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Output is Exec returning the command's standard output only (its standard error goes in
// the error, if it fails): for output to be parsed.
func (n *Node) Output(argv ...string) (string, error) {
	cmd, cancel, err := n.command(argv)
	if err != nil {
		return "", err
	}
	defer cancel()
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("%s: %w: %s", argv[0], err, strings.TrimSpace(stderr.String()))
	}
	return string(out), nil
}

func (n *Node) command(argv []string) (*exec.Cmd, context.CancelFunc, error) {
	ns := n.holder.pid()
	if ns == 0 {
		return nil, nil, fmt.Errorf("node %s: its namespaces are gone", n.Name)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	return exec.CommandContext(ctx, "nsenter", append([]string{"--target", strconv.Itoa(ns), "--net", "--mount", "--"}, argv...)...), cancel, nil
}

// stop stops the node: kube-proxy and the kubelet, then every pod sandbox through containerd
// (so each pod's network is torn down by CNI DEL while the agent still runs), containerd,
// whatever is left in the node's mount namespace (the shims) and cgroups, and the
// namespaces' holder.
func (n *Node) stop(crictl string) error {
	var errs []error
	n.kubeProxy.stop(10 * time.Second)
	n.kubelet.stop(20 * time.Second)
	if n.containerd != nil && !n.containerd.exited() {
		if err := n.removeSandboxes(crictl); err != nil {
			errs = append(errs, err)
		}
	}
	n.containerd.stop(10 * time.Second)
	if ns := n.holder.pid(); ns != 0 {
		killMountNamespace(ns)
	}
	if n.CgroupRoot != "" {
		if err := removeCgroupRoot(n.CgroupRoot); err != nil {
			errs = append(errs, err)
		}
	}
	n.holder.stop(time.Second)
	return errors.Join(errs...)
}

// agentLabel is the label of deploy/'s agent pods.
const agentLabel = "app.kubernetes.io/name=rampart"

// removeSandboxes removes every pod sandbox of the node through CRI. When the agent is a
// pod (WithoutAgents), the other pods go first, while it still answers their CNI DELs,
// and then its own; whatever is left then (the agent was gone already, or was
// uninstalled with its configuration) is removed under a loopback-only configuration, so
// that the runtime's network teardown can finish: the pods' endpoints went with the agent,
// and their namespaces go with the sandboxes.
func (n *Node) removeSandboxes(crictl string) error {
	cri := []string{crictl, "--runtime-endpoint", "unix:///run/containerd/containerd.sock", "--timeout", "30s"}
	rmAll := func() error {
		if out, err := n.Exec(append(cri, "rmp", "--all", "--force")...); err != nil {
			return fmt.Errorf("node %s: removing pods: %v\n%s", n.Name, err, out)
		}
		return nil
	}
	ids := func(args ...string) []string {
		out, _ := n.Output(append(append(cri, "pods", "-q"), args...)...)
		return strings.Fields(out)
	}
	switch {
	case n.Node.Socket() != "" && n.Node.AgentPid() != 0:
		return rmAll() // the host's agent outlives this
	case n.Node.Socket() != "":
		// The test stopped the host's agent for good (a node gone): nothing answers the
		// CNI DELs, as when an agent pod is gone.
	default:
		agents := ids("--label", agentLabel)
		var others []string
		for _, id := range ids() {
			if !slices.Contains(agents, id) {
				others = append(others, id)
			}
		}
		for _, group := range [][]string{others, agents} {
			if len(group) > 0 {
				n.Exec(append(append(cri, "rmp", "--force"), group...)...)
			}
		}
	}
	if len(ids()) == 0 {
		return nil
	}
	confs, _ := filepath.Glob(n.path("etc/cni/net.d/*"))
	for _, f := range confs {
		os.Remove(f)
	}
	if err := copyFile(filepath.Join(filepath.Dir(crictl), "loopback"), n.path("opt/cni/bin/loopback")); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	lo := `{"cniVersion": "1.0.0", "name": "teardown", "plugins": [{"type": "loopback"}]}`
	if err := os.WriteFile(n.path("etc/cni/net.d/99-loopback.conflist"), []byte(lo), 0o644); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	// The runtime reloads its configuration on a change of the directory.
	var err error
	testenv.Eventually(30*time.Second, func() bool { err = rmAll(); return err == nil })
	return err
}

// agentPodPid returns the process id of the node's running agent container (deploy/'s
// DaemonSet, WithoutAgents).
func (n *Node) agentPodPid(crictl string) (int, error) {
	cri := []string{crictl, "--runtime-endpoint", "unix:///run/containerd/containerd.sock", "--timeout", "5s"}
	out, err := n.Output(append(cri, "ps", "--state", "running", "--label", "io.kubernetes.container.name=rampartd", "-q")...)
	if err != nil {
		return 0, err
	}
	ids := strings.Fields(out)
	if len(ids) != 1 {
		return 0, fmt.Errorf("node %s: %d running agent containers, want 1", n.Name, len(ids))
	}
	out, err = n.Output(append(cri, "inspect", ids[0])...)
	if err != nil {
		return 0, err
	}
	var c struct{ Info struct{ Pid int } }
	if err := json.Unmarshal([]byte(out), &c); err != nil {
		return 0, fmt.Errorf("node %s: reading crictl inspect: %w", n.Name, err)
	}
	return c.Info.Pid, nil
}

// killMountNamespace kills every process but holder in holder's mount namespace.
func killMountNamespace(holder int) {
	ns, err := os.Readlink("/proc/" + strconv.Itoa(holder) + "/ns/mnt")
	if err != nil {
		return
	}
	testenv.Eventually(10*time.Second, func() bool {
		found := false
		ents, _ := os.ReadDir("/proc")
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == holder {
				continue
			}
			if l, err := os.Readlink("/proc/" + e.Name() + "/ns/mnt"); err == nil && l == ns {
				syscall.Kill(pid, syscall.SIGKILL)
				found = true
			}
		}
		return !found
	})
}

func copyFile(from, to string) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return os.WriteFile(to, b, 0o755)
}

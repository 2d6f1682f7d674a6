package nodetest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
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
}

// start starts the node's namespaces, containerd (with the images imported), kubelet and
// kube-proxy.
func (n *Node) start(b Bins, kubeconfig, rampartCNI string) error {
	var err error
	if n.holder, err = holdNamespaces(n.Dir, n.Netns); err != nil {
		return err
	}
	// Fixed now: a holder that ended would make pid() 0, which startProc takes as the host.
	ns := n.holder.pid()
	for _, f := range []struct{ path, text string }{
		{"containerd.toml", containerdConfig(filepath.Join(b.Node, "runc"), b.PauseImage)},
		{"kubelet.yaml", kubeletConfig(n.CgroupRoot, n.ClusterDNS)},
		{"kube-proxy.yaml", kubeProxyConfig(kubeconfig, n.Name, ClusterCIDR)},
		{"etc/cni/net.d/10-rampart.conflist", cniConfList(n.Socket())},
	} {
		if err := os.WriteFile(filepath.Join(n.Dir, f.path), []byte(f.text), 0o644); err != nil {
			return err
		}
	}
	if err := copyFile(rampartCNI, filepath.Join(n.Dir, "opt/cni/bin/rampart-cni")); err != nil {
		return err
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
	for _, img := range images {
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
		if out, err := n.Exec(crictl, "--runtime-endpoint", "unix:///run/containerd/containerd.sock", "rmp", "--all", "--force"); err != nil {
			errs = append(errs, fmt.Errorf("node %s: removing pods: %v\n%s", n.Name, err, out))
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

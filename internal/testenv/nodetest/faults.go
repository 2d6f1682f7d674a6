package nodetest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
)

// RestartKubelet stops the node's kubelet (SIGTERM) and starts it again; the pods keep
// running meanwhile.
func (n *Node) RestartKubelet() error {
	if err := n.kubelet.restart(20 * time.Second); err != nil {
		return fmt.Errorf("node %s: restarting the kubelet: %w", n.Name, err)
	}
	return nil
}

// RestartContainerd stops the node's containerd (SIGTERM) and starts it again; the
// containers keep running under their shims meanwhile.
func (n *Node) RestartContainerd() error {
	if err := n.containerd.restart(10 * time.Second); err != nil {
		return fmt.Errorf("node %s: restarting containerd: %w", n.Name, err)
	}
	return n.waitContainerd()
}

// Reboot kills every process of the node at once (SIGKILL), as a power loss would:
// kube-proxy, the kubelet, containerd, the shims and every container, and the node's
// rampartd; then starts containerd, the kubelet, kube-proxy and rampartd again. The node's
// network namespace, its disk (the node's directories, the agent's state) and, since they
// live on the host's bpffs, the agent's pinned programs survive, as the disk of a real node
// would and its memory would not. The kubelet then finds every sandbox dead and makes the
// pods again.
func (n *Node) Reboot() error {
	n.Node.Kill()
	for _, p := range []*proc{n.kubeProxy, n.kubelet, n.containerd} {
		p.kill()
	}
	if ns := n.holder.pid(); ns != 0 {
		killMountNamespace(ns)
	}
	if err := killCgroupProcs(n.CgroupRoot); err != nil {
		return fmt.Errorf("node %s: %w", n.Name, err)
	}
	var errs []error
	for _, p := range []*proc{n.containerd, n.kubelet, n.kubeProxy} {
		q, err := startProc(p.name, p.log, 0, p.argv...)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		*p = *q
		if p == n.containerd {
			if err := n.waitContainerd(); err != nil {
				return err
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("node %s: starting again: %w", n.Name, err)
	}
	n.Node.Start()
	return nil
}

// killCgroupProcs kills every process in the node's cgroups, in every hierarchy, until
// none is left (a process forking while it is killed shows up on the next pass).
func killCgroupProcs(root string) error {
	hs, err := hierarchies()
	if err != nil {
		return err
	}
	for _, h := range hs {
		top := filepath.Join(h, root)
		left := func() bool {
			found := false
			filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
				if err != nil || !d.IsDir() {
					return nil
				}
				b, _ := os.ReadFile(filepath.Join(p, "cgroup.procs"))
				if len(b) > 0 {
					found = true
					killProcs(filepath.Join(p, "cgroup.procs"))
				}
				return nil
			})
			return found
		}
		if !testenv.Eventually(10*time.Second, func() bool { return !left() }) {
			return fmt.Errorf("killing the processes of cgroup %s: some remain", top)
		}
	}
	return nil
}

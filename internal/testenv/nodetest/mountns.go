package nodetest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
)

// privateDirs are the host paths a node gets a directory of its own over, inside its mount
// namespace: the kubelet's state (with the device-plugin socket, a fixed path), pod logs,
// the CNI configuration and plugins, containerd's state and content.
var privateDirs = []string{
	"/var/lib/kubelet",
	"/var/log/pods",
	"/etc/cni/net.d",
	"/opt/cni/bin",
	"/run/containerd",
	"/var/lib/containerd",
}

// agentDirs are the host paths a node whose agent is a pod (Options.WithoutAgents) also
// gets a directory of its own over: the DaemonSet's hostPath volumes for the agent's API
// socket and its state resolve in the node's mount namespace, where containerd runs, and
// every node's agent uses the same default paths.
var agentDirs = []string{"/run/rampart", "/var/lib/rampart"}

// holdNamespaces starts the process that holds the node's mount namespace: it enters the
// node's network namespace, unshares the mount namespace with propagation unchanged (the
// host's mounts are private but /run/netns, which is shared, stays joined to the host's, so
// pod network namespaces containerd mounts there are seen by the host), bind-mounts the
// node's directories over privateDirs, sets lo up, mounts a bpffs of its own on /sys/fs/bpf, and then
// sleeps. Everything of the node is started in its namespaces (startProc with its pid).
// The mount points must exist on the host (lease.ensureMountPoints).
func holdNamespaces(dir, netns string, dirs []string) (*proc, error) {
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	var script strings.Builder
	// lo is down in a new network namespace: the kubelet's healthz and containerd's
	// streaming server (exec, logs) listen on 127.0.0.1.
	script.WriteString("set -e\nip link set lo up\n")
	for _, d := range dirs {
		fmt.Fprintf(&script, "mount --bind %q %q\n", filepath.Join(dir, d), d)
	}
	// Shared, so that an agent pod's Bidirectional mount of it is accepted (the runtime
	// refuses that propagation on a private mount) and its pins are the node's; the host's
	// private bpffs under it is unmounted first (in this namespace only), or the runtime
	// would judge the path by that mount.
	script.WriteString("umount -l /sys/fs/bpf 2>/dev/null || true\nmount -t bpf bpf /sys/fs/bpf\nmount --make-shared /sys/fs/bpf\n")
	ready := filepath.Join(dir, "namespaces-ready")
	fmt.Fprintf(&script, "touch %q\nexec sleep infinity\n", ready)
	p, err := startProc("namespaces", filepath.Join(dir, "namespaces.log"), 0,
		"nsenter", "--net=/run/netns/"+netns, "--", "unshare", "--mount", "--propagation", "unchanged", "--", "sh", "-c", script.String())
	if err != nil {
		return nil, err
	}
	if !testenv.Eventually(10*time.Second, func() bool {
		_, err := os.Stat(ready)
		return err == nil || p.exited()
	}) || p.exited() {
		p.stop(time.Second)
		b, _ := os.ReadFile(p.log)
		return nil, fmt.Errorf("node namespaces of %s not set up:\n%s", netns, b)
	}
	return p, nil
}

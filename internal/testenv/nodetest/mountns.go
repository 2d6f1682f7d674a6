package nodetest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

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
// The mount points must exist on the host (ensureMountPoints).
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

// mountPoints are the host directories a lab mounts over: those it created, and the pin
// file it keeps in each while it lives.
type mountPoints struct {
	created, pins []string
}

// ensureMountPoints creates the dirs missing on the host and pins every dir with an empty
// file named for owner, until remove. The pin matters because other tests share these
// paths: an agent that found /run/rampart missing created it and removes it, when empty,
// as it uninstalls, and removing a directory another mount namespace mounted over detaches
// that mount, so a live node would lose its directory (or the next node its mount point).
func ensureMountPoints(dirs []string, owner string) (mountPoints, error) {
	var m mountPoints
	for _, d := range dirs {
		for p := d; p != "/"; p = filepath.Dir(p) {
			if _, err := os.Stat(p); os.IsNotExist(err) {
				m.created = append(m.created, p)
			}
		}
		if err := os.MkdirAll(d, 0o755); err != nil {
			return m, fmt.Errorf("mount point %s: %w", d, err)
		}
		pin := filepath.Join(d, ".rampart-nodetest-"+owner)
		if err := os.WriteFile(pin, nil, 0o644); err != nil {
			return m, fmt.Errorf("pinning mount point %s: %w", d, err)
		}
		m.pins = append(m.pins, pin)
	}
	// Deepest first, for removal in order.
	slices.SortFunc(m.created, func(a, b string) int { return len(b) - len(a) })
	m.created = slices.Compact(m.created)
	return m, nil
}

// remove removes the pins and then the (empty) mount points ensureMountPoints created; a
// directory another lab pinned meanwhile is left to that lab.
func (m mountPoints) remove() error {
	var errs []error
	for _, p := range m.pins {
		if err := os.Remove(p); err != nil && !os.IsNotExist(err) {
			errs = append(errs, fmt.Errorf("removing mount point pin %s: %w", p, err))
		}
	}
	for _, d := range m.created {
		err := os.Remove(d)
		if err != nil && !os.IsNotExist(err) && !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
			errs = append(errs, fmt.Errorf("removing mount point %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}

package nodetest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/testenv"
)

// A node's mount namespace has directories of its own over the kubelet's, containerd's
// and the CNI's paths, which the host does not see, while a network namespace mounted
// under /run/netns inside it (as containerd mounts a pod's) is seen by the host, where
// the node's rampartd opens it.
func TestNodeMountNamespace(t *testing.T) {
	testenv.RequireRoot(t)
	suffix := testenv.Suffix(6)
	netns := "rp-" + suffix + "-mnt"
	testenv.NewNetns(t, netns)
	mounts, err := ensureMountPoints(privateDirs, suffix)
	t.Cleanup(func() {
		if err := mounts.remove(); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	holder, err := holdNamespaces(dir, netns, privateDirs)
	if err != nil {
		t.Fatal(err)
	}
	n := &Node{Dir: dir, holder: holder}
	t.Cleanup(func() { holder.stop(time.Second) })

	marker := "rampart-" + suffix
	if out, err := n.Exec("touch", "/var/lib/kubelet/"+marker, "/opt/cni/bin/"+marker); err != nil {
		t.Fatalf("writing in the node's namespace: %v\n%s", err, out)
	}
	for _, d := range []string{"/var/lib/kubelet", "/opt/cni/bin"} {
		if _, err := os.Stat(filepath.Join(dir, d, marker)); err != nil {
			t.Errorf("the node's %s is not its own directory: %v", d, err)
		}
		if _, err := os.Stat(filepath.Join(d, marker)); !os.IsNotExist(err) {
			t.Errorf("the node's file is in the host's %s: %v", d, err)
		}
	}
	var hostBPF unix.Stat_t
	if err := unix.Stat("/sys/fs/bpf", &hostBPF); err != nil {
		t.Fatal(err)
	}
	out, err := n.Exec("stat", "-f", "-c", "%t", "/sys/fs/bpf")
	if err != nil || strings.TrimSpace(out) != "cafe4a11" {
		t.Errorf("/sys/fs/bpf in the node is not a bpffs: %v, type %q", err, out)
	}
	if out, err := n.Exec("stat", "-c", "%d", "/sys/fs/bpf"); err != nil || strings.TrimSpace(out) == strconv.FormatUint(hostBPF.Dev, 10) {
		t.Errorf("/sys/fs/bpf in the node is the host's (device %s, %v)", out, err)
	}

	pod := "/run/netns/rp-" + suffix + "-pod"
	t.Cleanup(func() {
		unix.Unmount(pod, unix.MNT_DETACH)
		os.Remove(pod)
	})
	if out, err := n.Exec("sh", "-c", "touch "+pod+" && mount --bind /proc/self/ns/net "+pod); err != nil {
		t.Fatalf("mounting a network namespace under /run/netns in the node: %v\n%s", err, out)
	}
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(mi), " "+pod+" ") {
		t.Fatalf("the host does not see the network namespace the node mounted at %s", pod)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(pod, &st); err != nil || st.Type != unix.NSFS_MAGIC {
		t.Fatalf("%s on the host is not a namespace (%v, type %#x)", pod, err, st.Type)
	}
}

// A mount point stays while its lab lives, even when another user of the path (an agent
// that created /run/rampart) removes it once it looks empty; the lab then removes only
// what it created.
func TestMountPointsArePinned(t *testing.T) {
	base := t.TempDir()
	shared := filepath.Join(base, "run", "rampart")
	mounts, err := ensureMountPoints([]string{shared}, "a")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(shared); err == nil {
		t.Fatal("another user removed a mount point while the lab lives")
	}
	if err := mounts.remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(base, "run")); !os.IsNotExist(err) {
		t.Errorf("the lab left the directories it created: %v", err)
	}

	// Two labs on one path: the first to end leaves it to the other (which did not create
	// it, so it stays, empty).
	first, err := ensureMountPoints([]string{shared}, "a")
	if err != nil {
		t.Fatal(err)
	}
	second, err := ensureMountPoints([]string{shared}, "b")
	if err != nil {
		t.Fatal(err)
	}
	if err := first.remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(shared); err != nil {
		t.Errorf("the first lab to end removed the other's mount point: %v", err)
	}
	if err := second.remove(); err != nil {
		t.Fatal(err)
	}
	if entries, err := os.ReadDir(shared); err != nil || len(entries) != 0 {
		t.Errorf("pins left behind: %v %v", entries, err)
	}
}

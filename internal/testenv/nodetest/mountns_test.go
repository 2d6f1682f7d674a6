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
	// The mount points are the host's labs' too: this test holds them as a lab without a
	// slot does, so that they stay while another lab uses them.
	l, err := theHost(t.Logf).acquire(false)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.release(); err != nil {
			t.Error(err)
		}
	})
	if err := l.ensureMountPoints(privateDirs); err != nil {
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

package nodetest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/k8stest"
)

// Bins are the directories holding what the nodes run.
type Bins struct {
	// Node is scripts/build-node.sh's directory: kubelet, kube-proxy, kube-scheduler,
	// kube-controller-manager, containerd, containerd-shim-runc-v2, ctr, runc, agnhost.tar.
	Node string
	// CRI is scripts/build-cri.sh's: crictl, loopback, pause.tar.
	CRI string
	// AgnhostImage and PauseImage are the images' names (agnhost.ref, pause.ref).
	AgnhostImage, PauseImage string
	// CoreDNS is scripts/build-coredns.sh's directory (coredns.tar) and CoreDNSImage its
	// image's name (coredns.ref); both empty unless the cluster runs DNS (Options.DNS).
	CoreDNS, CoreDNSImage string
}

// FindBins returns the build scripts' directories, named after tools/*/versions.env as the
// scripts name them, CoreDNS's too if dns; the test is skipped (failed when CI=true) when a
// file is missing.
func FindBins(t testing.TB, dns bool) Bins {
	t.Helper()
	root := testenv.ModuleRoot(t)
	k8s := k8stest.Versions(t, filepath.Join(root, "tools", "k8s", "versions.env"))
	node := k8stest.Versions(t, filepath.Join(root, "tools", "node", "versions.env"))
	cri := k8stest.Versions(t, filepath.Join(root, "tools", "cri", "versions.env"))
	b := Bins{
		Node: filepath.Join(k8stest.Cache(), "node-"+k8s["K8S_VERSION"]+"-containerd-"+node["CONTAINERD_VERSION"]+
			"-runc-"+node["RUNC_VERSION"]+"-agnhost-"+node["AGNHOST_VERSION"]),
		CRI: filepath.Join(k8stest.Cache(), "cri-crictl-"+cri["CRICTL_VERSION"]+"-plugins-"+cri["CNI_PLUGINS_VERSION"]+
			"-pause-"+cri["PAUSE_VERSION"]),
	}
	for _, f := range []string{"kubelet", "kube-proxy", "kube-scheduler", "kube-controller-manager", "containerd",
		"containerd-shim-runc-v2", "ctr", "runc", "agnhost.tar", "agnhost.ref"} {
		if _, err := os.Stat(filepath.Join(b.Node, f)); err != nil {
			testenv.SkipOrFail(t, "node binary %s missing (build with scripts/build-node.sh): %v", f, err)
		}
	}
	for _, f := range []string{"crictl", "loopback", "pause.tar", "pause.ref"} {
		if _, err := os.Stat(filepath.Join(b.CRI, f)); err != nil {
			testenv.SkipOrFail(t, "%s missing (build with scripts/build-cri.sh): %v", f, err)
		}
	}
	b.AgnhostImage = readRef(t, filepath.Join(b.Node, "agnhost.ref"))
	b.PauseImage = readRef(t, filepath.Join(b.CRI, "pause.ref"))
	if dns {
		findCoreDNS(t, &b, node["COREDNS_VERSION"])
	}
	return b
}

func readRef(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// Package k8stest starts a real Kubernetes control plane (etcd and kube-apiserver, built by
// scripts/build-k8s.sh) for a test, and removes it when the test ends, also on failure. It
// needs no agent: later layers add nodes and agents on top of it.
package k8stest

import (
	"bufio"
	"context"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/rampartnet/rampart/internal/k8s/crds"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/controlplane"
)

// Cluster is a running control plane owned by one test.
type Cluster struct {
	*controlplane.ControlPlane
	// BinDir holds etcd, kube-apiserver and kubectl.
	BinDir string
	// Config is the admin's client configuration.
	Config *rest.Config
	// Client is a clientset for Config.
	Client kubernetes.Interface
}

// BinDir returns the directory scripts/build-k8s.sh builds the control plane into:
// $RAMPART_K8S_BIN if set, else $RAMPART_CACHE (default /var/cache/rampart) /
// k8s-<K8S_VERSION>-etcd-<ETCD_VERSION>, the versions read from tools/k8s/versions.env.
func BinDir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("RAMPART_K8S_BIN"); d != "" {
		return d
	}
	env := filepath.Join(testenv.ModuleRoot(t), "tools", "k8s", "versions.env")
	vers := Versions(t, env)
	if vers["K8S_VERSION"] == "" || vers["ETCD_VERSION"] == "" {
		t.Fatalf("%s: want K8S_VERSION and ETCD_VERSION", env)
	}
	return filepath.Join(Cache(), "k8s-"+vers["K8S_VERSION"]+"-etcd-"+vers["ETCD_VERSION"])
}

// Cache is the directory the build scripts cache into: $RAMPART_CACHE, default
// /var/cache/rampart.
func Cache() string {
	if c := os.Getenv("RAMPART_CACHE"); c != "" {
		return c
	}
	return "/var/cache/rampart"
}

// Versions reads a versions.env file of the build scripts (NAME=value lines, # comments).
func Versions(t testing.TB, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("component versions: %v", err)
	}
	defer f.Close()
	vers := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if k, v, ok := strings.Cut(line, "="); ok && !strings.HasPrefix(line, "#") {
			vers[k] = v
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	return vers
}

// Option changes the control plane's configuration before it starts.
type Option func(*controlplane.Config)

// WithAuthorization sets the API server's authorization mode (e.g. "RBAC"; default
// AlwaysAllow).
func WithAuthorization(mode string) Option {
	return func(c *controlplane.Config) { c.Authorization = mode }
}

// WithServiceAccounts has pods get their service account's token (controlplane
// Config.ServiceAccounts): for clusters that run kube-controller-manager.
func WithServiceAccounts() Option {
	return func(c *controlplane.Config) { c.ServiceAccounts = true }
}

// WithServiceCIDR sets the API server's service range (controlplane Config.ServiceCIDR):
// for clusters that run beside others on one host (nodetest's slots).
func WithServiceCIDR(p netip.Prefix) Option {
	return func(c *controlplane.Config) { c.ServiceCIDR = p }
}

// Start starts etcd and kube-apiserver in a temporary directory and returns when the API
// server is ready. Without the binaries the test is skipped (failed when CI=true). Every
// process is stopped and the directory removed when the test ends.
func Start(t testing.TB, opts ...Option) *Cluster {
	t.Helper()
	return StartOn(t, netip.Addr{}, opts...)
}

// StartOn is Start with the API server on addr (127.0.0.1 if addr is the zero Addr).
func StartOn(t testing.TB, addr netip.Addr, opts ...Option) *Cluster {
	t.Helper()
	bin := BinDir(t)
	for _, b := range []string{"etcd", "kube-apiserver", "kubectl"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			testenv.SkipOrFail(t, "control plane binary %s missing (build with scripts/build-k8s.sh): %v", b, err)
		}
	}
	dir, err := os.MkdirTemp("", "rampart-k8s-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	began := time.Now()
	cfg := controlplane.Config{BinDir: bin, Dir: dir, Address: addr}
	for _, o := range opts {
		o(&cfg)
	}
	cp, err := controlplane.Start(ctx, cfg)
	if err != nil {
		os.RemoveAll(dir)
		t.Fatalf("starting the control plane: %v", err)
	}
	t.Logf("control plane ready in %v (%s)", time.Since(began).Round(time.Millisecond), cp.Server)
	c := &Cluster{ControlPlane: cp, BinDir: bin}
	t.Cleanup(func() {
		if err := cp.Stop(); err != nil {
			t.Errorf("stopping the control plane: %v", err)
		}
		if t.Failed() {
			for _, l := range []string{"etcd.log", "kube-apiserver.log"} {
				t.Logf("%s ends:\n%s", l, controlplane.LogTail(filepath.Join(dir, l), 30))
			}
		}
		os.RemoveAll(dir)
	})
	c.Config, err = clientcmd.BuildConfigFromFlags("", cp.Kubeconfig)
	if err != nil {
		t.Fatalf("client config: %v", err)
	}
	c.Config.Timeout = 10 * time.Second
	c.Client, err = kubernetes.NewForConfig(c.Config)
	if err != nil {
		t.Fatalf("clientset: %v", err)
	}
	return c
}

// InstallCRDs installs Rampart's CRDs (deploy/crds: the Cilium policy kinds and the
// identity kinds) and waits until they are Established.
func (c *Cluster) InstallCRDs(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := crds.Install(ctx, c.Config); err != nil {
		t.Fatal(err)
	}
}

// Kubectl runs the real kubectl against the cluster and returns its combined output.
func (c *Cluster) Kubectl(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(c.BinDir, "kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// WaitReady polls the API server's /readyz until it answers ok or timeout passes.
func (c *Cluster) WaitReady(t testing.TB, timeout time.Duration) {
	t.Helper()
	if !testenv.Eventually(timeout, c.Ready) {
		t.Fatalf("API server not ready after %v", timeout)
	}
}

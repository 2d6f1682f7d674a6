package main_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/k8stest"
)

// TestDaemonLifecycle runs the real binaries: rampartd starts, serves the CLI, keeps
// enforcing after SIGTERM, comes back with its state, and --uninstall removes everything.
func TestDaemonLifecycle(t *testing.T) {
	testenv.RequireRoot(t)
	bin := bins.Dir(t)
	sockDir, flags := instanceFlags(t, "d", "198.18.0.0/24")
	inst, stateDir, bpfDir := flagValue(flags, "--instance"), flagValue(flags, "--state-dir"), flagValue(flags, "--bpf-dir")
	uninstalled := false
	t.Cleanup(func() {
		if !uninstalled {
			exec.Command(bin+"/rampartd", append(flags, "--uninstall")...).Run()
		}
	})

	var daemon *exec.Cmd
	var daemonLog bytes.Buffer
	start := func() {
		t.Helper()
		daemon = exec.Command(bin+"/rampartd", flags...)
		daemon.Stderr = &daemonLog
		if err := daemon.Start(); err != nil {
			t.Fatal(err)
		}
		if !testenv.Eventually(10*time.Second, func() bool {
			_, _, code := run(bin, sockDir, "status")
			return code == 0
		}) {
			daemon.Process.Kill()
			daemon.Wait()
			t.Fatalf("rampartd did not come up:\n%s", daemonLog.String())
		}
	}
	stop := func() {
		t.Helper()
		daemon.Process.Signal(syscall.SIGTERM)
		if err := daemon.Wait(); err != nil {
			t.Fatalf("rampartd exit after SIGTERM: %v\n%s", err, daemonLog.String())
		}
	}
	must := func(args ...string) string {
		t.Helper()
		out, errs, code := run(bin, sockDir, args...)
		if code != 0 {
			t.Fatalf("rampart %v: exit %d: %s %s\nagent log:\n%s", args, code, out, errs, daemonLog.String())
		}
		return out
	}

	start()
	t.Cleanup(func() {
		if daemon.ProcessState == nil {
			daemon.Process.Kill()
			daemon.Wait()
		}
	})
	must("endpoint", "add", "x/a", "--labels", "pod=a")
	must("endpoint", "add", "y/b", "--labels", "pod=b", "--ip", "198.18.0.50")

	serveTCP(t, bin, sockDir, "y/b", "80")
	probe := prober(bin, sockDir, "x/a", "198.18.0.50:80")
	if !probe() {
		t.Fatal("x/a -> y/b:80 blocked without policy")
	}
	policy := defaultDenyFile(t, "y")
	must("apply", "-f", policy)
	if probe() {
		t.Fatal("x/a -> y/b:80 passes a default deny")
	}
	list := must("endpoint", "list")

	stop()
	if probe() {
		t.Fatal("rampartd stopped: the default deny no longer holds")
	}
	start()
	if got := must("endpoint", "list"); got != list {
		t.Fatalf("endpoints changed across restart:\n%s\n%s", list, got)
	}
	if probe() {
		t.Fatal("after restart: x/a -> y/b:80 passes a default deny")
	}
	must("delete", "-f", policy)
	if !probe() {
		t.Fatal("after restart and delete: x/a -> y/b:80 blocked")
	}
	stop()

	// A state directory that holds no instance is refused, and keeps what it holds.
	foreign := t.TempDir()
	os.WriteFile(filepath.Join(foreign, "keep.txt"), []byte("x"), 0o600)
	wrong := append(slices.Clone(flags), "--state-dir", foreign, "--uninstall")
	out, err := exec.Command(bin+"/rampartd", wrong...).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "--state-dir "+foreign+": no Rampart instance") {
		t.Fatalf("uninstall of a folder without the instance: %v\n%s\nwant exit 1 and a refusal naming the folder", err, out)
	}
	if _, err := os.Stat(filepath.Join(foreign, "keep.txt")); err != nil {
		t.Fatalf("refused uninstall removed a file of the folder: %v", err)
	}

	out, err = exec.Command(bin+"/rampartd", append(flags, "--uninstall")...).CombinedOutput()
	if err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out)
	}
	uninstalled = true
	for _, p := range []string{bpfDir, stateDir, "/run/netns/rp-" + inst + "-node", "/run/netns/rp-" + inst + "-x-a", "/run/netns/rp-" + inst + "-y-b"} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left after uninstall (%v)", p, err)
		}
	}
}

// TestHelpAndVersion: rampartd --help says on stdout what the agent is, what it needs and
// changes and how uninstall undoes it, then the flags; --version and rampart version name
// the build (here the version given at link time) and the Go version.
func TestHelpAndVersion(t *testing.T) {
	bin := bins.Dir(t)
	out, errs, code := runBin(bin+"/rampartd", "--help")
	if code != 0 || errs != "" {
		t.Fatalf("rampartd --help: exit %d, stderr %q", code, errs)
	}
	for _, want := range []string{"Rampart agent", "needs root", "/sys/fs/bpf", "network namespace", "veth",
		"net.ipv4.ip_forward", "routing rule", "--uninstall", "previous value", "/run/rampart/<instance>.sock", "-bpf-dir", "-version"} {
		if !strings.Contains(out, want) {
			t.Errorf("rampartd --help does not say %q:\n%s", want, out)
		}
	}
	out, _, code = runBin(bin+"/rampartd", "--version")
	if want := "rampartd vtest-1.2.3 (revision feedbeef) " + runtime.Version() + "\n"; code != 0 || out != want {
		t.Errorf("rampartd --version: exit %d, %q; want %q", code, out, want)
	}
	out, _, code = runBin(bin+"/rampart", "--socket", filepath.Join(t.TempDir(), "none.sock"), "version")
	if want := "rampart vtest-1.2.3 (revision feedbeef) " + runtime.Version() + "\n"; code != 0 || !strings.HasPrefix(out, want) {
		t.Errorf("rampart version: exit %d, %q; want it to start with %q", code, out, want)
	}
	if _, errs, code := runBin(bin+"/rampartd", "--no-such-flag"); code != 2 || !strings.Contains(errs, "--help") {
		t.Errorf("rampartd --no-such-flag: exit %d, stderr %q; want 2 and a pointer to --help", code, errs)
	}
	// A bad IPv6 range is refused before anything is touched, naming the flag and why.
	if _, errs, code := runBin(bin+"/rampartd", "--pod-cidr", "198.18.0.0/16,2001:2::/120"); code != 2 || !strings.Contains(errs, "--pod-cidr: IPv6 prefix 2001:2::/120: 8 host bits, fewer than") {
		t.Errorf("rampartd --pod-cidr with a small IPv6 range: exit %d, stderr %q", code, errs)
	}
}

// TestCNIInstall: rampartd with --cni-bin-dir and --cni-conf-dir installs the rampart-cni
// binary beside it and its configuration list once it serves; the runtime's client (libcni)
// then gets an answer from the installed plugin (STATUS, through the agent); stopping the
// agent leaves both (an upgrade keeps the node ready), --uninstall removes both.
func TestCNIInstall(t *testing.T) {
	testenv.RequireRoot(t)
	bin := bins.Dir(t)
	_, flags := instanceFlags(t, "c", "198.18.1.0/24")
	socket := flagValue(flags, "--socket")
	root := t.TempDir()
	binDir, confDir := filepath.Join(root, "opt/cni/bin"), filepath.Join(root, "etc/cni/net.d")
	flags = append(flags, "--cni-bin-dir", binDir, "--cni-conf-dir", confDir)
	uninstalled := false
	t.Cleanup(func() {
		if !uninstalled {
			exec.Command(bin+"/rampartd", append(flags, "--uninstall")...).Run()
		}
	})
	var daemonLog testenv.SyncBuffer
	daemon := exec.Command(bin+"/rampartd", flags...)
	daemon.Stderr = &daemonLog
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if daemon.ProcessState == nil {
			daemon.Process.Kill()
			daemon.Wait()
		}
	})
	conflist := filepath.Join(confDir, "05-rampart.conflist")
	if !testenv.Eventually(20*time.Second, func() bool { _, err := os.Stat(conflist); return err == nil }) {
		t.Fatalf("no %s after 20s; agent log:\n%s", conflist, daemonLog.String())
	}
	want, _ := os.ReadFile(bin + "/rampart-cni")
	got, err := os.ReadFile(filepath.Join(binDir, "rampart-cni"))
	if err != nil || !bytes.Equal(got, want) || len(want) == 0 {
		t.Fatalf("installed plugin: %d bytes (error %v), want the %d bytes of the built rampart-cni", len(got), err, len(want))
	}
	list, err := libcni.ConfListFromFile(conflist)
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Plugins) != 1 || !bytes.Contains(list.Plugins[0].Bytes, []byte(`"socket":"`+socket+`"`)) {
		t.Fatalf("conflist %s does not name the agent's socket %s", list.Bytes, socket)
	}
	cni := libcni.NewCNIConfig([]string{binDir}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cni.GetStatusNetworkList(ctx, list); err != nil {
		t.Fatalf("STATUS through the installed plugin: %v\nagent log:\n%s", err, daemonLog.String())
	}

	daemon.Process.Signal(syscall.SIGTERM)
	if err := daemon.Wait(); err != nil {
		t.Fatalf("rampartd exit after SIGTERM: %v\n%s", err, daemonLog.String())
	}
	for _, p := range []string{conflist, filepath.Join(binDir, "rampart-cni")} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("after SIGTERM %s: %v, want it kept", p, err)
		}
	}
	if err := cni.GetStatusNetworkList(ctx, list); err == nil {
		t.Error("STATUS with the agent stopped: no error, want the plugin to report the agent down")
	}
	out, err := exec.Command(bin+"/rampartd", append(flags, "--uninstall")...).CombinedOutput()
	if err != nil {
		t.Fatalf("uninstall: %v\n%s", err, out)
	}
	uninstalled = true
	for _, p := range []string{conflist, filepath.Join(binDir, "rampart-cni")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left after uninstall (%v)", p, err)
		}
	}

	// Nothing of the instance left: a plain uninstall refuses; with --if-installed it
	// succeeds and still removes a plugin and configuration found there.
	if out, err := exec.Command(bin+"/rampartd", append(flags, "--uninstall")...).CombinedOutput(); err == nil || !strings.Contains(string(out), "no Rampart instance") {
		t.Errorf("second uninstall: %v\n%s\nwant an error saying no Rampart instance", err, out)
	}
	for _, p := range []string{conflist, filepath.Join(binDir, "rampart-cni")} {
		if err := os.WriteFile(p, []byte("{}"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if out, err := exec.Command(bin+"/rampartd", append(flags, "--uninstall", "--if-installed")...).CombinedOutput(); err != nil {
		t.Errorf("uninstall --if-installed with nothing installed: %v\n%s", err, out)
	}
	for _, p := range []string{conflist, filepath.Join(binDir, "rampart-cni")} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s left after uninstall --if-installed (%v)", p, err)
		}
	}
	if out, err := exec.Command(bin+"/rampartd", append(flags, "--idle")...).CombinedOutput(); err == nil {
		t.Errorf("--idle without --uninstall: no error, want a usage error\n%s", out)
	}

	// The plugin missing: the agent stops with an error naming it.
	missing := filepath.Join(root, "no-such-plugin")
	out, err = exec.Command(bin+"/rampartd", append(flags, "--cni-plugin", missing)...).CombinedOutput()
	exec.Command(bin+"/rampartd", append(flags, "--uninstall")...).Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), missing) {
		t.Errorf("rampartd with a missing --cni-plugin: %v\n%s\nwant exit 1 and an error naming %s", err, out, missing)
	}
	if _, err := os.Stat(conflist); !os.IsNotExist(err) {
		t.Errorf("with the plugin missing %s exists (%v), want none", conflist, err)
	}
}

// TestCNIInstallAfterSync: in Kubernetes mode the agent installs its CNI configuration
// only once it has applied the cluster's view. The real rampartd runs as deploy/'s
// ServiceAccount (impersonated) against an API server with RBAC, first with the
// NetworkPolicy rule taken from its ClusterRole: it serves, but cannot sync, and writes no
// conflist; with deploy/rbac.yaml applied whole it syncs, and only then the conflist
// appears.
func TestCNIInstallAfterSync(t *testing.T) {
	testenv.RequireRoot(t)
	bin := bins.Dir(t)
	k := k8stest.Start(t, k8stest.WithAuthorization("RBAC"))
	k.InstallCRDs(t)
	rbacFile := filepath.Join(testenv.ModuleRoot(t), "deploy", "rbac.yaml")
	if out, err := k.Kubectl("apply", "-f", rbacFile); err != nil {
		t.Fatalf("applying %s: %v\n%s", rbacFile, err, out)
	}
	ctx := context.Background()
	role, err := k.Client.RbacV1().ClusterRoles().Get(ctx, "rampart", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	full := len(role.Rules)
	role.Rules = slices.DeleteFunc(role.Rules, func(r rbacv1.PolicyRule) bool { return slices.Contains(r.Resources, "networkpolicies") })
	if len(role.Rules) != full-1 {
		t.Fatalf("deploy/rbac.yaml's ClusterRole has no networkpolicies rule")
	}
	if _, err := k.Client.RbacV1().ClusterRoles().Update(ctx, role, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Spec: corev1.NodeSpec{PodCIDR: "198.18.2.0/24"}}
	created, err := k.Client.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	created.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "198.18.255.2"}}
	if _, err := k.Client.CoreV1().Nodes().UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	kc, err := clientcmd.LoadFromFile(k.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range kc.AuthInfos {
		u.Impersonate = "system:serviceaccount:kube-system:rampart"
	}
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}

	inst := "s" + testenv.Suffix(8)
	sockDir, err := os.MkdirTemp("", "rp-sock-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(sockDir)
	root := t.TempDir()
	binDir, confDir := filepath.Join(root, "bin"), filepath.Join(root, "net.d")
	socket := filepath.Join(sockDir, "r.sock")
	flags := []string{"--instance", inst, "--state-dir", filepath.Join(root, "state"), "--socket", socket,
		"--bpf-dir", "/sys/fs/bpf/rampart/" + inst, "--node-netns", "rp-" + inst + "-node", "--cni-bin-dir", binDir, "--cni-conf-dir", confDir}
	t.Cleanup(func() {
		exec.Command(bin+"/rampartd", append(flags, "--pod-cidr", "198.18.2.0/24", "--uninstall")...).Run()
	})
	var daemonLog testenv.SyncBuffer
	daemon := exec.Command(bin+"/rampartd", append(flags, "--kubeconfig", kubeconfig, "--node-name", "node-1")...)
	daemon.Stderr = &daemonLog
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		daemon.Process.Signal(syscall.SIGTERM)
		daemon.Wait()
		if t.Failed() {
			t.Logf("agent log:\n%s", daemonLog.String())
		}
	})
	client := api.NewClient(socket)
	defer client.Close()
	status := func() (api.Status, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return client.Status(ctx)
	}
	if !testenv.Eventually(30*time.Second, func() bool { _, err := status(); return err == nil }) {
		t.Fatal("the agent does not serve")
	}
	conflist := filepath.Join(confDir, "05-rampart.conflist")
	// Serving but not synced: for a while (the informers retry the forbidden list), no
	// conflist.
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		st, err := status()
		if err != nil || st.Kubernetes == nil || st.Kubernetes.Synced {
			t.Fatalf("without the NetworkPolicy rule: status %+v (error %v), want serving, not synced", st.Kubernetes, err)
		}
		if _, err := os.Stat(conflist); err == nil {
			t.Fatal("the conflist is written before the agent synced")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if out, err := k.Kubectl("apply", "-f", rbacFile); err != nil {
		t.Fatalf("applying %s again: %v\n%s", rbacFile, err, out)
	}
	if !testenv.Eventually(90*time.Second, func() bool { _, err := os.Stat(conflist); return err == nil }) {
		t.Fatalf("no conflist 90s after the ClusterRole was completed")
	}
	if st, err := status(); err != nil || st.Kubernetes == nil || !st.Kubernetes.Synced {
		t.Fatalf("conflist written, status %+v (error %v), want synced", st.Kubernetes, err)
	}
}

// bins are rampartd, rampart and rampart-testserver, with a version and revision given at
// link time.
var bins = testenv.Binaries{
	Packages: []string{"./cmd/rampartd", "./cmd/rampart", "./cmd/rampart-cni", "./test/rampart-testserver"},
	LDFlags:  "-X github.com/rampartnet/rampart/internal/version.Version=vtest-1.2.3 -X github.com/rampartnet/rampart/internal/version.Revision=feedbeef",
}

func TestMain(m *testing.M) { bins.Main(m) }

func runBin(path string, args ...string) (string, string, int) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c := exec.CommandContext(ctx, path, args...)
	var out, errb bytes.Buffer
	c.Stdout, c.Stderr = &out, &errb
	err := c.Run()
	code := 0
	if err != nil {
		code = -1
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		}
	}
	return out.String(), errb.String(), code
}

// serveTCP runs a TCP echo server on ports (comma-separated) in endpoint key, with
// endpoint exec, until the test ends.
func serveTCP(t *testing.T, bin, sockDir, key, ports string) {
	t.Helper()
	srv := exec.Command(bin+"/rampart", "--socket", filepath.Join(sockDir, "r.sock"), "endpoint", "exec", key, "--",
		bin+"/rampart-testserver", "serve", "--tcp", ports)
	srvOut := &testenv.SyncBuffer{}
	srv.Stdout = srvOut
	srv.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // it lives until killed, with its children
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-srv.Process.Pid, syscall.SIGKILL)
		srv.Wait()
	})
	if !testenv.Eventually(5*time.Second, func() bool { return strings.Contains(srvOut.String(), "ready") }) {
		t.Fatal("test server did not start")
	}
}

func run(bin, sockDir string, args ...string) (string, string, int) {
	return runBin(bin+"/rampart", append([]string{"--socket", filepath.Join(sockDir, "r.sock")}, args...)...)
}

// instanceFlags are the flags of a test agent: instance prefix and a random suffix, its
// socket in a new directory (removed when the test ends), endpoints in podCIDR.
func instanceFlags(t *testing.T, prefix, podCIDR string) (sockDir string, flags []string) {
	t.Helper()
	inst := prefix + testenv.Suffix(8)
	sockDir, err := os.MkdirTemp("", "rp-sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	return sockDir, []string{"--instance", inst, "--state-dir", filepath.Join(t.TempDir(), "state"),
		"--socket", filepath.Join(sockDir, "r.sock"), "--bpf-dir", "/sys/fs/bpf/rampart/" + inst,
		"--node-netns", "rp-" + inst + "-node", "--pod-cidr", podCIDR}
}

// flagValue is the value of flag name in flags.
func flagValue(flags []string, name string) string {
	return flags[slices.Index(flags, name)+1]
}

// startDaemon starts rampartd with flags and extra; when the test ends it is killed and
// the instance uninstalled. Its log is the buffer returned.
func startDaemon(t *testing.T, bin string, flags []string, extra ...string) (*exec.Cmd, *testenv.SyncBuffer) {
	t.Helper()
	log := &testenv.SyncBuffer{}
	daemon := exec.Command(bin+"/rampartd", append(slices.Clone(flags), extra...)...)
	daemon.Stderr = log
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		daemon.Process.Kill()
		daemon.Wait()
		if out, err := exec.Command(bin+"/rampartd", append(slices.Clone(flags), "--uninstall")...).CombinedOutput(); err != nil {
			t.Errorf("uninstall: %v\n%s", err, out)
		}
	})
	return daemon, log
}

// startServing starts rampartd (startDaemon) with extra, which asks it to serve over HTTP on
// 127.0.0.1 port 0 (the kernel picks a free port), and returns once the agent serves the
// CLI and has logged msg with the address it took; it returns that address and the log.
func startServing(t *testing.T, bin, sockDir string, flags []string, msg string, extra ...string) (string, *testenv.SyncBuffer) {
	t.Helper()
	_, log := startDaemon(t, bin, flags, extra...)
	return awaitServing(t, bin, sockDir, log, msg)[0], log
}

// awaitServing returns once the agent at sockDir serves the CLI and has logged each of
// msgs with the 127.0.0.1 address it took, in log; it returns those addresses, in the
// order of msgs.
func awaitServing(t *testing.T, bin, sockDir string, log fmt.Stringer, msgs ...string) []string {
	t.Helper()
	addrs := make([]string, len(msgs))
	if !testenv.Eventually(10*time.Second, func() bool {
		for i, msg := range msgs {
			m := regexp.MustCompile(`msg="` + regexp.QuoteMeta(msg) + `" address=(127\.0\.0\.1:[0-9]+)`).FindStringSubmatch(log.String())
			if m == nil {
				return false
			}
			addrs[i] = m[1]
		}
		_, _, code := run(bin, sockDir, "status")
		return code == 0
	}) {
		t.Fatalf("rampartd did not come up with %q:\n%s", msgs, log.String())
	}
	return addrs
}

// mustCLI returns a function that runs the CLI against the agent at sockDir and fails the
// test, with the agent's log, unless it exits 0.
func mustCLI(t *testing.T, bin, sockDir string, log fmt.Stringer) func(args ...string) string {
	return func(args ...string) string {
		t.Helper()
		out, errs, code := run(bin, sockDir, args...)
		if code != 0 {
			t.Fatalf("rampart %v: exit %d: %s %s\nagent log:\n%s", args, code, out, errs, log.String())
		}
		return out
	}
}

// prober returns a probe that says whether endpoint from connects to the TCP address to
// within 500 ms (one SYN: the first retransmission would come after a second).
func prober(bin, sockDir, from, to string) func() bool {
	return func() bool {
		_, _, code := run(bin, sockDir, "endpoint", "exec", from, "--", bin+"/rampart-testserver", "probe", "--tcp", to, "--timeout", "500ms")
		return code == 0
	}
}

// defaultDenyFile writes a NetworkPolicy that isolates the ingress of namespace ns's
// endpoints and returns its path.
func defaultDenyFile(t *testing.T, ns string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "deny.yaml")
	doc := "apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {name: deny, namespace: " + ns + "}\nspec:\n  podSelector: {}\n  policyTypes: [Ingress]\n"
	if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

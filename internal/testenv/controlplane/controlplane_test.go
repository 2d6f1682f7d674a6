package controlplane

import (
	"context"
	"crypto/x509"
	"encoding/pem"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
)

// A component that dies at start ends Start at once with an error that names it and quotes
// its log, and nothing is left running; without the binaries Start says how to build them.
func TestStartReportsComponentFailure(t *testing.T) {
	bin := t.TempDir()
	for name, script := range map[string]string{
		"etcd":           "#!/bin/sh\necho 'etcd: unknown flag --bogus' >&2\nexit 3\n",
		"kube-apiserver": "#!/bin/sh\nexit 0\n",
	} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err := Start(ctx, Config{BinDir: bin, Dir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "etcd exited before it was ready") || !strings.Contains(err.Error(), "unknown flag --bogus") {
		t.Fatalf("Start: %v; want etcd's exit and its log", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Start took %v to notice etcd exited", d)
	}

	_, err = Start(ctx, Config{BinDir: t.TempDir(), Dir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "scripts/build-k8s.sh") {
		t.Errorf("Start without binaries: %v; want it to name scripts/build-k8s.sh", err)
	}
}

// A port taken between choosing and binding it makes Start try again on new ports, three
// times in all.
func TestStartRetriesTakenPort(t *testing.T) {
	bin := t.TempDir()
	count := filepath.Join(t.TempDir(), "count")
	for name, script := range map[string]string{
		"etcd":           "#!/bin/sh\necho x >> " + count + "\necho 'listen tcp 127.0.0.1:2379: bind: address already in use' >&2\nexit 1\n",
		"kube-apiserver": "#!/bin/sh\nexit 0\n",
	} {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := Start(ctx, Config{BinDir: bin, Dir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("Start: %v; want etcd's bind error", err)
	}
	b, err := os.ReadFile(count)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "x"); n != 3 {
		t.Errorf("etcd started %d times, want 3", n)
	}
}

// The credentials are written before anything starts: a kubeconfig that names the server,
// the CA file and the token, the token file, and the service-account key pair.
func TestWriteCredentials(t *testing.T) {
	serviceCIDR := netip.MustParsePrefix("198.19.236.0/24") // not the default: the certificate follows the option
	c := &ControlPlane{cfg: Config{Dir: t.TempDir(), Address: netip.MustParseAddr("127.0.0.1"), ServiceCIDR: serviceCIDR}, Server: "https://127.0.0.1:6443"}
	c.Kubeconfig = c.path("kubeconfig")
	if err := c.writeCredentials(); err != nil {
		t.Fatal(err)
	}
	kc, err := os.ReadFile(c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"server: https://127.0.0.1:6443", "certificate-authority: " + c.CAFile, "token: " + c.Token} {
		if !strings.Contains(string(kc), want) {
			t.Errorf("kubeconfig lacks %q:\n%s", want, kc)
		}
	}
	for _, f := range []string{"tokens.csv", "sa.key", "sa.pub", "apiserver.crt", "apiserver.key"} {
		b, err := os.ReadFile(c.path(f))
		if err != nil || len(b) == 0 {
			t.Errorf("%s: %v (%d bytes)", f, err, len(b))
		}
	}
	// Pods reach the API server at the kubernetes Service's cluster IP and check the
	// certificate against it.
	pemBytes, err := os.ReadFile(c.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		t.Fatalf("%s holds no PEM block", c.CAFile)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.KubernetesServiceIP(); got != netip.MustParseAddr("198.19.236.1") {
		t.Errorf("kubernetes Service IP %v, want the first address of %v", got, serviceCIDR)
	}
	if err := cert.VerifyHostname(c.KubernetesServiceIP().String()); err != nil {
		t.Errorf("serving certificate (IPs %v): %v", cert.IPAddresses, err)
	}
}

// Alive tells a running process from an ended one, zombies included.
func TestAlive(t *testing.T) {
	if !Alive(os.Getpid()) {
		t.Error("this process not alive")
	}
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Not waited for yet: once it has exited it is a zombie.
	if !testenv.Eventually(5*time.Second, func() bool { return !Alive(cmd.Process.Pid) }) {
		t.Error("exited, unreaped child still alive")
	}
	cmd.Wait()
	if Alive(cmd.Process.Pid) {
		t.Error("reaped child alive")
	}
}

// Package controlplane starts a real Kubernetes control plane on this machine: one etcd and
// one kube-apiserver, both on 127.0.0.1 (the API server on Config.Address if set) with free
// ports, their state in one directory. The binaries are the ones scripts/build-k8s.sh builds (BinDir). It is what the cluster tests
// (internal/testenv/k8stest) and scripts/cluster.sh start; it knows nothing of Rampart.
//
// The API server runs with what a single-machine test cluster needs and nothing else: token
// authentication (one admin token, group system:masters), AlwaysAllow authorization, a
// self-signed serving certificate and a service-account key pair made here in Go, a service
// range inside 198.18.0.0/15 (the project's test range; nothing routes it; Config.ServiceCIDR), and
// --endpoint-reconciler-type=none, without which a loopback advertise address is refused.
package controlplane

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// DefaultServiceCIDR is the API server's service range unless Config.ServiceCIDR says
// another: the top of the project's test range 198.18.0.0/15, away from the addresses tests
// give namespaces. Service addresses are only allocated; nothing on this machine routes
// them.
var DefaultServiceCIDR = netip.MustParsePrefix("198.19.255.0/24")

// KubernetesServiceIP is the cluster IP the API server gives the default/kubernetes Service
// in the service range serviceCIDR: its first address. Pods reach the API server there
// (in-cluster configuration, KUBERNETES_SERVICE_HOST), so the serving certificate names it.
func KubernetesServiceIP(serviceCIDR netip.Prefix) netip.Addr {
	return serviceCIDR.Masked().Addr().Next()
}

// Config says where the binaries are and where the control plane keeps its state.
type Config struct {
	// BinDir holds etcd and kube-apiserver (scripts/build-k8s.sh --dir).
	BinDir string
	// Dir is the state directory (etcd data, keys, certificates, kubeconfig, logs). It is
	// created if missing; Stop leaves it (the caller owns it).
	Dir string
	// Detach starts the processes in their own session, so they outlive the caller
	// (scripts/cluster.sh). Otherwise they are killed when the calling thread's process exits
	// (Pdeathsig), so a crashed test leaves nothing running.
	Detach bool
	// Address is the API server's bind and advertise address (default 127.0.0.1): a real
	// node's kubelet, in a network namespace of its own, reaches the API server only on an
	// address of a link into that namespace's network. etcd stays on 127.0.0.1.
	Address netip.Addr
	// ServiceCIDR is the API server's service range (default DefaultServiceCIDR): clusters
	// that run side by side on one host, each with routes and a DNS address of its own in
	// the host's network namespace, take ranges that do not overlap.
	ServiceCIDR netip.Prefix
	// Authorization is the API server's --authorization-mode (default AlwaysAllow). RBAC
	// makes it enforce roles, for tests of what an identity may do (deploy/'s ClusterRole);
	// the admin user is in system:masters and may do everything either way.
	Authorization string
	// ServiceAccounts keeps the API server's ServiceAccount admission plugin on, so every
	// pod gets its service account's token and the cluster's CA mounted (what a pod's
	// in-cluster configuration reads, e.g. the agent's DaemonSet). It needs a
	// kube-controller-manager with ServiceAccountKey and CAFile to create each
	// namespace's "default" account and publish the CA: without one, pods are refused.
	ServiceAccounts bool
	// ReadyTimeout bounds each wait for a component to become ready (default 90 s: on a
	// loaded 2-core machine the API server's first start takes well over its usual 3 s).
	ReadyTimeout time.Duration
}

// ControlPlane is a running etcd and kube-apiserver.
type ControlPlane struct {
	cfg Config
	// Kubeconfig is the path of a kubeconfig for the admin user (cluster "rampart").
	Kubeconfig string
	// Server is the API server's URL (https://127.0.0.1:port, or Config.Address).
	Server string
	// Token is the admin user's bearer token.
	Token string
	// CAFile is the PEM certificate that verifies the API server.
	CAFile string
	// EtcdURL is etcd's client URL.
	EtcdURL string

	etcdPeerURL string
	apiPort     int
	etcd        *Process
	apiserver   *Process
	extra       []*Process // AddAPIServer's
}

// Process is one started component.
type Process struct {
	Name string
	Cmd  *exec.Cmd
	Log  string // file holding its stdout and stderr
	done chan struct{}
	err  error
}

// Exited reports whether the process has ended.
func (p *Process) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Start starts etcd, then the API server, and returns when the API server's /readyz says ok.
// On error everything it started is stopped again.
func Start(ctx context.Context, cfg Config) (_ *ControlPlane, err error) {
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 90 * time.Second
	}
	if !cfg.Address.IsValid() {
		cfg.Address = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	}
	if !cfg.ServiceCIDR.IsValid() {
		cfg.ServiceCIDR = DefaultServiceCIDR
	}
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(cfg.BinDir, b)); err != nil {
			return nil, fmt.Errorf("control plane binary: %w (build it with scripts/build-k8s.sh)", err)
		}
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("control plane directory: %w", err)
	}
	c := &ControlPlane{cfg: cfg, Kubeconfig: filepath.Join(cfg.Dir, "kubeconfig")}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	// The ports are free when chosen, but another process may bind one before the component
	// does: then start again on new ports, a few times.
	for attempt := 1; ; attempt++ {
		err = c.startOnFreePorts(ctx)
		if err == nil {
			return c, nil
		}
		if attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			return nil, err
		}
		c.Stop()
		if err := os.RemoveAll(c.path("etcd")); err != nil {
			return nil, err
		}
	}
}

func (c *ControlPlane) startOnFreePorts(ctx context.Context) error {
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	c.EtcdURL = "http://127.0.0.1:" + strconv.Itoa(ports[0])
	c.etcdPeerURL = "http://127.0.0.1:" + strconv.Itoa(ports[1])
	c.Server = "https://" + netip.AddrPortFrom(c.cfg.Address, uint16(ports[2])).String()
	if err := c.writeCredentials(); err != nil {
		return err
	}
	if err := c.StartEtcd(ctx); err != nil {
		return err
	}
	return c.startAPIServer(ctx, ports[2])
}

// freePorts returns n distinct ports free on 127.0.0.1 now.
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("finding a free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// writeCredentials writes the admin token, the service-account key pair, the serving
// certificate and the kubeconfig into the state directory.
func (c *ControlPlane) writeCredentials() error {
	tok := make([]byte, 16)
	if _, err := rand.Read(tok); err != nil {
		return err
	}
	c.Token = hex.EncodeToString(tok)
	// token,user,uid,"group": system:masters is what AlwaysAllow makes moot, but keeps the
	// user an administrator should authorization ever be switched on.
	if err := writeFile(c.path("tokens.csv"), c.Token+`,admin,admin,"system:masters"`+"\n"); err != nil {
		return err
	}

	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return fmt.Errorf("service-account key: %w", err)
	}
	saPub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return fmt.Errorf("service-account key: %w", err)
	}
	if err := writePEM(c.path("sa.key"), "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(sa)); err != nil {
		return err
	}
	if err := writePEM(c.path("sa.pub"), "PUBLIC KEY", saPub); err != nil {
		return err
	}

	// A self-signed serving certificate that is its own CA: the kubeconfig trusts exactly it.
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("serving key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: "rampart-kube-apiserver"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		IsCA:                  true,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), c.cfg.Address.AsSlice(), c.KubernetesServiceIP().AsSlice()},
		DNSNames:              []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return fmt.Errorf("serving certificate: %w", err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	c.CAFile = c.path("apiserver.crt")
	if err := writePEM(c.CAFile, "CERTIFICATE", der); err != nil {
		return err
	}
	if err := writePEM(c.path("apiserver.key"), "EC PRIVATE KEY", keyDER); err != nil {
		return err
	}
	return writeFile(c.Kubeconfig, fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: rampart
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: admin
  user:
    token: %s
contexts:
- name: rampart
  context:
    cluster: rampart
    user: admin
current-context: rampart
`, c.Server, c.CAFile, c.Token))
}

func (c *ControlPlane) path(name string) string { return filepath.Join(c.cfg.Dir, name) }

// EtcdPid and APIServerPid are the processes' ids (0 when not running).
func (c *ControlPlane) EtcdPid() int      { return c.etcd.pid() }
func (c *ControlPlane) APIServerPid() int { return c.apiserver.pid() }

func (p *Process) pid() int {
	if p == nil || p.Exited() {
		return 0
	}
	return p.Cmd.Process.Pid
}

// ServiceCIDR is the API server's service range (Config.ServiceCIDR).
func (c *ControlPlane) ServiceCIDR() netip.Prefix { return c.cfg.ServiceCIDR }

// KubernetesServiceIP is the default/kubernetes Service's cluster IP in the API server's
// service range.
func (c *ControlPlane) KubernetesServiceIP() netip.Addr {
	return KubernetesServiceIP(c.cfg.ServiceCIDR)
}

// ServiceAccountKey is the file of the private key service-account tokens are signed with
// (what kube-controller-manager's --service-account-private-key-file takes).
func (c *ControlPlane) ServiceAccountKey() string { return c.path("sa.key") }

func writeFile(path, s string) error {
	if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

func writePEM(path, typ string, der []byte) error {
	return writeFile(path, string(pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})))
}

// StartEtcd starts etcd on the state directory's data dir and waits until it is healthy.
// After StopEtcd it starts etcd again on the same data and ports.
func (c *ControlPlane) StartEtcd(ctx context.Context) error {
	if c.etcd != nil && !c.etcd.Exited() {
		return errors.New("etcd is already running")
	}
	p, err := c.start("etcd",
		"--name=rampart",
		"--data-dir="+c.path("etcd"),
		"--listen-client-urls="+c.EtcdURL,
		"--advertise-client-urls="+c.EtcdURL,
		"--listen-peer-urls="+c.etcdPeerURL,
		"--initial-advertise-peer-urls="+c.etcdPeerURL,
		"--initial-cluster=rampart="+c.etcdPeerURL,
		"--log-level=warn",
	)
	if err != nil {
		return err
	}
	c.etcd = p
	hc := &http.Client{Timeout: time.Second}
	return c.waitReady(ctx, p, func() bool {
		resp, err := hc.Get(c.EtcdURL + "/health")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		b.ReadFrom(resp.Body)
		return resp.StatusCode == http.StatusOK && strings.Contains(b.String(), `"health":"true"`)
	})
}

// StopEtcd stops etcd (SIGTERM, then SIGKILL after 10 s), leaving its data.
func (c *ControlPlane) StopEtcd() error {
	if c.etcd == nil {
		return nil
	}
	return c.etcd.stop()
}

// StopAPIServer kills the API server (SIGKILL: an outage, not a graceful shutdown, which
// waits for open watches); etcd keeps running.
func (c *ControlPlane) StopAPIServer() error {
	if c.apiserver == nil || c.apiserver.Exited() {
		return nil
	}
	c.apiserver.Cmd.Process.Kill()
	<-c.apiserver.done
	return nil
}

// StartAPIServer starts the API server again after StopAPIServer, on the same port and
// credentials, and waits until it is ready.
func (c *ControlPlane) StartAPIServer(ctx context.Context) error {
	if c.apiserver != nil && !c.apiserver.Exited() {
		return errors.New("kube-apiserver is already running")
	}
	return c.startAPIServer(ctx, c.apiPort)
}

func (c *ControlPlane) startAPIServer(ctx context.Context, port int) error {
	c.apiPort = port
	p, err := c.start("kube-apiserver", c.apiServerArgs(port)...)
	if err != nil {
		return err
	}
	c.apiserver = p
	return c.waitReady(ctx, p, c.Ready)
}

func (c *ControlPlane) authorization() string {
	if c.cfg.Authorization == "" {
		return "AlwaysAllow"
	}
	return c.cfg.Authorization
}

func (c *ControlPlane) apiServerArgs(port int) []string {
	args := []string{
		"--etcd-servers=" + c.EtcdURL,
		"--bind-address=" + c.cfg.Address.String(),
		"--advertise-address=" + c.cfg.Address.String(),
		"--secure-port=" + strconv.Itoa(port),
		"--endpoint-reconciler-type=none",
		"--authorization-mode=" + c.authorization(),
		"--token-auth-file=" + c.path("tokens.csv"),
		"--tls-cert-file=" + c.CAFile,
		"--tls-private-key-file=" + c.path("apiserver.key"),
		"--cert-dir=" + c.path("certs"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + c.path("sa.pub"),
		"--service-account-signing-key-file=" + c.path("sa.key"),
		"--service-cluster-ip-range=" + c.cfg.ServiceCIDR.String(),
		"--allow-privileged=true",
		// A node's name resolves nowhere here: exec, logs and port-forward reach the
		// kubelet at the node's InternalIP.
		"--kubelet-preferred-address-types=InternalIP",
		"--profiling=false",
	}
	if !c.cfg.ServiceAccounts {
		// Unless a controller manager runs to create each namespace's "default" service
		// account, this admission plugin would refuse every pod.
		args = append(args, "--disable-admission-plugins=ServiceAccount")
	}
	return args
}

// AddAPIServer starts a second API server on the same etcd (on a free port) and returns
// its URL and a kubeconfig for it: clients of the first one do not see it, so a test can
// change the cluster while the first is stopped. It is stopped with the control plane.
func (c *ControlPlane) AddAPIServer(ctx context.Context) (server, kubeconfig string, err error) {
	ports, err := freePorts(1)
	if err != nil {
		return "", "", err
	}
	p, err := c.startBinary("kube-apiserver-2", "kube-apiserver", c.apiServerArgs(ports[0])...)
	if err != nil {
		return "", "", err
	}
	c.extra = append(c.extra, p)
	server = "https://" + netip.AddrPortFrom(c.cfg.Address, uint16(ports[0])).String()
	kc, err := os.ReadFile(c.Kubeconfig)
	if err != nil {
		return "", "", err
	}
	kubeconfig = c.path("kubeconfig-2")
	if err := writeFile(kubeconfig, strings.ReplaceAll(string(kc), c.Server, server)); err != nil {
		return "", "", err
	}
	saved := c.Server
	ready := func() bool {
		c.Server = server
		defer func() { c.Server = saved }()
		return c.Ready()
	}
	return server, kubeconfig, c.waitReady(ctx, p, ready)
}

// Ready reports whether the API server's /readyz answers ok now (one request, 1 s timeout).
func (c *ControlPlane) Ready() bool {
	pool := x509.NewCertPool()
	pemData, err := os.ReadFile(c.CAFile)
	if err != nil || !pool.AppendCertsFromPEM(pemData) {
		return false
	}
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	defer hc.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodGet, c.Server+"/readyz", nil)
	if err != nil {
		return false
	}
	req.Header.Set("Authorization", "Bearer "+c.Token)
	resp, err := hc.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// waitReady polls ready until it holds, the process exits, ctx ends or ReadyTimeout passes.
func (c *ControlPlane) waitReady(ctx context.Context, p *Process, ready func() bool) error {
	deadline := time.Now().Add(c.cfg.ReadyTimeout)
	for {
		if ready() {
			return nil
		}
		if p.Exited() {
			return fmt.Errorf("%s exited before it was ready (%v); its log %s ends:\n%s", p.Name, p.err, p.Log, LogTail(p.Log, 20))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v; its log %s ends:\n%s", p.Name, c.cfg.ReadyTimeout, p.Log, LogTail(p.Log, 20))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", p.Name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// LogTail returns the last n lines of a log file.
func LogTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func (c *ControlPlane) start(name string, args ...string) (*Process, error) {
	return c.startBinary(name, name, args...)
}

// startBinary starts binary as the component name (its log and pid files).
func (c *ControlPlane) startBinary(name, binary string, args ...string) (*Process, error) {
	logPath := c.path(name + ".log")
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(c.cfg.BinDir, binary), args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = c.cfg.Dir
	if c.cfg.Detach {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	} else {
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{Name: name, Cmd: cmd, Log: logPath, done: make(chan struct{})}
	if c.cfg.Detach {
		// Nobody waits for a detached process: it is meant to outlive this one.
		if err := os.WriteFile(c.path(name+".pid"), []byte(strconv.Itoa(cmd.Process.Pid)+"\n"), 0o600); err != nil {
			return nil, err
		}
		go func() { p.err = cmd.Wait(); close(p.done) }()
		return p, nil
	}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	return p, nil
}

// stop sends SIGTERM and waits up to 10 s for the process to exit, then kills it.
func (p *Process) stop() error {
	if p.Exited() {
		return nil
	}
	p.Cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
	}
	p.Cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("%s did not stop on SIGTERM within 10 s: killed", p.Name)
}

// Stop stops the API server, then etcd. The state directory stays.
func (c *ControlPlane) Stop() error {
	var errs []error
	for _, p := range append(append([]*Process{}, c.extra...), c.apiserver, c.etcd) {
		if p != nil {
			errs = append(errs, p.stop())
		}
	}
	return errors.Join(errs...)
}

// StopDetached stops the processes a detached control plane in dir left running (their
// pid files), for scripts/cluster.sh stop: SIGTERM, then SIGKILL after 10 s.
func StopDetached(dir string) error {
	var errs []error
	for _, name := range []string{"kube-apiserver", "etcd"} {
		pidFile := filepath.Join(dir, name+".pid")
		b, err := os.ReadFile(pidFile)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", pidFile, err))
			continue
		}
		if err := StopPid(pid, name); err != nil {
			errs = append(errs, err)
		}
		os.Remove(pidFile)
	}
	return errors.Join(errs...)
}

// StopPid stops pid if it is still the named binary (a pid file may be stale).
func StopPid(pid int, name string) error {
	exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil || filepath.Base(exe) != name {
		return nil // gone, or the pid now belongs to someone else
	}
	syscall.Kill(pid, syscall.SIGTERM)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if !Alive(pid) {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	syscall.Kill(pid, syscall.SIGKILL)
	return fmt.Errorf("%s (pid %d) did not stop on SIGTERM within 10 s: killed", name, pid)
}

// Alive reports whether pid is a running process: it exists and is not a zombie (a
// detached component's parent has exited, and whether anyone reaps it depends on the
// machine's init).
func Alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z'
}

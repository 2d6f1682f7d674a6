// Command clusterctl starts and stops, for people, a Kubernetes cluster on this machine that
// outlives it: scripts/cluster.sh runs it. The cluster is the one the real-node tests start
// (internal/testenv/nodetest): kube-apiserver and etcd, kube-scheduler and
// kube-controller-manager, and per node containerd, kubelet and kube-proxy; Rampart is
// installed on it as users install it, `kubectl apply -R -f deploy/` from its image. A
// process of clusterctl's own holds the cluster (what the tests do in `go test`) until
// `clusterctl stop` asks it to remove everything.
//
//	clusterctl start -dir DIR [-nodes N] [-tunnel MODE] [-image ARCHIVE] [-dns] [-extra-image ARCHIVE]...
//	    start the cluster (-nodes 0: the control plane alone, with Rampart's CRDs) in the
//	    background, wait until it is ready, print the kubeconfig path; -extra-image
//	    archives (an application's, say the DVD rental demo's) are imported into every
//	    node beside Rampart's
//	clusterctl stop -dir DIR
//	    stop the cluster and remove what it made
package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rampartnet/rampart/internal/testenv"
	"github.com/rampartnet/rampart/internal/testenv/controlplane"
	"github.com/rampartnet/rampart/internal/testenv/k8stest"
	"github.com/rampartnet/rampart/internal/testenv/nodetest"
)

// config is what start passes to the process that holds the cluster.
type config struct {
	Dir    string
	Nodes  int
	Tunnel string
	Image  string
	DNS    bool
	// Extra are more image archives for the nodes (nodetest.Options.Images).
	Extra []string
}

// archives is a repeatable flag of image archive paths.
type archives []string

func (a *archives) String() string     { return strings.Join(*a, ",") }
func (a *archives) Set(s string) error { *a = append(*a, s); return nil }

// state is DIR/cluster.json, written once the cluster is ready.
type state struct {
	PID        int      `json:"pid"` // the process holding the cluster
	Kubeconfig string   `json:"kubeconfig"`
	Nodes      []string `json:"nodes"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: clusterctl start|stop -dir DIR [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	var cfg config
	fs.StringVar(&cfg.Dir, "dir", "", "state directory (kubeconfig, cluster.json, clusterctl.log)")
	fs.IntVar(&cfg.Nodes, "nodes", 2, "number of nodes (0: the control plane alone)")
	fs.StringVar(&cfg.Tunnel, "tunnel", "", "deploy/config.yaml's tunnel for the agents (default: the manifest's, native)")
	fs.StringVar(&cfg.Image, "image", "", "Rampart's image archive (scripts/build-image.sh; default: build it)")
	fs.BoolVar(&cfg.DNS, "dns", false, "run the cluster DNS (CoreDNS, scripts/build-coredns.sh)")
	fs.Var((*archives)(&cfg.Extra), "extra-image", "another image archive imported into every node (repeatable)")
	fs.Parse(os.Args[2:])
	if cfg.Dir == "" {
		fmt.Fprintln(os.Stderr, "clusterctl: -dir is required")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "start":
		err = start(cfg)
	case "hold":
		err = hold(cfg)
	case "stop":
		err = stop(cfg.Dir)
	default:
		err = fmt.Errorf("unknown command %q", os.Args[1])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "clusterctl:", err)
		os.Exit(1)
	}
}

// start runs `clusterctl hold` in a session of its own, its output to DIR/clusterctl.log,
// and waits until it wrote cluster.json (ready) or exited (failed: the log says why).
// Interrupted, it stops the holder, which removes what it started.
func start(cfg config) error {
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return err
	}
	logPath := filepath.Join(cfg.Dir, "clusterctl.log")
	log, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer log.Close()
	self, err := os.Executable()
	if err != nil {
		return err
	}
	args := []string{"hold", "-dir", cfg.Dir, "-nodes", fmt.Sprint(cfg.Nodes), "-tunnel", cfg.Tunnel, "-image", cfg.Image}
	if cfg.DNS {
		args = append(args, "-dns")
	}
	for _, a := range cfg.Extra {
		args = append(args, "-extra-image", a)
	}
	cmd := exec.Command(self, args...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting the cluster's holder: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-exited:
			return fmt.Errorf("the cluster did not start (%v); %s ends:\n%s", err, logPath, controlplane.LogTail(logPath, 40))
		case <-sigs:
			cmd.Process.Signal(syscall.SIGTERM)
			<-exited
			return errors.New("interrupted; what was started is stopped again")
		case <-tick.C:
			if s, err := readState(cfg.Dir); err == nil {
				fmt.Println(s.Kubeconfig)
				return nil
			}
		}
	}
}

// hold starts the cluster, writes DIR/kubeconfig and DIR/cluster.json, and keeps it until
// SIGTERM or SIGINT; then it removes everything it started, as a test's cleanups do.
func hold(cfg config) error {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	s := testenv.NewSession("clusterctl", os.Stderr)
	var st state
	started := make(chan error, 1)
	go func() {
		started <- s.Run(func(t testing.TB) { st = startCluster(t, cfg) })
	}()
	var err error
	select {
	case err = <-started:
	case sig := <-sigs:
		fmt.Fprintf(os.Stderr, "clusterctl: %v while starting; stopping once the start returns\n", sig)
		<-started
		err = errors.New("interrupted")
	}
	if err == nil {
		st.PID = os.Getpid()
		err = writeState(cfg.Dir, st)
		if err == nil {
			fmt.Fprintf(os.Stderr, "clusterctl: cluster ready (kubeconfig %s); holding it until clusterctl stop\n", st.Kubeconfig)
			fmt.Fprintf(os.Stderr, "clusterctl: %v: stopping the cluster\n", <-sigs)
		}
	}
	os.Remove(filepath.Join(cfg.Dir, "cluster.json"))
	if cerr := s.Close(); cerr != nil && err == nil {
		err = cerr
	}
	fmt.Fprintln(os.Stderr, "clusterctl: stopped")
	return err
}

// startCluster starts the control plane, and the nodes with Rampart installed from its
// image, and copies the kubeconfig into cfg.Dir.
func startCluster(t testing.TB, cfg config) state {
	var kubeconfig string
	var nodes []string
	if cfg.Nodes == 0 {
		k := k8stest.Start(t)
		k.InstallCRDs(t)
		kubeconfig = k.Kubeconfig
	} else {
		image := cfg.Image
		if image == "" {
			image, _ = nodetest.BuildImage(t)
		}
		c := nodetest.Start(t, nodetest.Options{Nodes: cfg.Nodes, WithoutAgents: true, Images: append([]string{image}, cfg.Extra...), DNS: cfg.DNS})
		settings := map[string]string{}
		if cfg.Tunnel != "" {
			settings["tunnel"] = cfg.Tunnel
		}
		ready := c.InstallRampart(settings)
		t.Logf("Rampart installed from %s: nodes Ready %v after kubectl apply", filepath.Base(image), ready.Round(100*time.Millisecond))
		t.Logf("process memory (RSS): %s", c.RSSReport())
		kubeconfig = c.Kubeconfig
		for _, n := range c.Nodes {
			nodes = append(nodes, n.Name)
		}
	}
	b, err := os.ReadFile(kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(cfg.Dir, "kubeconfig")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return state{Kubeconfig: path, Nodes: nodes}
}

func writeState(dir string, s state) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, ".cluster.json")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, "cluster.json"))
}

func readState(dir string) (state, error) {
	var s state
	b, err := os.ReadFile(filepath.Join(dir, "cluster.json"))
	if err != nil {
		return s, err
	}
	return s, json.Unmarshal(b, &s)
}

// stop asks the holder to stop the cluster and waits until it did (3 minutes at most,
// then it is killed, which leaves what it had not removed yet).
func stop(dir string) error {
	s, err := readState(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil // nothing runs, or a start that failed and removed what it made
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", filepath.Join(dir, "cluster.json"), err)
	}
	p, err := os.FindProcess(s.PID)
	if err != nil {
		return err
	}
	if err := p.Signal(syscall.SIGTERM); err != nil {
		return nil // already gone
	}
	if testenv.Eventually(3*time.Minute, func() bool { return p.Signal(syscall.Signal(0)) != nil }) {
		if strings.Contains(controlplane.LogTail(filepath.Join(dir, "clusterctl.log"), 5), "stopping failed") {
			return fmt.Errorf("stopping failed; %s ends:\n%s", filepath.Join(dir, "clusterctl.log"), controlplane.LogTail(filepath.Join(dir, "clusterctl.log"), 40))
		}
		return nil
	}
	p.Kill()
	return fmt.Errorf("the cluster's holder (pid %d) did not stop in 3 minutes: killed", s.PID)
}

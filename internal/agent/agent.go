package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/netip"
	"path/filepath"
	"reflect"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rampartnet/rampart/internal/agent/taps"
	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/podaddr"
)

// Agent is a running rampartd core. Create it with New, serve with Run.
type Agent struct {
	cfg     Config
	log     *slog.Logger
	eng     Engine
	net     Network
	dp      Kernel
	started time.Time

	listener net.Listener
	unlock   func() // releases the instance lock (lockInstance)
	// own records what the instance makes on the host (owned.go); host is false when
	// tests stand in for the network and the dataplane, which then record nothing.
	own  *owned
	host bool

	// mu serialises changes and guards the fields below it.
	mu       sync.Mutex
	model    *model
	cur      *desired
	ifindex  map[uint32]uint32 // ep id -> host veth ifindex
	degraded string
	prox     Proxy       // the L7 proxy, nil until some state has L7 rules (see proxy.go)
	dns      *dnsState   // the DNS proxy and the learnt names (dns.go)
	sets     *setStore   // the CIDR set files
	store    *stateStore // the state directory
	proxyErr string      // why the proxy could not be started
	// proxyRouted: the node namespace routes steered packets to the proxy (RouteToProxy).
	proxyRouted bool

	// applyTimes and applyFailures are the metrics' record of applyState (metrics.go);
	// propagation that of Kubernetes views (cluster.go).
	applyTimes    histogram
	applyFailures uint64
	propagation   histogram
	// taps is the taps subsystem (tapstep.go, internal/agent/taps), one of eng.subsystems.
	taps *taps.Subsystem

	k8s *k8sState // Kubernetes mode's record (cluster.go); nil outside it
	// hostDevs is host policy's state (host.go); nil without the host firewall.
	hostDevs *hostState

	view  atomic.Pointer[view] // read by the flow decorator without mu
	flows *flowHub

	readerDone chan struct{}
	sockDone   chan struct{} // readSockRequests ended
	// stopMonitors ends watchMonitors, which closes monitorsDone (nil: not started).
	stopMonitors chan struct{}
	monitorsDone chan struct{}
	closeOnce    sync.Once
	closeErr     error
}

// New starts an agent: it takes the API socket (refusing if another agent answers on it),
// loads the stored state, prepares the node namespace, opens the pinned dataplane,
// reattaches every endpoint's programs in place and re-applies the computed state.
// Endpoints keep their pinned policy and conntrack throughout.
func New(cfg Config) (*Agent, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	eng, err := newEngine(cfg)
	if err != nil {
		return nil, err
	}
	a := &Agent{
		cfg:         cfg,
		log:         cfg.Logger.With("instance", cfg.Instance),
		eng:         eng,
		net:         cfg.Network,
		ifindex:     map[uint32]uint32{},
		started:     time.Now(),
		flows:       newFlowHub(cfg.FlowHistory),
		applyTimes:  newHistogram(applyBounds),
		propagation: newHistogram(propagationBounds),
		readerDone:  make(chan struct{}),
		sockDone:    make(chan struct{}),
	}
	if cfg.Kubernetes != nil {
		a.k8s = &k8sState{parsed: map[string]parsedObject{}}
	}
	tapOpt := taps.Options{PodCIDR: cfg.PodCIDR, Parse: eng.Parse, Log: a.log}
	if cfg.Kubernetes != nil {
		tapOpt.Node = cfg.Kubernetes.NodeName
	}
	a.taps = taps.New(tapOpt)
	// The subsystems in the order of their steps (subsystem.go).
	a.eng.subsystems = []subsystem{tapStep{a.taps}}
	if a.net == nil {
		a.net = endpoint.Node{Instance: cfg.Instance, Netns: cfg.NodeNetns, PodCIDR: cfg.PodCIDR, PodCIDR6: cfg.PodCIDR6, MTU: overlay.PodMTU(cfg.Tunnel, cfg.VXLANUnderlay)}
	}
	// What the agent creates of its directories is recorded (owned.go).
	missing := append(missingDirs(filepath.Dir(cfg.Socket)), missingDirs(cfg.StateDir)...)
	// The socket first: a second agent for the same socket must stop before touching
	// anything of the first one's.
	a.listener, err = api.Listen(cfg.Socket)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			if a.dp.Close != nil { // the proxy and the DNS proxy run once the datapath is open
				a.closeProxy()
				a.closeDNS()
			}
			a.listener.Close()
			if a.dp.Close != nil {
				a.dp.Close()
			}
			if a.unlock != nil {
				a.unlock()
			}
		}
	}()
	m, alloc, err := a.load(missing)
	if err != nil {
		return nil, err
	}
	if err := a.setupKernel(m); err != nil {
		return nil, err
	}
	if err := a.resume(m, alloc); err != nil {
		return nil, err
	}
	a.startLoops()
	ok = true
	a.log.Info("agent started", "socket", cfg.Socket, "endpoints", len(m.endpoints), "policies", len(m.policies), "cidrSets", len(m.cidrsets), "taps", len(m.taps))
	return a, nil
}

// newEngine is the policy engine of cfg.
func newEngine(cfg Config) (Engine, error) {
	eng, err := cfg.Engine.withDefaults()
	if err != nil {
		return eng, err
	}
	eng.allowHost = cfg.HostTraffic == HostTrafficAllow
	if cfg.DualStack() {
		eng.router6 = podaddr.Router6(cfg.PodCIDR6)
	}
	eng.tunnel = cfg.Tunnel
	if cfg.Kubernetes != nil {
		eng.nodeAddr = cfg.Kubernetes.NodeAddress
	}
	return eng, nil
}

// load takes the instance's lock and ownership record (missing: the directories the
// agent is about to create), and restores the stored state: the model, the identities and
// the CIDR sets.
func (a *Agent) load(missing []string) (*model, *identity.Allocator, error) {
	cfg := a.cfg
	var err error
	if a.unlock, err = lockInstance(cfg.StateDir); err != nil {
		return nil, nil, err
	}
	// The host is the agent's own unless tests stand in for it.
	a.host = cfg.Network == nil && cfg.OpenKernel == nil
	if a.own, err = openOwned(cfg, missing, a.host); err != nil {
		return nil, nil, err
	}
	if err := a.own.save(); err != nil {
		return nil, nil, err
	}

	st, err := loadState(cfg.StateDir)
	if err != nil {
		return nil, nil, err
	}
	a.store = newStateStore(cfg.StateDir, st)
	if err := a.startDNS(st.FQDN); err != nil {
		return nil, nil, err
	}
	m, alloc, err := a.restore(st)
	if err != nil {
		return nil, nil, err
	}
	if a.k8s != nil {
		a.k8s.parsed = a.restoreAccepted(m)
	}
	a.sets = newSetStore(cfg.StateDir)
	if m.cidrsets, err = loadSetFiles(a.sets); err != nil {
		return nil, nil, err
	}
	return m, alloc, nil
}

// setupKernel prepares the node: its network namespace, the pinned dataplane, the L7
// proxy's steering, the overlay and the host's devices, each recorded as the agent's
// before it is made.
func (a *Agent) setupKernel(m *model) error {
	cfg := a.cfg
	if a.host {
		if err := a.own.recordNode(a.net.(endpoint.Node)); err != nil {
			return fmt.Errorf("recording the node's set-up: %w", err)
		}
	}
	if err := a.net.Setup(); err != nil {
		return fmt.Errorf("setting up node network namespace: %w", err)
	}
	open := cfg.OpenKernel
	if open == nil {
		open = openKernel
	}
	var err error
	a.dp, err = open(cfg)
	if err != nil {
		return fmt.Errorf("opening datapath: %w", err)
	}
	a.taps.Attach(a.dp.Taps, a.dp.Monitors, a.net)
	if a.host {
		if err := a.own.recordProxyNamespace(a.net.NetnsPath()); err != nil {
			return fmt.Errorf("recording the proxy's set-up: %w", err)
		}
	}
	if err := a.dp.SetupProxy(a.net.NetnsPath(), cfg.ProxyListen, cfg.proxyListen6()); err != nil {
		return fmt.Errorf("setting up L7 proxy steering: %w", err)
	}
	if a.host && (cfg.Tunnel != overlay.Native && !a.own.OverlayDevice || !a.own.TapDevice) {
		a.own.OverlayDevice = a.own.OverlayDevice || cfg.Tunnel != overlay.Native
		a.own.TapDevice = true
		if err := a.own.save(); err != nil {
			return err
		}
	}
	if err := a.dp.SetupOverlay(a.net.NetnsPath(), cfg.Tunnel); err != nil {
		return err
	}
	if a.host && cfg.HostFirewall && !a.own.HostDevices {
		a.own.HostDevices = true
		if err := a.own.save(); err != nil {
			return err
		}
	}
	if err := a.setupHost(m); err != nil {
		return err
	}
	return nil
}

// resume brings the dataplane to the stored state: CIDR sets, endpoints reattached in
// place, the computed state applied and recorded, routes to the other nodes.
func (a *Agent) resume(m *model, alloc *identity.Allocator) error {
	cfg := a.cfg
	if len(cfg.NodeLabels) > 0 || a.k8s == nil {
		m.nodeLabels = cfg.NodeLabels
	}
	if len(m.cidrsets) > 0 {
		// The pinned tables still hold the sets; loading them again makes them equal to
		// the files, which are the record (a crash may have come between the two). Before
		// the programs are reattached: programs of an earlier version with other CIDR
		// tables must not be replaced by programs whose tables are still empty.
		if _, err := a.dp.ReplaceCIDRSets(datapathSets(m.cidrsets)); err != nil {
			return fmt.Errorf("re-applying stored CIDR sets: %w", err)
		}
	}
	a.dropGoneCNIEndpoints(m)
	for _, key := range sortedKeys(m.endpoints) {
		rec := m.endpoints[key]
		ifindex, err := a.reattach(rec)
		if err != nil {
			return err
		}
		a.ifindex[rec.EpID] = ifindex
	}
	d, err := a.eng.compute(m, alloc, a.net.Router(), nil)
	if err != nil {
		return err
	}
	a.removeStale()
	if err := a.applyState(emptyDesired(), d, m, true); err != nil {
		return fmt.Errorf("re-applying stored state: %w", err)
	}
	a.model, a.cur = m, d
	if err := a.attachHost(); err != nil {
		return err
	}
	if err := a.persist(m, d); err != nil {
		return err
	}
	if err := a.syncRoutes(m); err != nil {
		return err
	}
	return nil
}

// startLoops starts what runs for the agent's life: the flow reader, the send-side
// request reader, the monitors' watch and the FQDN expiry.
func (a *Agent) startLoops() {
	a.publishView()
	go a.readFlows()
	go a.readSockRequests(a.sockDone)
	a.stopMonitors, a.monitorsDone = make(chan struct{}), make(chan struct{})
	go a.watchMonitors(a.stopMonitors, a.monitorsDone)
	expiryCtx, stopExpiry := context.WithCancel(context.Background())
	a.dns.stop = stopExpiry
	go a.runExpiry(expiryCtx)
}

// restore rebuilds the model and allocator from a state file.
func (a *Agent) restore(st *stateFile) (*model, *identity.Allocator, error) {
	m := newModel()
	if st.PodCIDR.IsValid() && st.PodCIDR != a.cfg.PodCIDR && len(st.Endpoints) > 0 {
		return nil, nil, fmt.Errorf("pod CIDR %v differs from the stored %v, which endpoints use", a.cfg.PodCIDR, st.PodCIDR)
	}
	if st.PodCIDR.IsValid() && st.PodCIDR6 != a.cfg.PodCIDR6 && len(st.Endpoints) > 0 {
		// The endpoints' interfaces have the addresses of the stored range (or none):
		// reattaching them would leave them without the addresses the dataplane expects.
		return nil, nil, fmt.Errorf("IPv6 pod CIDR %v differs from the stored %v, which endpoints use (delete them first)", prefixOrNone(a.cfg.PodCIDR6), prefixOrNone(st.PodCIDR6))
	}
	for ns, l := range st.Namespaces {
		m.namespaces[ns] = l
	}
	for _, e := range st.Endpoints {
		// The IPv6 address follows from the IPv4 one: derived again, so that a record
		// an older agent wrote without it gets it.
		ip6, _, err := podaddr.Addrs(a.cfg.PodCIDR, a.cfg.PodCIDR6, e.IP)
		if err != nil {
			return nil, nil, fmt.Errorf("endpoint %s: %w", e.Key(), err)
		}
		if e.IP6 != ip6 {
			c := *e
			c.IP6 = ip6
			e = &c
		}
		m.endpoints[e.Key()] = e
		m.ensureNamespace(e.Namespace)
	}
	for _, n := range st.Nodes {
		m.nodes[n.Name] = n
	}
	for _, r := range st.Remotes {
		if _, ok := m.nodes[r.Node]; !ok {
			return nil, nil, fmt.Errorf("remote endpoint %s: node %q is not in the state", r.Key(), r.Node)
		}
		m.remotes[r.Key()] = r
		m.ensureNamespace(r.Namespace)
	}
	for _, sub := range a.eng.subsystems {
		if err := sub.load(st, m); err != nil {
			return nil, nil, err
		}
	}
	for _, r := range st.Services {
		m.services[r.Key()] = r
	}
	if a.k8s != nil {
		for _, rec := range st.Accepted {
			m.accepted[rec.Key] = rec
		}
		for _, r := range st.Quarantine {
			m.quarantine[r.IP] = r
		}
	}
	for _, rec := range st.Policies {
		rec.Raw = compactJSON(rec.Raw) // older agents wrote the state file indented
		p, err := a.eng.parseRecord(rec)
		if err != nil {
			return nil, nil, err
		}
		m.policies[rec.Key()] = &storedPolicy{rec: rec, pol: p}
	}
	if st.NextRuleID > 0 {
		m.nextRuleID = st.NextRuleID
	}
	if st.NextEpID > 0 {
		m.nextEpID = st.NextEpID
	}
	m.nodeLabels = st.NodeLabels
	m.fqdn = fqdnViewOf(a.dns.cache, m, time.Now())
	alloc := identity.NewAllocator()
	if len(st.Identities) > 0 {
		if err := alloc.UnmarshalJSON(st.Identities); err != nil {
			return nil, nil, fmt.Errorf("restoring identities: %w", err)
		}
	}
	return m, alloc, nil
}

// dropGoneCNIEndpoints removes from m the CNI endpoints whose runtime namespace is gone
// (the container ended while the agent was down): there is nothing to reattach, and the
// runtime's DEL, when it comes, finds nothing and succeeds. Their veths went with the
// namespace; a host side left over is deleted.
func (a *Agent) dropGoneCNIEndpoints(m *model) {
	for key, rec := range m.endpoints {
		if rec.CNI == nil || endpoint.IsNetns(rec.CNI.Netns) {
			continue
		}
		a.log.Warn("CNI endpoint's network namespace is gone, deleting the endpoint", "endpoint", key, "container", rec.CNI.ContainerID, "netns", rec.CNI.Netns)
		if err := a.net.DeleteLink(rec.Namespace, rec.Name); err != nil {
			a.log.Warn("deleting the veth of a gone CNI endpoint", "endpoint", key, "error", err)
		}
		delete(m.endpoints, key)
		a.quarantine(m, rec)
	}
}

// reattach finds a stored endpoint's veth (recreating the endpoint if its namespace is gone,
// e.g. after a reboot; a CNI endpoint's veth only, in the runtime's namespace) and attaches the programs, replacing the old ones in place.
func (a *Agent) reattach(rec *EndpointRecord) (uint32, error) {
	var ep endpoint.Endpoint
	var err error
	if rec.CNI != nil {
		ep, err = a.net.LookupIn(rec.Namespace, rec.Name, rec.IP, rec.CNI.attachment())
	} else {
		ep, err = a.net.Lookup(rec.Namespace, rec.Name, rec.IP)
	}
	if err != nil {
		a.log.Warn("endpoint missing, recreating it", "endpoint", rec.Key(), "error", err)
		if derr := a.deleteLinks(rec); derr != nil {
			return 0, fmt.Errorf("cleaning up endpoint %s: %w", rec.Key(), derr)
		}
		var ifindex uint32
		_, err = a.create(rec, func(hostIf string) error {
			var aerr error
			ifindex, aerr = a.dp.Attach(a.net.NetnsPath(), hostIf)
			return aerr
		})
		if err != nil {
			if ifindex != 0 {
				a.releaseLinks(rec.Key(), ifindex)
			}
			return 0, fmt.Errorf("recreating endpoint %s: %w", rec.Key(), err)
		}
		return ifindex, nil
	}
	ifindex, err := a.dp.Attach(a.net.NetnsPath(), ep.HostIfName)
	if err != nil {
		return 0, fmt.Errorf("attaching to endpoint %s: %w", rec.Key(), err)
	}
	if rec.Monitor {
		if err := a.monitorLinks(rec, ep); err != nil {
			return ifindex, err
		}
	}
	return ifindex, nil
}

// removeStale removes dataplane endpoints the state does not know (an endpoint deleted while
// the agent was down, or a crash in the middle of a delete), so their policy and identity do
// not linger on a reused interface index.
func (a *Agent) removeStale() {
	known := map[uint32]bool{}
	for _, idx := range a.ifindex {
		known[idx] = true
	}
	if a.hostDevs != nil {
		for _, idx := range a.hostDevs.ifindexes {
			known[idx] = true
		}
	}
	for idx, ep := range a.dp.InstalledEndpoints() {
		if known[idx] {
			continue
		}
		epID := ep.EpID
		if err := a.dp.RemoveEndpoint(idx, epID); err != nil {
			a.log.Warn("removing stale dataplane endpoint", "ifindex", idx, "ep_id", epID, "error", err)
		}
	}
}

// Run serves the API until ctx ends, then closes the agent. Enforcement continues after it
// returns: programs and maps are pinned.
func (a *Agent) Run(ctx context.Context) error {
	err := api.Serve(ctx, a.listener, api.NewHandler(a))
	return errors.Join(err, a.Close())
}

// Close stops the agent without removing anything from the dataplane.
func (a *Agent) Close() error {
	a.closeOnce.Do(func() {
		if a.monitorsDone != nil {
			// Before the dataplane closes: a check may be applying a change to it.
			close(a.stopMonitors)
			<-a.monitorsDone
		}
		a.listener.Close()
		// Envoy goes with the agent: nothing then listens for steered connections, and the
		// dataplane refuses them until the agent is back.
		perr := errors.Join(a.closeProxy(), a.closeDNS())
		a.closeErr = errors.Join(a.dp.Close(), perr)
		<-a.readerDone
		<-a.sockDone
		a.flows.close()
		a.unlock()
	})
	return a.closeErr
}

// Socket returns the path the agent serves on.
func (a *Agent) Socket() string { return a.cfg.Socket }

// persist writes what changed of the model and allocator to the state directory.
func (a *Agent) persist(m *model, d *desired) error {
	st := &stateFile{
		Version:    stateVersion,
		Instance:   a.cfg.Instance,
		PodCIDR:    a.cfg.PodCIDR,
		PodCIDR6:   a.cfg.PodCIDR6,
		Namespaces: m.namespaces,
		NodeLabels: m.nodeLabels,
		NextRuleID: m.nextRuleID,
		NextEpID:   m.nextEpID,
	}
	for _, p := range m.policies {
		st.Policies = append(st.Policies, p.rec)
	}
	for _, name := range sortedKeys(m.nodes) {
		st.Nodes = append(st.Nodes, m.nodes[name])
	}
	for _, key := range sortedKeys(m.remotes) {
		st.Remotes = append(st.Remotes, m.remotes[key])
	}
	for _, sub := range a.eng.subsystems {
		sub.save(m, d, st)
	}
	for _, key := range sortedKeys(m.services) {
		st.Services = append(st.Services, m.services[key])
	}
	for _, key := range sortedKeys(m.accepted) {
		st.Accepted = append(st.Accepted, m.accepted[key])
	}
	for _, ip := range sortedAddrs(m.quarantine) {
		st.Quarantine = append(st.Quarantine, m.quarantine[ip])
	}
	st.FQDN = a.dns.cache.Snapshot()
	ids, err := d.alloc.MarshalJSON()
	if err != nil {
		return fmt.Errorf("saving identities: %w", err)
	}
	st.Identities = ids
	if err := a.store.save(st, m.endpoints); err != nil {
		return fmt.Errorf("persisting state: %w", err)
	}
	return nil
}

// IPCache is the dataplane's address -> identity table.
type IPCache interface {
	// ApplyIPCache makes the ipcache equal to entries.
	ApplyIPCache(entries map[netip.Prefix]mapstate.IPCacheEntry) error
	// UpdateIPCache writes upsert's entries, then deletes remove's prefixes.
	UpdateIPCache(upsert map[netip.Prefix]mapstate.IPCacheEntry, remove []netip.Prefix) error
}

// applyState moves the dataplane from old to new: the L7 proxy's rules first, then ipcache
// additions and changes (so no endpoint's policy refers to an identity whose addresses are
// not known yet), then each endpoint whose identity or policy changed (or every endpoint
// with force), then ipcache deletions. On failure it tries to put old back and reports the
// failure.
func (a *Agent) applyState(old, new *desired, m *model, force bool) (err error) {
	start := time.Now()
	defer func() {
		a.applyTimes.observe(time.Since(start))
		if err != nil {
			a.applyFailures++
		}
	}()
	// After a failed rollback the dataplane may differ from a.cur anywhere: rewrite every
	// endpoint until a full apply succeeds.
	force = force || a.degraded != ""
	pl := buildL7Plans(old, new)
	err = a.applyOnce(old, new, pl, m, force)
	if err == nil {
		if force {
			a.degraded = ""
		}
		a.proxyPrune(old, new, pl)
		return nil
	}
	a.log.Error("applying dataplane state failed, restoring the previous state", "error", err)
	if rerr := a.applyOnce(new, old, buildL7Plans(new, old), m, true); rerr != nil {
		a.degraded = fmt.Sprintf("restoring the previous dataplane state failed: %v", rerr)
		a.log.Error("restoring previous dataplane state failed", "error", rerr)
	}
	return fmt.Errorf("applying dataplane state: %w", err)
}

func (a *Agent) applyOnce(old, new *desired, pl l7Plans, m *model, force bool) error {
	// The proxy first: it must know the L7 rules before the dataplane steers traffic to it.
	if err := a.proxyUpdate(old, new, pl); err != nil {
		return err
	}
	if err := a.dnsProxyUpdate(new); err != nil {
		return err
	}
	// The ipcache: additions and changes before the endpoints, deletions after. Forced
	// (start, rollback, repair) the whole map is made equal; otherwise only the difference
	// is written.
	var removed []netip.Prefix
	if force {
		merged := make(map[netip.Prefix]mapstate.IPCacheEntry, len(old.state.IPCache)+len(new.state.IPCache))
		maps.Copy(merged, old.state.IPCache)
		maps.Copy(merged, new.state.IPCache)
		if err := a.dp.ApplyIPCache(merged); err != nil {
			return fmt.Errorf("ipcache: %w", err)
		}
	} else {
		var upsert map[netip.Prefix]mapstate.IPCacheEntry
		upsert, removed = ipcacheDiff(old.state.IPCache, new.state.IPCache)
		if len(upsert) > 0 {
			if err := a.dp.UpdateIPCache(upsert, nil); err != nil {
				return fmt.Errorf("ipcache: %w", err)
			}
		}
	}
	// The subsystems before the endpoints: a new endpoint's programs drop everything until
	// its info is written below, so a fail-closed tap redirect is in place before its first
	// packet passes; a relabel taps a moment early rather than late.
	for _, sub := range a.eng.subsystems {
		if err := sub.apply(old, new, force); err != nil {
			return err
		}
	}
	// The endpoints whose identity or policy changed, in key order.
	var changed []string
	for key, rec := range m.endpoints {
		if _, ok := a.ifindex[rec.EpID]; !ok {
			continue // being added or removed by the caller
		}
		if force || old.identities[key] != new.identities[key] || !policyEqual(old.state.Endpoints[rec.EpID], new.state.Endpoints[rec.EpID]) {
			changed = append(changed, key)
		}
	}
	sort.Strings(changed)
	for _, key := range changed {
		rec := m.endpoints[key]
		info := datapath.EndpointInfo{EpID: rec.EpID, Identity: new.identities[key], Addr: rec.IP}
		if rec.IP6.IsValid() {
			info.Addr6, info.LinkLocal6 = rec.IP6, podaddr.LinkLocal(rec.IP6)
		}
		if err := a.dp.ApplyEndpoint(a.ifindex[rec.EpID], info, new.state.Endpoints[rec.EpID]); err != nil {
			return fmt.Errorf("endpoint %s: %w", key, err)
		}
	}
	if err := a.applyHost(old, new, m, force); err != nil {
		return err
	}
	if force {
		if err := a.dp.ApplyIPCache(new.state.IPCache); err != nil {
			return fmt.Errorf("ipcache: %w", err)
		}
	} else if len(removed) > 0 {
		if err := a.dp.UpdateIPCache(nil, removed); err != nil {
			return fmt.Errorf("ipcache: %w", err)
		}
	}
	if err := a.applySendSide(m, pl); err != nil {
		return err
	}
	// Services last: a new backend's policy and identity are in place before any socket
	// is translated to it.
	return a.applyServices(old, new, force)
}

// ipcacheDiff returns the entries of new that old lacks or holds otherwise, and the
// prefixes of old that new lacks.
func ipcacheDiff(old, new map[netip.Prefix]mapstate.IPCacheEntry) (map[netip.Prefix]mapstate.IPCacheEntry, []netip.Prefix) {
	upsert := map[netip.Prefix]mapstate.IPCacheEntry{}
	for p, e := range new {
		if cur, ok := old[p]; !ok || cur != e {
			upsert[p] = e
		}
	}
	var removed []netip.Prefix
	for p := range old {
		if _, ok := new[p]; !ok {
			removed = append(removed, p)
		}
	}
	return upsert, removed
}

func policyEqual(a, b mapstate.EndpointPolicy) bool {
	if (a.Audit == nil) != (b.Audit == nil) || a.Audit != b.Audit && !policyEqual(*a.Audit, *b.Audit) {
		return false
	}
	if a.EnforceIngress == b.EnforceIngress && a.EnforceEgress == b.EnforceEgress && a.DNSObserve == b.DNSObserve &&
		reflect.ValueOf(a.Entries).UnsafePointer() == reflect.ValueOf(b.Entries).UnsafePointer() {
		return true // one map: a policy the computation reused
	}
	if a.EnforceIngress != b.EnforceIngress || a.EnforceEgress != b.EnforceEgress || a.DNSObserve != b.DNSObserve || len(a.Entries) != len(b.Entries) {
		return false
	}
	for k, v := range a.Entries {
		if w, ok := b.Entries[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// commit makes a computed model live: persist, then swap. If persisting fails the
// dataplane is moved back to the current state and the change is refused.
func (a *Agent) commit(m *model, d *desired) error {
	if err := a.persist(m, d); err != nil {
		if rerr := a.applyState(d, a.cur, a.model, true); rerr != nil {
			a.log.Error("rolling back after persist failure", "error", rerr)
		}
		return err
	}
	old := a.cur
	a.model, a.cur = m, d
	for _, sub := range a.eng.subsystems {
		sub.committed(old, d)
	}
	a.publishView()
	return nil
}

// change runs one configuration change that touches no endpoint namespace: compute the
// new model, apply it, commit it. Nothing changes if any step fails.
func (a *Agent) change(mutate func(m *model) error) (*model, *desired, error) {
	m := a.model.clone()
	if err := mutate(m); err != nil {
		return nil, nil, err
	}
	alloc, err := cloneAllocator(a.cur.alloc)
	if err != nil {
		return nil, nil, err
	}
	d, err := a.eng.compute(m, alloc, a.net.Router(), a.cur)
	if err != nil {
		return nil, nil, err
	}
	if err := a.applyState(a.cur, d, m, false); err != nil {
		return nil, nil, err
	}
	if err := a.commit(m, d); err != nil {
		return nil, nil, err
	}
	return m, d, nil
}

// nsLabelsOf returns the namespace labels of ns in m (only the name label if unknown).
func nsLabelsOf(m *model, ns string) labels.Labels {
	if l, ok := m.namespaces[ns]; ok {
		return l
	}
	return labels.Labels{labels.KeyNamespaceName: ns}
}

// prefixOrNone renders p, or "none" when it is zero.
func prefixOrNone(p netip.Prefix) string {
	if !p.IsValid() {
		return "none"
	}
	return p.String()
}

// listenProbe takes the socket (failing if an agent answers on it) and returns a function
// that releases it.
func listenProbe(path string) (func(), error) {
	l, err := api.Listen(path)
	if err != nil {
		return nil, err
	}
	return func() { l.Close() }, nil
}

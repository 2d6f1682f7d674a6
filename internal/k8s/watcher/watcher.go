package watcher

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8slabels "k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listerscorev1 "k8s.io/client-go/listers/core/v1"
	listersdiscoveryv1 "k8s.io/client-go/listers/discovery/v1"
	listersnetv1 "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/rampartnet/rampart/internal/agent"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
)

// The Cilium kinds and the tap kinds, served as CRDs (internal/k8s/crds).
var (
	cnpResource   = schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumnetworkpolicies"}
	ccnpResource  = schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumclusterwidenetworkpolicies"}
	ccgResource   = schema.GroupVersionResource{Group: "cilium.io", Version: "v2", Resource: "ciliumcidrgroups"}
	tapResource   = schema.GroupVersionResource{Group: "rampart.io", Version: "v1alpha1", Resource: "tapcontracts"}
	tcResource    = schema.GroupVersionResource{Group: "crd.antrea.io", Version: "v1alpha2", Resource: "trafficcontrols"}
	cnpv1Resource = schema.GroupVersionResource{Group: "policy.networking.k8s.io", Version: "v1beta1", Resource: "clusternetworkpolicies"}
)

// isMonitor says whether pod p is a monitor (annotation agent.MonitorAnnotation "true").
func isMonitor(p *corev1.Pod) bool { return p.Annotations[agent.MonitorAnnotation] == "true" }

// inAudit says whether pod p is in audit mode (annotation agent.AuditAnnotation "true").
func inAudit(p *corev1.Pod) bool { return p.Annotations[agent.AuditAnnotation] == "true" }

// Agent is what the watcher needs of the agent.
type Agent interface {
	// SyncCluster applies the whole desired view as one change.
	SyncCluster(ctx context.Context, v agent.ClusterView) (agent.SyncResult, error)
	// ReportSyncError records a watch error for status.
	ReportSyncError(err error)
	// FailSync records that no view could be built (status: failing, not synced).
	FailSync(err error)
}

// Allocator gives a full label set its cluster-wide identity (internal/k8s/identities).
type Allocator interface {
	Allocate(ctx context.Context, l labels.Labels) (identity.Identity, error)
}

// Options configure a Watcher.
type Options struct {
	// NodeName is this node's Node object.
	NodeName string
	// Allocator gives pods their cluster-wide identities; nil: every node numbers label
	// sets itself (enough for native routing, where the receiver takes the identity from
	// the address, not for VXLAN, which carries the number).
	Allocator Allocator
	// Coalesce is how long a burst of events is gathered into one sync (default 50 ms).
	Coalesce time.Duration
	// Logger defaults to slog.Default().
	Logger *slog.Logger
}

// Watcher watches the Kubernetes API for one node.
type Watcher struct {
	opts   Options
	client kubernetes.Interface
	dyn    dynamic.Interface
	log    *slog.Logger

	// cur is the informers' caches in use. After an outage of the API server a new set
	// replaces it (see checkHealth); readers load it once per use.
	cur atomic.Pointer[caches]
	// startCtx is the context Start was given: replacement sets run under it too.
	startCtx context.Context

	trigger chan struct{}
	// changed is when (UnixNano) the oldest change no applied view holds was learnt; 0:
	// none. A view carries it to the agent as ClusterView.ChangedAt (propagation time).
	changed atomic.Int64

	mu         sync.Mutex
	agent      Agent                 // set by Run
	reported   map[string]string     // object key -> resourceVersion of its last refusal event
	unresolved map[string]string     // pod key -> the message of its last Event
	condition  *corev1.NodeCondition // the last one written on this node's Node
}

// caches is one set of informers and their listers.
type caches struct {
	factory  informers.SharedInformerFactory
	dfactory dynamicinformer.DynamicSharedInformerFactory
	synced   []cache.InformerSynced
	stop     context.CancelFunc // set by start

	nodes      listerscorev1.NodeLister
	namespaces listerscorev1.NamespaceLister
	pods       listerscorev1.PodLister
	podStore   cache.Store // for its resourceVersion (podsRV)
	netpols    listersnetv1.NetworkPolicyLister
	cnps       cache.GenericLister
	ccnps      cache.GenericLister
	clusterNPs cache.GenericLister // ClusterNetworkPolicy (policy.networking.k8s.io)
	ccgs       cache.GenericLister
	taps       cache.GenericLister
	tcs        cache.GenericLister
	accepted   cache.GenericLister
	services   listerscorev1.ServiceLister
	slices     listersdiscoveryv1.EndpointSliceLister
}

// hasSynced says whether every informer of the set has synced.
func (c *caches) hasSynced() bool {
	for _, s := range c.synced {
		if !s() {
			return false
		}
	}
	return true
}

// start runs the set's informers until parent ends or stop is called.
func (c *caches) start(parent context.Context) {
	ctx, cancel := context.WithCancel(parent)
	c.stop = cancel
	c.factory.Start(ctx.Done())
	c.dfactory.Start(ctx.Done())
}

// New creates a watcher on the API server of cfg; Start starts its informers.
func New(cfg *rest.Config, opts Options) (*Watcher, error) {
	if opts.NodeName == "" {
		return nil, errors.New("watcher: want the node name")
	}
	if opts.Coalesce <= 0 {
		opts.Coalesce = 50 * time.Millisecond
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes dynamic client: %w", err)
	}
	w := &Watcher{
		opts:       opts,
		client:     client,
		dyn:        dyn,
		log:        opts.Logger.With("node", opts.NodeName),
		trigger:    make(chan struct{}, 1),
		reported:   map[string]string{},
		unresolved: map[string]string{},
	}
	c, err := w.newCaches()
	if err != nil {
		return nil, err
	}
	w.cur.Store(c)
	return w, nil
}

// newCaches makes a set of informers on every kind the view is made of, each event of
// which asks for a sync.
func (w *Watcher) newCaches() (*caches, error) {
	c := &caches{
		factory:  informers.NewSharedInformerFactory(w.client, 0),
		dfactory: dynamicinformer.NewDynamicSharedInformerFactory(w.dyn, 0),
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { w.poke() },
		UpdateFunc: func(any, any) { w.poke() },
		DeleteFunc: func(any) { w.poke() },
	}
	add := func(inf cache.SharedIndexInformer, what string) error {
		if _, err := inf.AddEventHandler(handler); err != nil {
			return fmt.Errorf("watching %s: %w", what, err)
		}
		if err := inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
			w.reportErr(fmt.Errorf("watching %s: %w", what, err))
		}); err != nil {
			return fmt.Errorf("watching %s: %w", what, err)
		}
		c.synced = append(c.synced, inf.HasSynced)
		return nil
	}
	core := c.factory.Core().V1()
	c.nodes, c.namespaces, c.pods = core.Nodes().Lister(), core.Namespaces().Lister(), core.Pods().Lister()
	c.podStore = core.Pods().Informer().GetStore()
	c.netpols = c.factory.Networking().V1().NetworkPolicies().Lister()
	c.services = core.Services().Lister()
	c.slices = c.factory.Discovery().V1().EndpointSlices().Lister()
	for _, x := range []struct {
		inf  cache.SharedIndexInformer
		what string
	}{
		{core.Nodes().Informer(), "nodes"},
		{core.Namespaces().Informer(), "namespaces"},
		{core.Pods().Informer(), "pods"},
		{c.factory.Networking().V1().NetworkPolicies().Informer(), "network policies"},
		{core.Services().Informer(), "services"},
		{c.factory.Discovery().V1().EndpointSlices().Informer(), "endpoint slices"},
	} {
		if err := add(x.inf, x.what); err != nil {
			return nil, err
		}
	}
	for _, x := range []struct {
		gvr    schema.GroupVersionResource
		lister *cache.GenericLister
	}{{cnpResource, &c.cnps}, {ccnpResource, &c.ccnps}, {ccgResource, &c.ccgs}, {tapResource, &c.taps}, {tcResource, &c.tcs},
		{cnpv1Resource, &c.clusterNPs},
		{acceptedResource, &c.accepted}} {
		gi := c.dfactory.ForResource(x.gvr)
		if err := add(gi.Informer(), x.gvr.Resource); err != nil {
			return nil, err
		}
		*x.lister = gi.Lister()
	}
	return c, nil
}

// Start starts the informers; they stop with ctx.
func (w *Watcher) Start(ctx context.Context) {
	w.startCtx = ctx
	w.cur.Load().start(ctx)
}

func (w *Watcher) poke() {
	w.changedAt(time.Now().UnixNano())
	select {
	case w.trigger <- struct{}{}:
	default:
	}
}

// changedAt records a change learnt at t (UnixNano) unless an older one waits.
func (w *Watcher) changedAt(t int64) {
	for {
		cur := w.changed.Load()
		if cur != 0 && cur <= t || w.changed.CompareAndSwap(cur, t) {
			return
		}
	}
}

func (w *Watcher) reportErr(err error) {
	w.log.Warn("kubernetes watch", "error", err)
	w.mu.Lock()
	a := w.agent
	w.mu.Unlock()
	if a != nil {
		a.ReportSyncError(err)
	}
}

// OwnNode is this node as its Node object says.
type OwnNode struct {
	Address netip.Addr   // status.addresses' InternalIP
	PodCIDR netip.Prefix // the IPv4 prefix of spec.podCIDRs (spec.podCIDR without them)
	// PodCIDR6 is the IPv6 prefix of spec.podCIDRs on a dual-stack cluster (zero:
	// none): the agent's Config.PodCIDR6.
	PodCIDR6 netip.Prefix
}

// WaitOwnNode waits for this node's Node object with an InternalIP and a pod CIDR.
func (w *Watcher) WaitOwnNode(ctx context.Context) (OwnNode, error) {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		n, err := w.cur.Load().nodes.Get(w.opts.NodeName)
		if err == nil {
			own, err := ownNode(n)
			if err == nil {
				return own, nil
			}
			last = err
		} else {
			last = fmt.Errorf("node %s: %w", w.opts.NodeName, err)
		}
		select {
		case <-ctx.Done():
			return OwnNode{}, fmt.Errorf("waiting for this node's Node object: %w (%v)", ctx.Err(), last)
		case <-tick.C:
		}
	}
}

func ownNode(n *corev1.Node) (OwnNode, error) {
	addr, ok := internalIP(n)
	if !ok {
		return OwnNode{}, fmt.Errorf("node %s: no InternalIP in status.addresses", n.Name)
	}
	own := OwnNode{Address: addr}
	var err error
	if own.PodCIDR, own.PodCIDR6, err = podCIDRs(n); err != nil {
		return OwnNode{}, err
	}
	if !own.PodCIDR.IsValid() {
		return OwnNode{}, fmt.Errorf("node %s: spec.podCIDRs %q: no IPv4 prefix (IPv6-only nodes are not supported)", n.Name, n.Spec.PodCIDRs)
	}
	return own, nil
}

// podCIDRs reads a Node's pod CIDRs by family (zero: none of it), from spec.podCIDRs, or
// spec.podCIDR without them. One prefix per family (the API server's rule); the first of
// the list, spec.podCIDR, may be either on a dual-stack cluster.
func podCIDRs(n *corev1.Node) (cidr4, cidr6 netip.Prefix, err error) {
	cidrs := n.Spec.PodCIDRs
	if len(cidrs) == 0 && n.Spec.PodCIDR != "" {
		cidrs = []string{n.Spec.PodCIDR}
	}
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			return netip.Prefix{}, netip.Prefix{}, fmt.Errorf("node %s: spec.podCIDRs %q: %v", n.Name, c, err)
		}
		switch {
		case p.Addr().Is4() && !cidr4.IsValid():
			cidr4 = p.Masked()
		case p.Addr().Is6() && !cidr6.IsValid():
			cidr6 = p.Masked()
		}
	}
	return cidr4, cidr6, nil
}

// internalIP returns the Node's first IPv4 InternalIP.
func internalIP(n *corev1.Node) (netip.Addr, bool) {
	a := firstInternalIP(n, netip.Addr.Is4)
	return a, a.IsValid()
}

// internalIP6 returns the Node's first IPv6 InternalIP (zero: none), native routing's
// gateway to its IPv6 pod CIDR.
func internalIP6(n *corev1.Node) netip.Addr {
	return firstInternalIP(n, func(a netip.Addr) bool { return a.Is6() && !a.Is4In6() })
}

func firstInternalIP(n *corev1.Node, want func(netip.Addr) bool) netip.Addr {
	for _, a := range n.Status.Addresses {
		if a.Type != corev1.NodeInternalIP {
			continue
		}
		if ip, err := netip.ParseAddr(a.Address); err == nil && want(ip) {
			return ip
		}
	}
	return netip.Addr{}
}

// LocalPod returns pod namespace/name of this node once the cache holds it (and its
// namespace), with the cluster-wide identity of its labels; it waits until ctx ends.
func (w *Watcher) LocalPod(ctx context.Context, namespace, name string) (agent.PodInfo, error) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		info, err := w.localPod(ctx, namespace, name)
		if err == nil {
			return info, nil
		}
		last = err
		select {
		case <-ctx.Done():
			return agent.PodInfo{}, fmt.Errorf("not in the Kubernetes view: %v", last)
		case <-tick.C:
		}
	}
}

func (w *Watcher) localPod(ctx context.Context, namespace, name string) (agent.PodInfo, error) {
	c := w.cur.Load()
	if !c.hasSynced() {
		return agent.PodInfo{}, errors.New("informers not synced yet")
	}
	pod, err := c.pods.Pods(namespace).Get(name)
	if err != nil {
		return agent.PodInfo{}, err
	}
	if pod.Spec.NodeName != w.opts.NodeName {
		return agent.PodInfo{}, fmt.Errorf("pod is bound to node %q, not %s", pod.Spec.NodeName, w.opts.NodeName)
	}
	ns, err := c.namespaces.Get(namespace)
	if err != nil {
		return agent.PodInfo{}, err
	}
	info := agent.PodInfo{Labels: labels.Labels(pod.Labels), ServiceAccount: pod.Spec.ServiceAccountName, Monitor: isMonitor(pod), Audit: inAudit(pod), Ports: podPorts(pod)}
	if info.Labels == nil {
		info.Labels = labels.Labels{}
	}
	info.Identity, err = w.allocate(ctx, namespace, pod, ns.Labels)
	if err != nil {
		return agent.PodInfo{}, err
	}
	return info, nil
}

// podPorts returns the pod's named ports as Kubernetes resolves a port given by name
// (FindPort): the named ports of its containers, then of its sidecars (init containers
// with restartPolicy Always), the first declaration of a name winning. The protocol
// defaults to TCP. A number outside 1-65535 is passed as 0, which the agent refuses.
func podPorts(p *corev1.Pod) []agent.PortRecord {
	var out []agent.PortRecord
	seen := map[string]bool{}
	add := func(c *corev1.Container) {
		for _, cp := range c.Ports {
			if cp.Name == "" || seen[cp.Name] {
				continue
			}
			seen[cp.Name] = true
			proto := string(cp.Protocol)
			if proto == "" {
				proto = string(corev1.ProtocolTCP)
			}
			var port uint16
			if cp.ContainerPort > 0 && cp.ContainerPort <= 65535 {
				port = uint16(cp.ContainerPort)
			}
			out = append(out, agent.PortRecord{Name: cp.Name, Port: port, Protocol: proto})
		}
	}
	for i := range p.Spec.Containers {
		add(&p.Spec.Containers[i])
	}
	for i := range p.Spec.InitContainers {
		if c := &p.Spec.InitContainers[i]; c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways {
			add(c)
		}
	}
	return out
}

func (w *Watcher) allocate(ctx context.Context, namespace string, pod *corev1.Pod, nsLabels map[string]string) (identity.Identity, error) {
	if w.opts.Allocator == nil {
		return 0, nil
	}
	full := labels.ForPod(namespace, labels.Labels(pod.Labels), labels.Labels(nsLabels), pod.Spec.ServiceAccountName)
	id, err := w.opts.Allocator.Allocate(ctx, full)
	if err != nil {
		return 0, fmt.Errorf("identity of pod %s/%s: %w", namespace, pod.Name, err)
	}
	return id, nil
}

// InUse returns the identity label-set keys (identity.LabelsKey) of every pod in the
// cache, and whether the caches have synced (an unsynced cache must not free anything).
func (w *Watcher) InUse() (map[string]bool, bool) {
	c := w.cur.Load()
	if !c.hasSynced() {
		return nil, false
	}
	pods, err := c.pods.List(k8slabels.Everything())
	if err != nil {
		return nil, false
	}
	used := make(map[string]bool, len(pods))
	for _, p := range pods {
		ns, err := c.namespaces.Get(p.Namespace)
		if err != nil {
			continue
		}
		used[identity.LabelsKey(labels.ForPod(p.Namespace, labels.Labels(p.Labels), labels.Labels(ns.Labels), p.Spec.ServiceAccountName))] = true
	}
	return used, true
}

// Run syncs the agent with the cluster until ctx ends: once the informers have synced,
// then after every burst of events (gathered for Options.Coalesce), and again after a
// failed sync (backing off up to 10 s).
func (w *Watcher) Run(ctx context.Context, a Agent) error {
	w.mu.Lock()
	w.agent = a
	w.mu.Unlock()
	if !cache.WaitForCacheSync(ctx.Done(), w.cur.Load().synced...) {
		return fmt.Errorf("waiting for the informers to sync: %w", ctx.Err())
	}
	w.log.Info("kubernetes informers synced")
	w.poke()
	go w.checkHealth(ctx, a)
	backoff := time.Duration(0)
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.trigger:
		case <-retry:
		}
		retry = nil
		// Gather the rest of the burst.
		t := time.NewTimer(w.opts.Coalesce)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		select {
		case <-w.trigger:
		default:
		}
		err := w.sync(ctx, a)
		if err == nil {
			backoff = 0
			continue
		}
		if ctx.Err() != nil {
			return nil
		}
		w.log.Warn("syncing with the Kubernetes API", "error", err)
		backoff = min(max(2*backoff, 200*time.Millisecond), 10*time.Second)
		retry = time.After(backoff)
	}
}

// healthInterval is how often the watcher asks the API server whether it is ready. The
// informers retry a refused connection silently, so this is how status learns of an
// outage.
const healthInterval = 2 * time.Second

// checkHealth reports the API server unreachable to the agent while it is, and when it is
// back renews the informers and asks for a sync (a successful sync clears the error in
// status).
func (w *Watcher) checkHealth(ctx context.Context, a Agent) {
	tick := time.NewTicker(healthInterval)
	defer tick.Stop()
	down := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		rctx, cancel := context.WithTimeout(ctx, healthInterval)
		_, err := w.client.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(rctx)
		cancel()
		switch {
		case err != nil && ctx.Err() == nil:
			down = true
			a.ReportSyncError(fmt.Errorf("API server not ready: %w", err))
		case err == nil && down:
			down = false
			w.renewCaches(ctx)
			w.poke()
		}
	}
}

// renewWait bounds how long a new set of informers may take to list everything.
const renewWait = 30 * time.Second

// renewCaches replaces the informers after an outage of the API server. client-go's
// reflectors retry a refused watch with a backoff that grows to 30 s with as much again
// of jitter, so after an outage of a minute the old informers may see the changes made
// meanwhile only a minute after the server is back; a new set lists everything at once.
// The old set serves the views until the new one has synced; if the new one cannot sync
// in time it is dropped and the old one goes on.
func (w *Watcher) renewCaches(ctx context.Context) {
	if w.startCtx == nil {
		return
	}
	c, err := w.newCaches()
	if err != nil {
		w.log.Warn("renewing the informers", "error", err)
		return
	}
	c.start(w.startCtx)
	wctx, cancel := context.WithTimeout(ctx, renewWait)
	defer cancel()
	if !cache.WaitForCacheSync(wctx.Done(), c.synced...) {
		c.stop()
		w.log.Warn("renewing the informers: they did not sync in time; keeping the old ones")
		return
	}
	old := w.cur.Swap(c)
	if old.stop != nil {
		old.stop()
	}
	w.log.Info("kubernetes informers renewed after the API server returned")
}

// sync builds the view and has the agent apply it, then says how that went on this
// node's Node (a condition) and on each object not applied (an Event).
func (w *Watcher) sync(ctx context.Context, a Agent) (err error) {
	// Changes learnt from here on may not be in this view: they start the next one's
	// propagation time. If this view is not applied, its own changes still wait.
	changed := w.changed.Swap(0)
	defer func() {
		if err != nil && changed != 0 {
			w.changedAt(changed)
		}
	}()
	v, err := w.View(ctx)
	if changed != 0 {
		v.ChangedAt = time.Unix(0, changed)
	}
	if err != nil {
		a.FailSync(err)
		w.setCondition(ctx, syncCondition(v, agent.SyncResult{}, err))
		return err
	}
	res, err := a.SyncCluster(ctx, v)
	w.setCondition(ctx, syncCondition(v, res, err))
	if err != nil {
		return err
	}
	w.reportRefused(ctx, v, res)
	w.reportUnresolved(ctx, res)
	w.publishAck(ctx, v, res)
	w.recordAccepted(ctx, res)
	return nil
}

// View builds the desired view from the caches.
func (w *Watcher) View(ctx context.Context) (agent.ClusterView, error) {
	v := agent.ClusterView{
		Namespaces: map[string]labels.Labels{},
		Objects:    map[string]agent.PolicyObject{},
		LocalPods:  map[string]agent.PodInfo{},
		// Every other Node counts for the quarantine, whether or not it is valid here.
		Acks:           map[string]string{},
		LocalAddresses: map[netip.Addr]string{},
	}
	c := w.cur.Load()
	nsLabels, err := viewNamespaces(c, &v)
	if err != nil {
		return v, err
	}
	if err := w.viewNodes(c, &v); err != nil {
		return v, err
	}
	if err := w.viewPods(ctx, c, &v, nsLabels); err != nil {
		return v, err
	}
	if err := viewPolicyObjects(c, &v); err != nil {
		return v, err
	}
	if err := listAccepted(c, &v); err != nil {
		return v, err
	}
	if err := listServices(c, &v); err != nil {
		return v, err
	}
	return v, nil
}

// viewNamespaces puts the namespaces in v, and returns their labels by name.
func viewNamespaces(c *caches, v *agent.ClusterView) (map[string]map[string]string, error) {
	nss, err := c.namespaces.List(k8slabels.Everything())
	if err != nil {
		return nil, fmt.Errorf("listing namespaces: %w", err)
	}
	// A pod's identity is allocated from its namespace's labels as they are in this
	// view, the same labels the agent puts in the pod's label set: both come from nsLabels.
	nsLabels := map[string]map[string]string{}
	for _, ns := range nss {
		v.Namespaces[ns.Name] = labels.Labels(ns.Labels)
		nsLabels[ns.Name] = ns.Labels
	}
	return nsLabels, nil
}

// viewNodes puts the other nodes in v, and this node's labels.
func (w *Watcher) viewNodes(c *caches, v *agent.ClusterView) error {
	nodes, err := c.nodes.List(k8slabels.Everything())
	if err != nil {
		return fmt.Errorf("listing nodes: %w", err)
	}
	for _, n := range nodes {
		if n.Name == w.opts.NodeName {
			v.NodeLabels = labels.Labels(maps.Clone(n.Labels))
			continue
		}
		v.Acks[n.Name] = n.Annotations[agent.PodsAckAnnotation]
		addr, ok := internalIP(n)
		if !ok {
			v.Problems = append(v.Problems, fmt.Sprintf("node %s: no InternalIP", n.Name))
			continue
		}
		rec := agent.NodeRecord{Name: n.Name, Address: addr, Address6: internalIP6(n)}
		if rec.PodCIDR, rec.PodCIDR6, err = podCIDRs(n); err != nil {
			v.Problems = append(v.Problems, err.Error())
			continue
		}
		v.Nodes = append(v.Nodes, rec)
	}
	return nil
}

// viewPods puts the pods in v: this node's with their identities and addresses, the
// other nodes' with an address as remote endpoints.
func (w *Watcher) viewPods(ctx context.Context, c *caches, v *agent.ClusterView, nsLabels map[string]map[string]string) error {
	// The cache's resourceVersion moves with its content: read before the listing, every
	// pod event up to it is in the view; after, none in the view is past it.
	v.PodsRV = c.podStore.LastStoreSyncResourceVersion()
	pods, err := c.pods.List(k8slabels.Everything())
	if err != nil {
		return fmt.Errorf("listing pods: %w", err)
	}
	v.PodsRVListed = c.podStore.LastStoreSyncResourceVersion()
	for _, p := range pods {
		if p.Spec.HostNetwork || p.Spec.NodeName == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		key := p.Namespace + "/" + p.Name
		if _, ok := nsLabels[p.Namespace]; !ok {
			// Its Namespace is not in the cache yet (the informers deliver kinds in no
			// set order): an identity allocated now would lack the namespace's labels.
			// Left out until it arrives; a local endpoint keeps what it has.
			continue
		}
		l := labels.Labels(p.Labels)
		if l == nil {
			l = labels.Labels{}
		}
		var ip netip.Addr
		if p.Status.PodIP != "" {
			if ip, err = netip.ParseAddr(p.Status.PodIP); err != nil || !ip.Is4() {
				v.Problems = append(v.Problems, fmt.Sprintf("pod %s: podIP %q: want IPv4", key, p.Status.PodIP))
				ip = netip.Addr{}
			}
		}
		if p.Spec.NodeName == w.opts.NodeName {
			id, err := w.allocate(ctx, p.Namespace, p, nsLabels[p.Namespace])
			if err != nil {
				return err
			}
			v.LocalPods[key] = agent.PodInfo{Labels: l, ServiceAccount: p.Spec.ServiceAccountName, Identity: id, Monitor: isMonitor(p), Audit: inAudit(p), Ports: podPorts(p)}
			if ip.IsValid() {
				v.LocalAddresses[ip] = key
			}
			continue
		}
		if !ip.IsValid() {
			continue
		}
		id, err := w.allocate(ctx, p.Namespace, p, nsLabels[p.Namespace])
		if err != nil {
			return err
		}
		v.Remotes = append(v.Remotes, agent.RemoteEndpointRecord{Namespace: p.Namespace, Name: p.Name, Node: p.Spec.NodeName,
			IP: ip, Labels: l, ServiceAccount: p.Spec.ServiceAccountName, Identity: id, Monitor: isMonitor(p), Ports: podPorts(p)})
	}
	return nil
}

// viewPolicyObjects puts the policy objects of every kind in v; one that cannot be read
// is a problem of the view, not its end.
func viewPolicyObjects(c *caches, v *agent.ClusterView) error {
	nps, err := c.netpols.List(k8slabels.Everything())
	if err != nil {
		return fmt.Errorf("listing network policies: %w", err)
	}
	for _, np := range nps {
		key, o, err := networkPolicyObject(np)
		if err != nil {
			v.Problems = append(v.Problems, err.Error())
			continue
		}
		v.Objects[key] = o
	}
	for _, x := range []struct {
		lister cache.GenericLister
		kind   string
	}{{c.cnps, "CiliumNetworkPolicy"}, {c.ccnps, "CiliumClusterwideNetworkPolicy"}, {c.ccgs, "CiliumCIDRGroup"},
		{c.taps, "TapContract"}, {c.tcs, "TrafficControl"}, {c.clusterNPs, "ClusterNetworkPolicy"}} {
		objs, err := x.lister.List(k8slabels.Everything())
		if err != nil {
			return fmt.Errorf("listing %s: %w", x.kind, err)
		}
		for _, obj := range objs {
			u, ok := obj.(*unstructured.Unstructured)
			if !ok {
				continue
			}
			key, o := customObject(x.kind, u)
			v.Objects[key] = o
		}
	}
	return nil
}

// objectKey keys a policy object in the view: kind/namespace/name.
func objectKey(kind, ns, name string) string { return kind + "/" + ns + "/" + name }

// document is the object as a manifest for the parser, decoded: apiVersion, kind,
// metadata with its name, namespace, labels and the one annotation that means something
// to policy (AuditAnnotation; the rest is the API server's and the tools' bookkeeping),
// and the object's other top-level fields (spec, specs, ...), shared with body.
func document(apiVersion, kind string, meta metav1.Object, body map[string]any) map[string]any {
	doc := make(map[string]any, len(body))
	for k, v := range body {
		switch k {
		case "apiVersion", "kind", "metadata", "status":
		default:
			doc[k] = v
		}
	}
	md := map[string]any{"name": meta.GetName()}
	if ns := meta.GetNamespace(); ns != "" {
		md["namespace"] = ns
	}
	if l := meta.GetLabels(); len(l) > 0 {
		md["labels"] = l
	}
	if v, ok := meta.GetAnnotations()[agent.AuditAnnotation]; ok {
		md["annotations"] = map[string]string{agent.AuditAnnotation: v}
	}
	doc["apiVersion"], doc["kind"], doc["metadata"] = apiVersion, kind, md
	return doc
}

// networkPolicyObject is np as the parser reads it. The typed object is turned into its
// map of fields by the API machinery's converter, which walks every field the type has:
// a field Rampart does not know, added by a newer API, is then refused by name, as in a
// manifest, instead of dropped.
func networkPolicyObject(np *networkingv1.NetworkPolicy) (string, agent.PolicyObject, error) {
	const kind = "NetworkPolicy"
	body, err := runtime.DefaultUnstructuredConverter.ToUnstructured(np)
	if err != nil {
		return "", agent.PolicyObject{}, fmt.Errorf("%s %s/%s: %w", kind, np.Namespace, np.Name, err)
	}
	return objectKey(kind, np.Namespace, np.Name), agent.PolicyObject{Kind: kind, Namespace: np.Namespace, Name: np.Name,
		ResourceVersion: np.ResourceVersion, UID: string(np.UID), Object: document("networking.k8s.io/v1", kind, np, body)}, nil
}

// customObject is u as the parser reads it: its map of fields, as the informer decoded
// them.
func customObject(kind string, u *unstructured.Unstructured) (string, agent.PolicyObject) {
	apiVersion := u.GetAPIVersion()
	if apiVersion == "" {
		apiVersion = apiVersionOf(kind)
	}
	return objectKey(kind, u.GetNamespace(), u.GetName()), agent.PolicyObject{Kind: kind, Namespace: u.GetNamespace(), Name: u.GetName(),
		ResourceVersion: u.GetResourceVersion(), UID: string(u.GetUID()), Object: document(apiVersion, kind, u, u.Object)}
}

// apiVersionOf is the group/version the watcher serves kind at.
func apiVersionOf(kind string) string {
	switch kind {
	case "NetworkPolicy":
		return "networking.k8s.io/v1"
	case "TapContract":
		return tapResource.GroupVersion().String()
	case "TrafficControl":
		return tcResource.GroupVersion().String()
	case "ClusterNetworkPolicy":
		return cnpv1Resource.GroupVersion().String()
	}
	return "cilium.io/v2"
}

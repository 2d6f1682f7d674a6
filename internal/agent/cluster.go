package agent

// Kubernetes mode (docs/cluster.md): the cluster's nodes, the pods on them, namespaces'
// labels and policies come from the Kubernetes API. The watcher (internal/k8s/watcher)
// holds the informers and hands the agent the whole desired view (SyncCluster), which the
// agent applies as one change transaction; the agent itself knows nothing of client-go.
// What Kubernetes owns cannot be written through the local API (409).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/rampartnet/rampart/internal/agent/taps"
	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/tap"
)

// MonitorAnnotation marks a pod as a monitor endpoint for tap contracts (docs/taps.md),
// with the value "true": on its node the CNI ADD gives it the monitor's receive and
// return interfaces (as `rampart endpoint add --monitor`), and every other node records
// it as a remote monitor. The watcher reads it into PodInfo.Monitor and
// RemoteEndpointRecord.Monitor.
const MonitorAnnotation = "rampart.io/monitor"

// AuditAnnotation "true" on a pod puts its endpoint in audit mode (EndpointRecord.Audit):
// the same annotation that puts a policy in audit mode.
const AuditAnnotation = policy.AuditAnnotation

// Kubernetes configures Kubernetes mode (Config.Kubernetes).
type Kubernetes struct {
	// NodeName is this node's Node object.
	NodeName string
	// NodeAddress is this node's address (the Node's InternalIP), for status.
	NodeAddress netip.Addr
	// Pods answers the CNI ADD: the pod's labels, service account and identity.
	Pods PodLookup
}

// PodLookup finds a pod of this node in the cluster's view.
type PodLookup interface {
	// LocalPod returns the pod namespace/name, waiting (bounded by ctx) for it to appear
	// in the cache; an error when it does not.
	LocalPod(ctx context.Context, namespace, name string) (PodInfo, error)
}

// PodInfo is what the Kubernetes API says of a pod: its labels, service account, the
// cluster-wide identity of its full label set (0: none, allocated on the node), whether
// it is a monitor (MonitorAnnotation), and its named ports (its containers' ports that
// have a name, as NetworkPolicy resolves a port given by name).
type PodInfo struct {
	Labels         labels.Labels
	ServiceAccount string
	Identity       identity.Identity
	Monitor        bool
	// Audit: the pod is in audit mode (AuditAnnotation).
	Audit bool
	Ports []PortRecord
}

// ClusterView is the cluster as the Kubernetes API shows it: everything the agent takes
// from it, in full, so a sync after a restart or an outage needs nothing else.
type ClusterView struct {
	// Namespaces' user labels, by name (the name label is added by the agent).
	Namespaces map[string]labels.Labels
	// Nodes are the other nodes.
	Nodes []NodeRecord
	// NodeLabels are this node's Node object's labels (host policy's nodeSelector
	// matches them).
	NodeLabels labels.Labels
	// Remotes are the pods on other nodes with an address.
	Remotes []RemoteEndpointRecord
	// Objects are the policy objects (NetworkPolicy, CiliumNetworkPolicy,
	// CiliumClusterwideNetworkPolicy, CiliumCIDRGroup) and tap contracts (TapContract,
	// TrafficControl), by a key of the watcher's.
	Objects map[string]PolicyObject
	// LocalPods are the pods of this node, by namespace/name.
	LocalPods map[string]PodInfo
	// Services are the cluster's Services with a cluster IP, their backends the ready
	// endpoints of their EndpointSlices (docs/services.md).
	Services []ServiceRecord
	// Problems are objects the watcher could not turn into the view (reported in status).
	Problems []string
	// ChangedAt is when the watcher learnt of the oldest change the view holds that no
	// view applied before held (zero: unknown): the view's propagation time is measured
	// from it.
	ChangedAt time.Time

	// For the address quarantine (quarantine.go):
	// PodsRV is the pods cache's resourceVersion before the view was listed (the view
	// reflects every pod event up to it; "" unknown): the acknowledgement this node
	// publishes once the view is applied.
	PodsRV string
	// PodsRVListed is the pods cache's resourceVersion after the view was listed (no pod
	// event the view reflects is past it).
	PodsRVListed string
	// LocalAddresses are the addresses of this node's pods that other nodes map (as
	// Remotes on them: with a podIP, not host network, not ended), to the pod's key.
	LocalAddresses map[netip.Addr]string
	// Acks are the other Node objects' acknowledgements (PodsAckAnnotation), by name; ""
	// for a Node without one.
	Acks map[string]string
	// Accepted are the cluster's records of the version in force of each policy object
	// whose current version is refused, by the key of Objects (written by the agents that
	// keep one, see SyncResult.Record). An agent that refuses an object's current version
	// and has no accepted version of its own (a new node, a wiped state directory)
	// enforces the record's, so that it agrees with the other nodes instead of enforcing
	// nothing.
	Accepted map[string]PolicyObject
}

// PolicyObject is a policy object for the parser (the one `rampart apply` uses), and its
// resourceVersion: an object whose version did not change since the last sync is not
// parsed again.
type PolicyObject struct {
	Kind            string
	Namespace, Name string
	ResourceVersion string
	// UID is the object's uid: a record of Accepted holds for the object of the same
	// uid only (not one deleted and created again under the name).
	UID string
	// Object is the object as the informer decoded it, a manifest with apiVersion and
	// kind (policy.ParseObject): what ClusterView.Objects carry.
	Object map[string]any
	// Document is a manifest as text (JSON with apiVersion and kind): what the records
	// of ClusterView.Accepted and SyncResult.Record carry, as they are stored. The parser
	// takes Object when there is one.
	Document []byte
}

// SyncResult says what a sync did not apply.
type SyncResult struct {
	// Refused are the policy objects the parser refused, by key, with its message.
	Refused map[string]string
	// Problems are nodes, pods and namespaces left out, and why.
	Problems []string
	// Unresolved are the pods (namespace/name) whose cluster identity disagrees with
	// another pod's: a local one is denied everything, a remote one is left out.
	Unresolved map[string]string
	// WantAck is the acknowledgement this node's quarantined addresses wait for from the
	// others ("" none waits): published as PodsWantAnnotation.
	WantAck string
	// Record are the versions kept in force of the policy objects whose current version
	// is refused and whose record in ClusterView.Accepted is missing or of another
	// object: the watcher records them. Records are written on refusal only, so that
	// accepting a policy costs the API server no write.
	Record []PolicyObject
	// Unrecord are the keys of ClusterView.Accepted whose object is gone or whose current
	// version is accepted here: the watcher deletes those records.
	Unrecord []string
}

// Clean says whether the sync applied the whole view.
func (r SyncResult) Clean() bool {
	return len(r.Refused)+len(r.Problems)+len(r.Unresolved) == 0
}

// k8sState is the agent's record of Kubernetes mode; guarded by a.mu.
type k8sState struct {
	parsed    map[string]parsedObject // by object key
	lastSync  time.Time
	lastErr   string
	lastErrAt time.Time
	syncs     uint64
	// watchErrors and syncFailures count ReportSyncError's and failSync's calls.
	watchErrors  uint64
	syncFailures uint64
	refused      map[string]string
	problems     []string
	synced       bool
	// failing: the last view could not be applied at all (synced is false then); the
	// dataplane enforces the last one applied.
	failing bool
	acks    map[string]string // the last applied view's ClusterView.Acks
}

type parsedObject struct {
	rv       string
	rec      *AcceptedObjectRecord // what is persisted of it (model.accepted)
	policies []*policy.Policy
	groups   []*policy.CIDRGroup
	taps     []*tap.Contract
}

// errManaged answers the local API's writes to what the Kubernetes API owns.
func (a *Agent) errManaged(what string) error {
	if a.cfg.Kubernetes == nil {
		return nil
	}
	return api.Conflict("%s: managed by the Kubernetes API (rampartd runs in Kubernetes mode)", what)
}

// ReportSyncError records an error of the watcher (e.g. the API server unreachable) for
// status; enforcement goes on with the last view.
func (a *Agent) ReportSyncError(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.k8s == nil {
		return
	}
	a.k8s.lastErr = err.Error()
	a.k8s.lastErrAt = time.Now()
	a.k8s.watchErrors++
}

// SyncCluster makes the model's namespaces, nodes, remote pods, policies, CIDR groups, tap
// contracts and local pods' labels those of v, as one change: computed in full before
// anything is touched, nothing changed if any step fails. Objects the parser refuses are
// left out (an earlier accepted version of the same object stays) and reported, and so
// are tap contracts that cannot be enforced (see syncTaps); the others apply. Remote pods
// and nodes that are not valid are left out and reported, and so are pods whose cluster
// identity disagrees with another's (claims.go: a local one is denied everything). A view
// that fails whole leaves status failing, never synced.
func (a *Agent) SyncCluster(ctx context.Context, v ClusterView) (SyncResult, error) {
	if a.cfg.Kubernetes == nil {
		return SyncResult{}, errors.New("not in Kubernetes mode")
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	defer relaxGC(a.changedObjectBytes(v))()
	res, err := a.syncCluster(v)
	if err != nil {
		a.failSync(err)
		return res, err
	}
	res.Unresolved = a.unresolvedPods()
	for key, why := range res.Unresolved {
		a.log.Warn("pod's identity unresolved", "pod", key, "error", why)
	}
	a.k8s.synced, a.k8s.failing = true, false
	a.k8s.lastSync = time.Now()
	a.k8s.lastErr = ""
	a.k8s.syncs++
	if !v.ChangedAt.IsZero() {
		a.propagation.observe(a.k8s.lastSync.Sub(v.ChangedAt))
	}
	a.k8s.refused = res.Refused
	a.k8s.acks = v.Acks
	a.k8s.problems = append(append([]string(nil), v.Problems...), res.Problems...)
	return res, nil
}

// FailSync records that the watcher could not build a view of the cluster (an identity
// it could not allocate, say): status shows the sync failing, and never synced, until a
// view applies. The dataplane enforces the last view applied.
func (a *Agent) FailSync(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.k8s != nil {
		a.failSync(err)
	}
}

// failSync records a failed sync; a.mu must be held.
func (a *Agent) failSync(err error) {
	a.k8s.lastErr = err.Error()
	a.k8s.lastErrAt = time.Now()
	a.k8s.synced, a.k8s.failing = false, true
	a.k8s.syncFailures++
	a.log.Error("applying the Kubernetes view failed", "error", err)
}

func (a *Agent) syncCluster(v ClusterView) (SyncResult, error) {
	res := SyncResult{Refused: map[string]string{}}
	parsed := a.parseClusterObjects(v, res.Refused)
	res.Record, res.Unrecord = acceptedRecords(v, parsed)
	nodes, remotes, nodeProblems := a.clusterNodes(v)
	c := &clusterChange{a: a, v: v, parsed: parsed, nodes: nodes, remotes: remotes}

	setsChanged := false
	probe := a.model.clone()
	if err := c.mutate(probe); err != nil {
		return res, err
	}
	if len(probe.cidrsets) != len(a.model.cidrsets) {
		setsChanged = true
	}
	for name, s := range probe.cidrsets {
		if a.model.cidrsets[name] != s {
			setsChanged = true
		}
	}
	c.problems = nil // mutate runs again below
	var m *model
	var err error
	if setsChanged {
		if _, err = a.changeSets(time.Now(), &changeTiming{}, c.mutate); err == nil {
			m = a.model
		}
	} else {
		m, _, err = a.change(c.mutate)
	}
	if err != nil {
		return res, fmt.Errorf("applying the cluster view: %w", err)
	}
	res.WantAck = c.wantAck
	a.k8s.parsed = parsed
	maps.Copy(res.Refused, c.tapRefused)
	if err := a.syncRoutes(m); err != nil {
		return res, fmt.Errorf("routes to the other nodes: %w", err)
	}
	for key, msg := range res.Refused {
		a.log.Warn("object refused", "object", key, "error", msg)
	}
	// The nodes' and pods' problems were found once, before mutate ran (twice).
	problems := append(c.problems, nodeProblems...)
	sort.Strings(problems)
	res.Problems = problems
	return res, nil
}

// parseClusterObjects parses the view's policy objects that changed and reuses the others;
// one refused is said in refused and keeps its last accepted version, here or, failing
// that, the one the other nodes accepted.
func (a *Agent) parseClusterObjects(v ClusterView, refused map[string]string) map[string]parsedObject {
	parsed := make(map[string]parsedObject, len(v.Objects))
	for _, key := range sortedKeys(v.Objects) {
		o := v.Objects[key]
		if prev, ok := a.k8s.parsed[key]; ok && prev.rv == o.ResourceVersion {
			parsed[key] = prev
			continue
		}
		po, err := a.parseObject(key, o)
		if err == nil {
			err = a.requireProxy(po.policies)
		}
		if err != nil {
			refused[key] = err.Error()
			if prev, ok := a.k8s.parsed[key]; ok {
				parsed[key] = prev // the last accepted version stays
				refused[key] += " (its last accepted version stays in force)"
			} else if prev, ok := a.clusterAccepted(key, o, v.Accepted[key]); ok {
				parsed[key] = prev // the version the other nodes accepted
				refused[key] += " (its last accepted version stays in force)"
			}
			continue
		}
		parsed[key] = po
	}
	return parsed
}

// clusterChange is a cluster view on its way into the model: mutate makes a model hold
// it, and may run more than once.
type clusterChange struct {
	a       *Agent
	v       ClusterView
	parsed  map[string]parsedObject
	nodes   map[string]*NodeRecord
	remotes map[string]*RemoteEndpointRecord

	// What mutate found: problems of the view, taps refused, the pods revision to ack.
	problems   []string
	tapRefused map[string]string
	wantAck    string
}

func (c *clusterChange) mutate(m *model) error {
	if !maps.Equal(m.nodeLabels, c.v.NodeLabels) {
		m.nodeLabels = maps.Clone(c.v.NodeLabels)
	}
	c.namespaces(m)
	c.nodesAndRemotes(m)
	c.localPods(m)
	groups := c.policies(m)
	c.cidrGroups(m, groups)
	c.tapRefused = c.a.syncTaps(m, c.parsed)
	m.accepted = make(map[string]*AcceptedObjectRecord, len(c.parsed))
	for key, po := range c.parsed {
		m.accepted[key] = po.rec
	}
	c.wantAck = syncQuarantine(m, c.v)
	return nil
}

// namespaces puts the view's namespaces, with valid labels, in m.
func (c *clusterChange) namespaces(m *model) {
	m.namespaces = map[string]labels.Labels{}
	for ns, l := range c.v.Namespaces {
		if validateNamespace(ns) != nil {
			continue
		}
		nl := maps.Clone(l)
		if nl == nil {
			nl = labels.Labels{}
		}
		delete(nl, labels.KeyNamespaceName)
		if _, err := validateLabels(nl); err != nil {
			c.problems = append(c.problems, fmt.Sprintf("namespace %s: %v", ns, err))
			nl = labels.Labels{}
		}
		nl[labels.KeyNamespaceName] = ns
		if old, ok := c.a.model.namespaces[ns]; ok && maps.Equal(old, nl) {
			nl = old // the same map: endpoints' derived labels stay valid
		}
		m.namespaces[ns] = nl
	}
}

// nodesAndRemotes puts the other nodes, the Services and the remote pods in m.
func (c *clusterChange) nodesAndRemotes(m *model) {
	m.nodes = make(map[string]*NodeRecord, len(c.nodes))
	for name, n := range c.nodes {
		if old, ok := c.a.model.nodes[name]; ok && *old == *n {
			n = old
		}
		m.nodes[name] = n
	}
	var svcProblems []string
	m.services, svcProblems = clusterServices(c.v.Services, nodeAddrs(m, c.a.eng.nodeAddr))
	c.problems = append(c.problems, svcProblems...)
	m.remotes = make(map[string]*RemoteEndpointRecord, len(c.remotes))
	for key, r := range c.remotes {
		if old, ok := c.a.model.remotes[key]; ok && remoteEqual(old, r) {
			r = old
		}
		m.remotes[key] = r
		m.ensureNamespace(r.Namespace)
	}
}

// localPods updates this node's endpoints from their pods.
func (c *clusterChange) localPods(m *model) {
	// Local pods: labels and identity from the API; an endpoint whose pod is not in
	// the view keeps what it has (its DEL comes from the runtime).
	m.endpoints = maps.Clone(m.endpoints)
	for key, rec := range m.endpoints {
		p, ok := c.v.LocalPods[key]
		m.ensureNamespace(rec.Namespace)
		if !ok || rec.CNI == nil {
			continue
		}
		if p.Monitor != rec.Monitor {
			// A monitor's interfaces are made with its endpoint, by the CNI ADD.
			c.problems = append(c.problems, fmt.Sprintf("pod %s: annotation %s=%v differs from what the pod was created with (%v); it takes effect when the pod is created again",
				key, MonitorAnnotation, p.Monitor, rec.Monitor))
		}
		if maps.Equal(rec.Labels, p.Labels) && rec.ServiceAccount == p.ServiceAccount && rec.Identity == p.Identity && slices.Equal(rec.Ports, p.Ports) && rec.Audit == p.Audit {
			continue
		}
		l, err := validateLabels(p.Labels)
		if err != nil {
			c.problems = append(c.problems, fmt.Sprintf("pod %s: %v", key, err))
			continue
		}
		ports, err := validPortRecords(p.Ports)
		if err != nil {
			c.problems = append(c.problems, fmt.Sprintf("pod %s: %v", key, err))
			continue
		}
		c := *rec
		c.Labels, c.ServiceAccount, c.Identity, c.Ports, c.Audit = l, p.ServiceAccount, p.Identity, ports, p.Audit
		m.endpoints[key] = &c
	}
}

// policies puts the parsed objects' policies in m and returns their CIDR groups by name.
func (c *clusterChange) policies(m *model) map[string]*policy.CIDRGroup {
	// Policies: those of the parsed objects, rule ids kept where they were.
	m.policies = map[string]*storedPolicy{}
	groups := map[string]*policy.CIDRGroup{}
	for _, key := range sortedKeys(c.parsed) {
		po := c.parsed[key]
		for _, g := range po.groups {
			groups[g.Name] = g
		}
		for _, p := range po.policies {
			old := c.a.model.policies[p.Key()]
			if old != nil && old.pol == p {
				m.policies[p.Key()] = old // the same parse: rule ids and all
				continue
			}
			m.putPolicy(p, old)
		}
	}
	return groups
}

// cidrGroups makes each CIDR group a CIDR set of its name; sets the local API loaded stay.
func (c *clusterChange) cidrGroups(m *model, groups map[string]*policy.CIDRGroup) {
	now := time.Now()
	m.cidrsets = maps.Clone(m.cidrsets)
	for name, s := range m.cidrsets {
		if _, ok := groups[name]; !ok && strings.HasPrefix(s.meta.Source, string(policy.KindCiliumCIDRGroup)) {
			delete(m.cidrsets, name)
		}
	}
	for _, name := range sortedKeys(groups) {
		if _, err := m.putCIDRGroup(groups[name], groupSet(groups[name]), c.a.model, now); err != nil {
			c.problems = append(c.problems, err.Error())
		}
	}
}

// clusterNodes returns the nodes and remote pods of v that are valid, and a problem for each
// one left out (or in part: an IPv6 pod CIDR the overlay cannot carry).
func (a *Agent) clusterNodes(v ClusterView) (map[string]*NodeRecord, map[string]*RemoteEndpointRecord, []string) {
	var problems []string
	nodes := map[string]*NodeRecord{}
	byAddr := map[netip.Addr]string{}
	byAddr6 := map[netip.Addr]string{}
	for i := range v.Nodes {
		n := v.Nodes[i]
		switch {
		case validateNodeName(n.Name) != nil:
			problems = append(problems, fmt.Sprintf("node %q: invalid name", n.Name))
			continue
		case !n.Address.Is4() || n.Address.IsUnspecified() || n.Address == a.net.Router():
			problems = append(problems, fmt.Sprintf("node %s: address %v: want an IPv4 unicast address", n.Name, n.Address))
			continue
		case byAddr[n.Address] != "":
			problems = append(problems, fmt.Sprintf("node %s: address %v is node %s's", n.Name, n.Address, byAddr[n.Address]))
			continue
		case n.PodCIDR.IsValid() && n.PodCIDR.Overlaps(a.cfg.PodCIDR):
			problems = append(problems, fmt.Sprintf("node %s: pod CIDR %v overlaps this node's %v", n.Name, n.PodCIDR, a.cfg.PodCIDR))
			continue
		}
		if n.Address6.IsValid() {
			// Its IPv4 side stays; without the IPv6 address its IPv6 pod CIDR is taken
			// or left out below as for a node that has none.
			if err := checkNodeAddress6(n.Address6, a.eng.router6); err != nil {
				problems = append(problems, fmt.Sprintf("node %s: %v (left out)", n.Name, err))
				n.Address6 = netip.Addr{}
			} else if other := byAddr6[n.Address6]; other != "" {
				problems = append(problems, fmt.Sprintf("node %s: address6 %v is node %s's (left out)", n.Name, n.Address6, other))
				n.Address6 = netip.Addr{}
			}
		}
		if err := checkNodeCIDR6(&n, a.cfg.Tunnel, a.cfg.PodCIDR6); err != nil {
			// Its IPv4 pods are reachable as ever; its IPv6 ones are not routed, and
			// have no identity here.
			problems = append(problems, fmt.Sprintf("node %s: %v (left out)", n.Name, err))
			n.PodCIDR6 = netip.Prefix{}
		} else if other := overlappingCIDR6(nodes, &n); other != "" {
			problems = append(problems, fmt.Sprintf("node %s: IPv6 pod CIDR %v overlaps node %s's (left out)", n.Name, n.PodCIDR6, other))
			n.PodCIDR6 = netip.Prefix{}
		}
		byAddr[n.Address] = n.Name
		if n.Address6.IsValid() {
			byAddr6[n.Address6] = n.Name
		}
		nodes[n.Name] = &n
	}
	remotes := map[string]*RemoteEndpointRecord{}
	byIP := map[netip.Addr]string{}
	for i := range v.Remotes {
		r := v.Remotes[i]
		node, ok := nodes[r.Node]
		switch {
		case !ok:
			continue // its node is not (yet) known: nothing routes to it
		case !r.IP.Is4() || a.cfg.PodCIDR.Contains(r.IP) || node.PodCIDR.IsValid() && !node.PodCIDR.Contains(r.IP):
			problems = append(problems, fmt.Sprintf("pod %s on node %s: address %v is outside the node's pod CIDR %v", r.Key(), r.Node, r.IP, node.PodCIDR))
			continue
		case byIP[r.IP] != "":
			problems = append(problems, fmt.Sprintf("pod %s: address %v is pod %s's", r.Key(), r.IP, byIP[r.IP]))
			continue
		}
		if _, err := validateLabels(r.Labels); err != nil {
			problems = append(problems, fmt.Sprintf("pod %s: %v", r.Key(), err))
			continue
		}
		if _, err := validPortRecords(r.Ports); err != nil {
			problems = append(problems, fmt.Sprintf("pod %s: %v", r.Key(), err))
			continue
		}
		byIP[r.IP] = r.Key()
		remotes[r.Key()] = &r
	}
	return nodes, remotes, problems
}

// parseObject parses policy object o of key: its Object, or else its Document (a
// record).
func (a *Agent) parseObject(key string, o PolicyObject) (parsedObject, error) {
	source := fmt.Sprintf("%s %s", o.Kind, objectName(o.Namespace, o.Name))
	var docs *policy.Documents
	var err error
	if o.Object != nil {
		docs, err = policy.ParseObject(source, o.Object)
	} else {
		docs, err = a.eng.Parse(source, o.Document)
	}
	if err == nil && len(docs.Policies)+len(docs.CIDRGroups)+len(docs.Taps) == 0 {
		err = fmt.Errorf("%s: no policy in the object", source)
	}
	if err != nil {
		return parsedObject{}, err
	}
	for _, c := range docs.Taps {
		c.Origin = "Kubernetes " + source
	}
	doc := o.Document
	if o.Object != nil {
		// The record is the parser's JSON rendering of the object (Raw), not a
		// marshalling of it again.
		doc = documentRaw(docs)
	}
	rec := &AcceptedObjectRecord{Key: key, Kind: o.Kind, Namespace: o.Namespace, Name: o.Name,
		ResourceVersion: o.ResourceVersion, Document: string(doc)}
	return parsedObject{rv: o.ResourceVersion, rec: rec, policies: docs.Policies, groups: docs.CIDRGroups, taps: docs.Taps}, nil
}

// documentRaw is the JSON rendering of the one object docs were parsed from: the Raw of
// what it holds.
func documentRaw(docs *policy.Documents) []byte {
	switch {
	case len(docs.Policies) > 0:
		return docs.Policies[0].Raw
	case len(docs.CIDRGroups) > 0:
		return docs.CIDRGroups[0].Raw
	case len(docs.Taps) > 0:
		return docs.Taps[0].Raw
	}
	return nil
}

// acceptedRecords compares the cluster's records of kept versions with what this sync
// keeps in force (parsed): the kept versions to record (an object refused whose record is
// missing or of another uid) and the records to delete (an object gone, or accepted in
// its current version).
func acceptedRecords(v ClusterView, parsed map[string]parsedObject) (record []PolicyObject, unrecord []string) {
	for _, key := range sortedKeys(parsed) {
		o, po := v.Objects[key], parsed[key]
		rec, ok := v.Accepted[key]
		if po.rv == o.ResourceVersion || po.rec == nil || ok && rec.UID == o.UID {
			continue
		}
		record = append(record, PolicyObject{Kind: o.Kind, Namespace: o.Namespace, Name: o.Name,
			UID: o.UID, ResourceVersion: po.rv, Document: []byte(po.rec.Document)})
	}
	for _, key := range sortedKeys(v.Accepted) {
		o, ok := v.Objects[key]
		if po, kept := parsed[key]; !ok || kept && po.rv == o.ResourceVersion {
			unrecord = append(unrecord, key)
		}
	}
	return record, unrecord
}

// clusterAccepted parses rec, the cluster's record of the last accepted version of
// object o of key, for an agent that refuses o and has none of its own. A record of
// another object of the name (another uid) or of no version does not hold; one that does
// not parse (an agent of another version wrote it) is logged and left.
func (a *Agent) clusterAccepted(key string, o, rec PolicyObject) (parsedObject, bool) {
	if rec.ResourceVersion == "" || rec.UID != o.UID || rec.Kind != o.Kind || rec.Namespace != o.Namespace || rec.Name != o.Name {
		return parsedObject{}, false
	}
	po, err := a.parseObject(key, rec)
	if err == nil {
		err = a.requireProxy(po.policies)
	}
	if err != nil {
		a.log.Warn("the cluster's accepted version of a policy object is refused", "object", key, "error", err)
		return parsedObject{}, false
	}
	return po, true
}

// restoreAccepted parses again the accepted versions of the policy objects the state held,
// so that the first sync after a restart keeps each in force whose current version the
// API holds is refused, as the agent did before it stopped. One that no longer parses (an
// agent of another version) is dropped: the next sync treats its object as new.
func (a *Agent) restoreAccepted(m *model) map[string]parsedObject {
	parsed := make(map[string]parsedObject, len(m.accepted))
	for key, rec := range m.accepted {
		po, err := a.parseObject(key, PolicyObject{Kind: rec.Kind, Namespace: rec.Namespace, Name: rec.Name,
			ResourceVersion: rec.ResourceVersion, Document: []byte(rec.Document)})
		if err != nil {
			a.log.Warn("the stored accepted version of a policy object no longer parses", "object", key, "error", err)
			delete(m.accepted, key)
			continue
		}
		po.rec = rec
		parsed[key] = po
	}
	return parsed
}

func remoteEqual(a, b *RemoteEndpointRecord) bool {
	return a.Namespace == b.Namespace && a.Name == b.Name && a.Node == b.Node && a.IP == b.IP &&
		a.ServiceAccount == b.ServiceAccount && a.Identity == b.Identity && a.Monitor == b.Monitor && maps.Equal(a.Labels, b.Labels) &&
		slices.Equal(a.Ports, b.Ports)
}

// syncTaps makes m's tap contracts from the Kubernetes API those of parsed; the local
// API's contracts stay. It returns the objects whose contracts it refused, by key, with
// why: on a dataplane without taps, a name another contract has, a monitor that is a pod
// but not a monitor, an overlap with a contract admitted before it.
//
// A contract accepted by an earlier sync (the same parse) stays without these checks: a
// relabel or an annotation removed later does not undo it (the overlap is reported on
// the contracts, a monitor that is no longer one is unavailable), as with the local API.
// The new and changed ones are admitted after those, in the order of their objects' keys,
// each against the contracts admitted so far. Overlaps are checked on every pod of the
// cluster, not only this node's, so that every node refuses the same objects and the one
// Event posted for a refusal holds for all.
func (a *Agent) syncTaps(m *model, parsed map[string]parsedObject) map[string]string {
	refused := map[string]string{}
	for name, st := range m.taps {
		if st.Rec.Cluster {
			delete(m.taps, name)
		}
	}
	type candidate struct {
		key string
		c   *tap.Contract
	}
	var fresh []candidate
	for _, key := range sortedKeys(parsed) {
		for _, c := range parsed[key].taps {
			if prev, ok := a.model.taps[c.Name]; ok && prev.Contract == c && prev.Rec.Cluster {
				m.taps[c.Name] = prev
				continue
			}
			fresh = append(fresh, candidate{key, c})
		}
	}
	if len(fresh) == 0 {
		return refused
	}
	compiled := a.cur.taps.Compiled()
	world := tapWorld(m, a.cur.derived)
	taken := map[string]bool{} // names of m.taps, the tap policy's and the candidates kept
	for name := range m.taps {
		taken[name] = true
	}
	for _, c := range compiled {
		taken[c.Name] = true
	}
	admitted := map[string]bool{} // names admitted so far (filled below)
	// A refused update keeps the version admitted before it (the same object's contract of
	// that name), as a refused policy update does: an inline tap must not stop inspecting
	// because its new version cannot be admitted.
	refuse := func(cd candidate, err error) {
		refused[cd.key] = err.Error()
		if prev, ok := a.model.taps[cd.c.Name]; ok && prev.Rec.Cluster && prev.Rec.Source == cd.c.Origin {
			m.taps[cd.c.Name] = prev
			taken[cd.c.Name], admitted[cd.c.Name] = true, true
			refused[cd.key] += " (its last accepted version stays in force)"
		}
	}
	var pending []candidate
	for _, cd := range fresh {
		if err := a.clusterTapError(world, cd.c, taken); err != nil {
			refuse(cd, err)
			continue
		}
		taken[cd.c.Name] = true
		pending = append(pending, cd)
	}
	// One resolution of everything against every pod gives each pair that can meet.
	all := make([]*tap.Contract, 0, len(m.taps)+len(compiled)+len(pending))
	for _, st := range m.taps {
		all = append(all, st.Contract)
	}
	all = append(all, compiled...)
	for _, cd := range pending {
		all = append(all, cd.c)
	}
	eps := world.Endpoints(m.monitorsDown)
	for i := range eps {
		eps[i].Node = "" // every pod as if local: overlaps anywhere in the cluster
	}
	conflicts := append(tap.Resolve(all, eps, "").Conflicts, tap.NamedConflicts(all)...)
	for name := range m.taps {
		admitted[name] = true
	}
	for _, c := range compiled {
		admitted[c.Name] = true
	}
	for _, cd := range pending {
		c := cd.c
		var mine []tap.Conflict
		for _, cf := range conflicts {
			if cf.A == c.Name && admitted[cf.B] || cf.B == c.Name && admitted[cf.A] {
				mine = append(mine, cf)
			}
		}
		if len(mine) > 0 {
			refuse(cd, &tap.OverlapError{Conflicts: mine})
			continue
		}
		admitted[c.Name] = true
		m.taps[c.Name] = &taps.Stored{Rec: &TapRecord{Kind: c.Kind, Name: c.Name, Source: c.Origin, Raw: json.RawMessage(c.Raw), Cluster: true}, Contract: c}
	}
	return refused
}

// clusterTapError says why contract c of the Kubernetes API cannot be admitted whatever
// the other contracts' matches are; taken holds the names in use.
func (a *Agent) clusterTapError(w taps.World, c *tap.Contract, taken map[string]bool) error {
	if !a.taps.HasTaps() {
		return taps.ErrNoTaps
	}
	if taken[c.Name] {
		return fmt.Errorf("%s %s: another tap contract has that name (one of the local API, the tap policy's, or an object of the other tap kind: both kinds share one space of names)", c.Kind, c.Name)
	}
	if err := taps.CheckMonitor(w, c); err != nil {
		return errors.New(strings.Replace(err.Error(), taps.MonitorHint, "a monitor is a pod annotated "+MonitorAnnotation+`: "true"`, 1))
	}
	return nil
}

func objectName(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}

// kubernetesStatus is the Kubernetes part of status; a.mu must be held.
func (a *Agent) kubernetesStatus() *api.KubernetesStatus {
	if a.cfg.Kubernetes == nil || a.k8s == nil {
		return nil
	}
	k := a.cfg.Kubernetes
	st := &api.KubernetesStatus{
		NodeName:        k.NodeName,
		Nodes:           len(a.model.nodes),
		RemoteEndpoints: len(a.model.remotes),
		Synced:          a.k8s.synced,
		Syncs:           a.k8s.syncs,
		WatchErrors:     a.k8s.watchErrors,
		SyncFailures:    a.k8s.syncFailures,
		LastSync:        a.k8s.lastSync,
		LastError:       a.k8s.lastErr,
		LastErrorAt:     a.k8s.lastErrAt,
		Problems:        a.k8s.problems,
		Quarantined:     a.quarantineStatus(),
	}
	if k.NodeAddress.IsValid() {
		st.NodeAddress = k.NodeAddress.String()
	}
	st.Failing = a.k8s.failing
	unresolved := a.unresolvedPods()
	for _, key := range sortedKeys(unresolved) {
		st.Unresolved = append(st.Unresolved, api.RefusedObject{Object: key, Error: unresolved[key]})
	}
	st.Clean = st.Synced && len(a.k8s.refused)+len(a.k8s.problems)+len(unresolved) == 0
	for _, key := range sortedKeys(a.k8s.refused) {
		st.Refused = append(st.Refused, api.RefusedObject{Object: key, Error: a.k8s.refused[key]})
	}
	return st
}

// unresolvedPods are the pods of the current state whose identity is unresolved
// (claims.go), by namespace/name, with why and what was done; a.mu must be held.
func (a *Agent) unresolvedPods() map[string]string {
	if a.cur == nil {
		return nil
	}
	u := a.cur.unresolved
	if len(u.endpoints)+len(u.remotes) == 0 {
		return nil
	}
	out := make(map[string]string, len(u.endpoints)+len(u.remotes))
	for key, why := range u.endpoints {
		out[key] = why + "; the pod is denied all traffic until it is resolved"
	}
	for key, why := range u.remotes {
		out[key] = why + "; the pod's address is left out (no policy admits it) until it is resolved"
	}
	return out
}

// cniPod asks the Kubernetes view for the pod of a CNI ADD, waiting a bounded time for it:
// without its labels the endpoint would have an identity no policy selects, so the ADD
// fails instead (the runtime retries).
func (a *Agent) cniPod(ctx context.Context, ns, name string) (PodInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, CNIPodWait)
	defer cancel()
	p, err := a.cfg.Kubernetes.Pods.LocalPod(ctx, ns, name)
	if err != nil {
		return PodInfo{}, api.Errorf(http.StatusServiceUnavailable, "pod %s/%s: %v", ns, name, err)
	}
	return p, nil
}

// CNIPodWait bounds how long a CNI ADD waits for its pod to be in the Kubernetes view.
const CNIPodWait = 5 * time.Second

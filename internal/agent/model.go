package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sort"
	"time"

	"github.com/rampartnet/rampart/internal/agent/taps"
	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/service"
)

// model is the agent's configuration: what the user asked for. It is copied for every
// change (maps copied, records shared: records are immutable once in a model).
type model struct {
	namespaces map[string]labels.Labels // user labels plus kubernetes.io/metadata.name
	endpoints  map[string]*EndpointRecord
	policies   map[string]*storedPolicy
	cidrsets   map[string]*cidrSet              // by name; persisted as files of their own (cidrsetfile.go)
	nodes      map[string]*NodeRecord           // other nodes, by name (remote.go)
	remotes    map[string]*RemoteEndpointRecord // pods on other nodes, by namespace/name
	taps       map[string]*taps.Stored          // tap contracts, by name (tapstep.go)
	tapPolicy  *taps.PolicyRecord               // the tap policy, nil: none
	services   map[string]*ServiceRecord        // by namespace/name (services.go)
	// accepted is, in Kubernetes mode, the last accepted version of each policy object,
	// by the watcher's key (cluster.go): persisted, so that a version the agent refuses
	// after a restart finds the accepted one still in force.
	accepted map[string]*AcceptedObjectRecord
	// quarantine is, in Kubernetes mode, the addresses of deleted pods that are not handed
	// out again yet (quarantine.go).
	quarantine map[netip.Addr]*QuarantineRecord
	// monitorsDown is why local monitors are down, by namespace/name (monitorcheck.go):
	// what the agent last saw of them, never persisted.
	monitorsDown map[string]string
	// fqdn is what the toFQDNs selectors select of the learnt names (dns.go); nil: no
	// name learnt. Never persisted: the cache of names is (stateFile.FQDN).
	fqdn *fqdnView
	// nodeLabels are this node's labels: Config.NodeLabels, or the Node object's in
	// Kubernetes mode. Host policy's nodeSelector matches them.
	nodeLabels labels.Labels
	nextRuleID uint32
	nextEpID   uint32
}

type storedPolicy struct {
	rec *PolicyRecord
	pol *policy.Policy // parsed from rec.Raw, rule IDs filled from rec.RuleIDs
}

func newModel() *model {
	return &model{
		namespaces: map[string]labels.Labels{},
		endpoints:  map[string]*EndpointRecord{},
		policies:   map[string]*storedPolicy{},
		cidrsets:   map[string]*cidrSet{},
		nodes:      map[string]*NodeRecord{},
		remotes:    map[string]*RemoteEndpointRecord{},
		taps:       map[string]*taps.Stored{},
		services:   map[string]*ServiceRecord{},
		accepted:   map[string]*AcceptedObjectRecord{},
		quarantine: map[netip.Addr]*QuarantineRecord{},
		nextRuleID: 1,
		nextEpID:   1,
	}
}

func (m *model) clone() *model {
	return &model{
		namespaces:   maps.Clone(m.namespaces),
		endpoints:    maps.Clone(m.endpoints),
		policies:     maps.Clone(m.policies),
		cidrsets:     maps.Clone(m.cidrsets),
		nodes:        maps.Clone(m.nodes),
		remotes:      maps.Clone(m.remotes),
		taps:         maps.Clone(m.taps),
		tapPolicy:    m.tapPolicy,
		services:     maps.Clone(m.services),
		accepted:     maps.Clone(m.accepted),
		quarantine:   maps.Clone(m.quarantine),
		monitorsDown: maps.Clone(m.monitorsDown),
		fqdn:         m.fqdn,
		nodeLabels:   m.nodeLabels,
		nextRuleID:   m.nextRuleID,
		nextEpID:     m.nextEpID,
	}
}

// ensureNamespace adds a namespace with only its name label if it is missing.
func (m *model) ensureNamespace(ns string) {
	if _, ok := m.namespaces[ns]; !ok {
		m.namespaces[ns] = labels.Labels{labels.KeyNamespaceName: ns}
	}
}

// allocEpID returns a free endpoint id. A cursor moves forward so that a deleted
// endpoint's id (and with it any of its leftover conntrack entries) is not reused soon.
func (m *model) allocEpID() (uint32, error) {
	used := make(map[uint32]bool, len(m.endpoints))
	for _, e := range m.endpoints {
		used[e.EpID] = true
	}
	id := m.nextEpID
	for range MaxEndpoints {
		if id < 1 || id > MaxEndpoints {
			id = 1
		}
		if !used[id] {
			m.nextEpID = id + 1
			return id, nil
		}
		id++
	}
	return 0, fmt.Errorf("all %d endpoint ids are in use", MaxEndpoints)
}

// allocRuleIDs gives p's rules ids: the ids of the previous version of the same policy
// where it had as many rules, new ones beyond. Stable ids keep unchanged map entries
// unchanged on an update.
func (m *model) allocRuleIDs(p *policy.Policy, prev []uint32) []uint32 {
	ids := make([]uint32, len(p.Rules))
	for i := range p.Rules {
		if i < len(prev) {
			ids[i] = prev[i]
		} else {
			ids[i] = m.nextRuleID
			m.nextRuleID++
		}
		p.Rules[i].ID = ids[i]
	}
	return ids
}

// putPolicy puts parsed policy p in m: the one way a policy enters the model, from the
// local API (Apply) and from the Kubernetes API (SyncCluster) alike. Its rules keep the
// ids of prev, the version of its key the model held, where it had as many. It says
// what it did: "created", "configured", or "unchanged" when prev came from the same
// document (Raw: both compact).
func (m *model) putPolicy(p *policy.Policy, prev *storedPolicy) string {
	action := "created"
	var prevIDs []uint32
	if prev != nil {
		action = "configured"
		prevIDs = prev.rec.RuleIDs
		if bytes.Equal(prev.rec.Raw, p.Raw) {
			action = "unchanged"
		}
	}
	ids := m.allocRuleIDs(p, prevIDs)
	m.policies[p.Key()] = &storedPolicy{
		rec: &PolicyRecord{Kind: p.Kind, Namespace: p.Namespace, Name: p.Name, Source: p.Source,
			Raw: json.RawMessage(p.Raw), RuleIDs: ids},
		pol: p,
	}
	return action
}

// putCIDRGroup makes CIDR group g (its prefixes: content) the CIDR set of its name in m:
// the one way a group enters the model, from either API. A set of the name keeps its
// index; a new one takes one that neither m nor cur (the model in force) uses. It says
// what it did, as putPolicy does.
func (m *model) putCIDRGroup(g *policy.CIDRGroup, content *api.PrefixList, cur *model, now time.Time) (string, error) {
	old := m.cidrsets[g.Name]
	if old != nil && prefixListsEqual(old.prefixes, content) {
		return "unchanged", nil
	}
	action := "created"
	meta := cidrSetMeta{Name: g.Name, Source: string(policy.KindCiliumCIDRGroup) + " " + g.Source, LoadedAt: now, ChangedAt: now}
	if old != nil {
		action = "configured"
		meta.Index = old.meta.Index
	} else {
		idx, ok := freeIndex(m.cidrsets, cur.cidrsets)
		if !ok {
			return "", api.Conflict("%s %s: all %d CIDR sets are in use", policy.KindCiliumCIDRGroup, g.Name, maxCIDRSets)
		}
		meta.Index = idx
	}
	m.cidrsets[g.Name] = &cidrSet{meta: meta, prefixes: content}
	return action, nil
}

// fullLabels is the label set an endpoint's identity is made of (labels.ForPod).
func fullLabels(e *EndpointRecord, nsLabels labels.Labels) labels.Labels {
	return labels.ForPod(e.Namespace, e.Labels, nsLabels, e.ServiceAccount)
}

// desired is the outcome of computing a model: the mapstate input and state, and what the
// agent needs to apply and explain it.
type desired struct {
	input      mapstate.Input
	state      mapstate.State
	identities map[string]identity.Identity // endpoint key -> identity
	alloc      *identity.Allocator          // the allocator after this computation
	// unresolved are the endpoints (denied everything) and remote pods (left out) whose
	// cluster identity disagrees with another record's (claims.go).
	unresolved unresolved
	// taps is the taps subsystem's part: the tap policy compiled, the contracts resolved
	// against the endpoints (tapstep.go); nil only in emptyDesired.
	taps *taps.State
	// services is the Service translation's table (services.go).
	services service.Table

	// What the next computation may reuse (see compute).
	memo    *mapstate.Memo
	derived map[*EndpointRecord]derivedEndpoint
	keys    []string // the endpoint keys, sorted
}

// derivedEndpoint is what compute derives from an endpoint record and its namespace's
// labels. Records are immutable, so it stays valid while the namespace labels do.
type derivedEndpoint struct {
	nsLabels labels.Labels
	full     labels.Labels // fullLabels
	key      string        // identity.LabelsKey(full)
	named    map[string]mapstate.NamedPort
}

func emptyDesired() *desired {
	return &desired{
		state:      mapstate.State{Endpoints: map[uint32]mapstate.EndpointPolicy{}, IPCache: map[netip.Prefix]mapstate.IPCacheEntry{}},
		identities: map[string]identity.Identity{},
	}
}

// compute turns a model into the desired dataplane state. It is pure apart from the copy of
// the allocator it is given (which it returns in desired.alloc). A panic in the engine is
// turned into an error: a bug must not take the agent down nor touch the dataplane.
//
// prev (nil: none) is the current state: what it derived per endpoint (labels, identity
// key, named ports) and the policy computation's memo are reused where unchanged, so a
// change of one endpoint costs about one endpoint's work beyond a walk over the others.
func (e Engine) compute(m *model, alloc *identity.Allocator, router netip.Addr, prev *desired) (d *desired, err error) {
	defer func() {
		if r := recover(); r != nil {
			d, err = nil, fmt.Errorf("computing policy state: internal error: %v", r)
		}
	}()
	var rules []policy.Rule
	refs := map[uint32]mapstate.PolicyRef{}
	for _, key := range sortedKeys(m.policies) {
		p := m.policies[key].pol
		for _, r := range p.Rules {
			rules = append(rules, r)
			refs[r.ID] = mapstate.PolicyRef{Kind: p.Kind, Namespace: p.Namespace, Name: p.Name}
		}
	}
	rules = expandFQDN(rules, m.fqdn)
	prefixes := e.Prefixes(rules)
	if z := zombiePrefixes(m.fqdn); len(z) > 0 {
		prefixes = append(prefixes, z...)
		slices.SortFunc(prefixes, comparePrefix)
		prefixes = slices.Compact(prefixes)
	}
	cidrIDs := make(map[netip.Prefix]identity.Identity, len(prefixes))
	for _, p := range prefixes {
		cidrIDs[p] = alloc.ForCIDR(p)
	}
	var (
		prevDerived map[*EndpointRecord]derivedEndpoint
		memo        *mapstate.Memo
	)
	if prev != nil {
		prevDerived, memo = prev.derived, prev.memo
	}
	keys := endpointKeys(m, prev)
	d = &desired{
		identities: make(map[string]identity.Identity, len(m.endpoints)),
		alloc:      alloc,
		derived:    make(map[*EndpointRecord]derivedEndpoint, len(m.endpoints)),
		keys:       keys,
	}
	// By label set key: its identity, and one map of it that every endpoint with that set
	// shares in the input (the computation compares shared maps at once).
	byKey := map[string]identity.Identity{}
	canon := map[string]labels.Labels{}
	for _, key := range keys {
		rec := m.endpoints[key]
		nsLabels := m.namespaces[rec.Namespace]
		de, ok := prevDerived[rec]
		if !ok || !maps.Equal(de.nsLabels, nsLabels) {
			de = deriveEndpoint(rec, nsLabels)
		}
		d.derived[rec] = de
	}
	// Claimed identities (the cluster's, in Kubernetes mode) before any endpoint without
	// one is given a number, which must not be one of them.
	d.unresolved = claimIdentities(m, keys, d.derived, alloc)
	used := remoteInput(m, alloc, &d.input, d.unresolved.remotes, e.tunnel)
	d.input.Endpoints = make([]mapstate.Endpoint, 0, len(m.endpoints))
	for _, key := range keys {
		rec := m.endpoints[key]
		de := d.derived[rec]
		if _, ok := d.unresolved.endpoints[key]; ok {
			d.identities[key] = identity.Init // denied below: no peer's policy may select it
			continue
		}
		id, ok := byKey[de.key]
		if !ok {
			id = alloc.ForLabels(de.full)
			byKey[de.key] = id
			canon[de.key] = de.full
			used = append(used, de.full)
		}
		d.identities[key] = id
		d.input.Endpoints = append(d.input.Endpoints, mapstate.Endpoint{
			ID:         rec.EpID,
			Namespace:  rec.Namespace,
			Name:       rec.Name,
			Labels:     canon[de.key],
			Identity:   id,
			IP:         rec.IP,
			IP6:        rec.IP6,
			NamedPorts: de.named,
			Audit:      rec.Audit,
		})
	}
	alloc.Retain(used, prefixes)
	d.input.Rules = rules
	if e.hostFirewall {
		d.input.Endpoints = append(d.input.Endpoints, e.hostEndpoint(m))
	}
	d.input.HostIPs = e.hostIPs(router)
	d.input.AllowHost = e.allowHost
	d.input.CIDRIdentities = cidrIDs
	d.input.RulePolicies = refs
	d.input.CIDRSets = setIndexes(m.cidrsets)
	d.state, d.memo = e.computeWith(d.input, memo)
	if d.state.Endpoints == nil {
		d.state.Endpoints = map[uint32]mapstate.EndpointPolicy{}
	}
	denyUnresolved(m, d, e.tunnel)
	for _, sub := range e.subsystems {
		if err := sub.compute(m, d, prev); err != nil {
			return nil, err
		}
	}
	if d.services, err = service.Compute(serviceModel(m), nodeAddrs(m, e.nodeAddr)); err != nil {
		return nil, err
	}
	return d, nil
}

// endpointKeys returns m's endpoint keys sorted: prev's sorted keys that remain, with the
// new ones merged in, so a change of one endpoint does not sort them all again.
func endpointKeys(m *model, prev *desired) []string {
	if prev == nil || prev.keys == nil {
		return sortedKeys(m.endpoints)
	}
	keys := make([]string, 0, len(m.endpoints))
	for _, k := range prev.keys {
		if _, ok := m.endpoints[k]; ok {
			keys = append(keys, k)
		}
	}
	if len(keys) == len(m.endpoints) {
		return keys
	}
	for k := range m.endpoints {
		if _, ok := prev.identities[k]; !ok {
			i, _ := slices.BinarySearch(keys, k)
			keys = slices.Insert(keys, i, k)
		}
	}
	return keys
}

func deriveEndpoint(rec *EndpointRecord, nsLabels labels.Labels) derivedEndpoint {
	de := derivedEndpoint{nsLabels: nsLabels, full: fullLabels(rec, nsLabels)}
	de.key = identity.LabelsKey(de.full)
	de.named = namedPorts(rec.Ports)
	return de
}

// namedPorts is the computation's form of an endpoint's (or a remote pod's) named ports;
// nil without any.
func namedPorts(ports []PortRecord) map[string]mapstate.NamedPort {
	if len(ports) == 0 {
		return nil
	}
	named := make(map[string]mapstate.NamedPort, len(ports))
	for _, p := range ports {
		proto, _ := parseProtocol(p.Protocol)
		named[p.Name] = mapstate.NamedPort{Port: p.Port, Protocol: proto}
	}
	return named
}

func cloneAllocator(a *identity.Allocator) (*identity.Allocator, error) {
	return a.Clone(), nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// parseRecord parses a stored policy (at start).
func (e Engine) parseRecord(rec *PolicyRecord) (*policy.Policy, error) {
	docs, err := e.Parse(rec.Source, rec.Raw)
	if err != nil {
		return nil, fmt.Errorf("re-parsing stored policy %s: %w", rec.Key(), err)
	}
	ps := docs.Policies
	if len(ps) != 1 || ps[0].Key() != rec.Key() {
		return nil, fmt.Errorf("re-parsing stored policy %s: got %d policies", rec.Key(), len(ps))
	}
	p := ps[0]
	if len(p.Rules) != len(rec.RuleIDs) {
		return nil, fmt.Errorf("re-parsing stored policy %s: %d rules, %d stored rule ids", rec.Key(), len(p.Rules), len(rec.RuleIDs))
	}
	for i := range p.Rules {
		p.Rules[i].ID = rec.RuleIDs[i]
	}
	return p, nil
}

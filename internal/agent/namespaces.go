package agent

import (
	"context"
	"fmt"
	"maps"
	"sort"

	"github.com/rampartnet/rampart/internal/agent/taps"
	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/podaddr"
	"github.com/rampartnet/rampart/internal/version"
)

// LabelNamespace sets and removes namespace labels, creating the namespace if needed. The
// identities of the namespace's endpoints follow.
func (a *Agent) LabelNamespace(ctx context.Context, namespace string, change api.LabelChange) (api.Namespace, error) {
	if err := a.errManaged("namespaces"); err != nil {
		return api.Namespace{}, err
	}
	if err := validateNamespace(namespace); err != nil {
		return api.Namespace{}, err
	}
	// Namespace labels are user labels too, except the name label the agent keeps itself.
	set, err := validateNamespaceLabels(change.Set)
	if err != nil {
		return api.Namespace{}, err
	}
	for _, k := range change.Remove {
		if labels.NormalizeKey(k) == labels.KeyNamespaceName {
			return api.Namespace{}, api.BadRequest("label %s cannot be removed", labels.KeyNamespaceName)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	m, _, err := a.change(func(m *model) error {
		m.ensureNamespace(namespace)
		m.namespaces[namespace] = applyLabelChange(m.namespaces[namespace], set, change.Remove)
		return nil
	})
	if err != nil {
		return api.Namespace{}, err
	}
	return namespaceView(m, namespace), nil
}

func validateNamespaceLabels(in map[string]string) (labels.Labels, error) {
	rest := maps.Clone(in)
	delete(rest, labels.KeyNamespaceName)
	if _, ok := in[labels.KeyNamespaceName]; ok {
		return nil, api.BadRequest("label %s is set by the agent to the namespace name", labels.KeyNamespaceName)
	}
	return validateLabels(rest)
}

// ListNamespaces lists namespaces with their labels and endpoint counts.
func (a *Agent) ListNamespaces(ctx context.Context) ([]api.Namespace, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := []api.Namespace{}
	for _, ns := range sortedKeys(a.model.namespaces) {
		out = append(out, namespaceView(a.model, ns))
	}
	return out, nil
}

func namespaceView(m *model, ns string) api.Namespace {
	n := api.Namespace{Name: ns, Labels: map[string]string(maps.Clone(nsLabelsOf(m, ns)))}
	for _, e := range m.endpoints {
		if e.Namespace == ns {
			n.Endpoints++
		}
	}
	return n
}

// ListIdentities lists reserved identities, then endpoint and CIDR identities with the
// endpoints that have them.
func (a *Agent) ListIdentities(ctx context.Context) ([]api.Identity, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	users := map[identity.Identity][]string{}
	for key, id := range a.cur.identities {
		users[id] = append(users[id], key)
	}
	out := []api.Identity{}
	var reserved []identity.Identity
	for id := range identity.ReservedNames {
		reserved = append(reserved, id)
	}
	sort.Slice(reserved, func(i, j int) bool { return reserved[i] < reserved[j] })
	for _, id := range reserved {
		out = append(out, api.Identity{ID: id, Kind: "reserved", Labels: []string{identity.ReservedNames[id]}})
	}
	for _, e := range a.cur.alloc.List() {
		v := api.Identity{ID: e.Identity}
		if e.Prefix.IsValid() {
			v.Kind = "cidr"
			v.Prefix = e.Prefix.String()
		} else {
			v.Kind = "endpoint"
			v.Labels = labelList(e.Labels)
			v.Endpoints = users[e.Identity]
			sort.Strings(v.Endpoints)
		}
		out = append(out, v)
	}
	// CIDR set identities are the highest numbers.
	sets := make([]*cidrSet, 0, len(a.model.cidrsets))
	for _, s := range a.model.cidrsets {
		sets = append(sets, s)
	}
	sort.Slice(sets, func(i, j int) bool { return sets[i].meta.Index < sets[j].meta.Index })
	for _, s := range sets {
		out = append(out, api.Identity{ID: identity.CIDRSet(s.meta.Index), Kind: "cidrset", Labels: []string{"cidrgroup:" + s.meta.Name}})
	}
	return out, nil
}

// Status reports the agent's state.
func (a *Agent) Status(ctx context.Context) (api.Status, error) {
	// Before the lock: reading the maps' and the process's memory needs no agent state.
	mem := a.memoryStatus()
	a.refreshMonitors()
	a.mu.Lock()
	defer a.mu.Unlock()
	seen, lost := a.flows.stats()
	buffered, history := a.flows.buffered()
	var sendSide *api.SendSideStatus
	if a.cfg.L7SendSide {
		st, err := a.dp.SockStatus()
		if err != nil {
			return api.Status{}, fmt.Errorf("send-side L7 verdict status: %w", err)
		}
		ss := api.SendSideStatus(st)
		sendSide = &ss
	}
	var cidr6, router6 string
	if a.cfg.DualStack() {
		cidr6, router6 = a.cfg.PodCIDR6.String(), podaddr.Router6(a.cfg.PodCIDR6).String()
	}
	return api.Status{
		Version:       version.Get().String(),
		Instance:      a.cfg.Instance,
		PodCIDR:       a.cfg.PodCIDR.String(),
		Router:        a.net.Router().String(),
		PodCIDR6:      cidr6,
		Router6:       router6,
		NodeNetns:     a.cfg.NodeNetns,
		StateDir:      a.cfg.StateDir,
		BPFDir:        a.cfg.BPFDir,
		StartedAt:     a.started,
		Endpoints:     len(a.model.endpoints),
		Namespaces:    len(a.model.namespaces),
		Policies:      len(a.model.policies),
		Identities:    len(a.cur.alloc.List()),
		CIDRSets:      len(a.model.cidrsets),
		FlowsSeen:     seen,
		FlowsLost:     lost,
		FlowsBuffered: buffered,
		FlowHistory:   history,
		Degraded:      a.degraded,
		Proxy:         a.proxyStatus(),
		DNS:           a.dnsStatus(),
		SendSide:      sendSide,
		Memory:        mem,
		Kubernetes:    a.kubernetesStatus(),
		TapPolicy:     taps.PolicyStatus(a.cur.taps),
		Monitors:      a.monitorsStatus(),
		Host:          a.hostStatus(),
	}, nil
}

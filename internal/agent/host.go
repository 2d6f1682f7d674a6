package agent

import (
	"fmt"
	"net/http"
	"net/netip"
	"slices"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/podaddr"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/service"
)

// HostDevices is host policy's place in the dataplane (*datapath.Host): the host
// programs on the node's own interfaces, and the flows host policy never cuts.
type HostDevices interface {
	// AttachHost puts the host programs on the interfaces ifnames of the network
	// namespace at netnsPath (and takes them off the others) and returns their indexes.
	AttachHost(netnsPath string, ifnames []string) ([]uint32, error)
	// DetachHostDevices takes them off every interface there.
	DetachHostDevices(netnsPath string) error
	SetHostSafe(entries []datapath.HostSafe) error
	// RecheckFlows has every established flow checked again on its next packet.
	RecheckFlows() error
}

// hostState is host policy's part of the agent (Config.HostFirewall).
type hostState struct {
	devices []string // the host devices' names
	// ifindexes are the host devices' interface indexes: each holds the host endpoint's
	// info.
	ifindexes []uint32
	addr      netip.Addr // the host endpoint's address: the first host device's
	// safe is what the host_safe map holds (nil: not written yet).
	safe []datapath.HostSafe
}

// requireHostPolicy refuses a policy with host rules (nodeSelector) when this agent does
// not enforce host policy: accepted, it would be in force nowhere.
func (a *Agent) requireHostPolicy(ps []*policy.Policy) error {
	if a.hostFirewall() {
		return nil
	}
	for _, p := range ps {
		for _, r := range p.Rules {
			if r.Host {
				return api.Errorf(http.StatusBadRequest, "%s %s: spec.nodeSelector: host policy needs rampartd --host-firewall", p.Kind, p.Name)
			}
		}
	}
	return nil
}

// hostFirewall says whether this agent enforces host policy (Config.HostFirewall).
func (a *Agent) hostFirewall() bool { return a.hostDevs != nil }

// setupHost finds the host devices and their addresses (which become host addresses in
// the ipcache), before the first computation. Without the host firewall it takes the host
// programs an earlier run of this instance left off every interface: their endpoint info
// goes with the other stale endpoints (removeStale).
func (a *Agent) setupHost(m *model) error {
	if !a.cfg.HostFirewall {
		for _, key := range sortedKeys(m.policies) {
			if slices.ContainsFunc(m.policies[key].pol.Rules, func(r policy.Rule) bool { return r.Host }) {
				a.log.Warn("a stored host policy is not enforced: rampartd runs without --host-firewall", "policy", key)
			}
		}
		// Only this instance's own programs: another instance may run the host firewall in
		// the same namespace.
		if a.dp.Host != nil && a.own.HostDevices {
			if err := a.dp.Host.DetachHostDevices(a.net.NetnsPath()); err != nil {
				return err
			}
			a.own.HostDevices = false
			return a.own.save()
		}
		return nil
	}
	if a.dp.Host == nil {
		return fmt.Errorf("host firewall: this dataplane has no host programs")
	}
	if len(a.cfg.HostDevices) == 0 && !a.eng.nodeAddr.IsValid() {
		// Checked here, not with the rest of the configuration: uninstall takes the
		// same flags without Kubernetes mode.
		return fmt.Errorf("host firewall: name the host devices (outside Kubernetes mode there is no node address to find them by)")
	}
	devs, err := a.net.Devices(a.cfg.HostDevices, a.eng.nodeAddr)
	if err != nil {
		return fmt.Errorf("host firewall: %w", err)
	}
	h := &hostState{}
	for _, d := range devs {
		h.devices = append(h.devices, d.Name)
		h.ifindexes = append(h.ifindexes, d.Index)
		for _, ad := range d.Addrs {
			if !slices.Contains(a.eng.hostAddrs, ad) {
				a.eng.hostAddrs = append(a.eng.hostAddrs, ad)
			}
		}
	}
	// The host endpoint's address is IPv4 (its IPv6 ones are host addresses in the
	// ipcache like the rest).
	h.addr = a.net.Router()
	if i := slices.IndexFunc(a.eng.hostAddrs, netip.Addr.Is4); i >= 0 {
		h.addr = a.eng.hostAddrs[i]
	}
	if a.eng.nodeAddr.IsValid() {
		h.addr = a.eng.nodeAddr
	}
	a.eng.hostFirewall, a.eng.hostAddr = true, h.addr
	a.hostDevs = h
	return nil
}

// attachHost puts the host programs on the host devices, once the host endpoint's info
// and policy are in place (the first apply): a device with the programs but no info
// would drop everything.
func (a *Agent) attachHost() error {
	if a.hostDevs == nil {
		return nil
	}
	if _, err := a.dp.Host.AttachHost(a.net.NetnsPath(), a.hostDevs.devices); err != nil {
		return err
	}
	a.log.Info("host firewall on", "devices", a.hostDevs.devices)
	return nil
}

// applyHost writes the host endpoint's info and policy onto every host device when it
// changed (or force), and the flows host policy never cuts.
func (a *Agent) applyHost(old, new *desired, m *model, force bool) error {
	h := a.hostDevs
	if h == nil {
		return nil
	}
	safe := a.hostSafe(m)
	if force || h.safe == nil || !slices.Equal(safe, h.safe) {
		if err := a.dp.Host.SetHostSafe(safe); err != nil {
			return fmt.Errorf("host firewall: %w", err)
		}
		h.safe = safe
	}
	id := mapstate.HostEndpointID
	if !force && policyEqual(old.state.Endpoints[id], new.state.Endpoints[id]) {
		return nil
	}
	info := datapath.EndpointInfo{EpID: id, Identity: identity.Host, Addr: h.addr, Host: true}
	for _, idx := range h.ifindexes {
		if err := a.dp.ApplyEndpoint(idx, info, new.state.Endpoints[id]); err != nil {
			return fmt.Errorf("host endpoint: %w", err)
		}
	}
	// The endpoints' flows with the node were judged by the host's policy too: a deny
	// entry it gained must reach them (the host endpoint's own flows follow its revision).
	if err := a.dp.Host.RecheckFlows(); err != nil {
		return fmt.Errorf("host endpoint: %w", err)
	}
	return nil
}

// hostSafe lists the flows host policy never cuts: to the API server (Config.APIServers
// and the backends of the default/kubernetes Service, which the node's connections to
// the Service's address reach after translation).
func (a *Agent) hostSafe(m *model) []datapath.HostSafe {
	safe := []datapath.HostSafe{}
	add := func(ap netip.AddrPort) {
		s := datapath.HostSafe{Addr: netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), Proto: uint8(policy.ProtoTCP)}
		if !slices.Contains(safe, s) {
			safe = append(safe, s)
		}
	}
	for _, ap := range a.cfg.APIServers {
		add(ap)
	}
	if svc, ok := m.services["default/kubernetes"]; ok {
		for _, p := range svc.Ports {
			if p.Protocol != service.TCP {
				continue
			}
			for _, e := range svc.Endpoints {
				port := p.TargetPort
				if n, ok := e.Ports[p.Name]; ok {
					port = n
				}
				if port == 0 {
					port = p.Port
				}
				add(netip.AddrPortFrom(e.Addr, port))
			}
		}
	}
	slices.SortFunc(safe, func(x, y datapath.HostSafe) int { return x.Addr.Compare(y.Addr) })
	return safe
}

// hostEndpoint is the node's own endpoint in the computation's input.
func (e Engine) hostEndpoint(m *model) mapstate.Endpoint {
	return mapstate.Endpoint{ID: mapstate.HostEndpointID, Host: true, Name: mapstate.HostEndpointName,
		Labels: m.nodeLabels, Identity: identity.Host, IP: e.hostAddr}
}

// hostIPs are the addresses with the host identity: the router address, on a dual-stack
// node its IPv6 address and the host veths' link-local one, the node's address
// (Kubernetes mode) and, with the host firewall, the host devices'.
func (e Engine) hostIPs(router netip.Addr) []netip.Addr {
	ips := []netip.Addr{router}
	if e.router6.IsValid() {
		ips = append(ips, e.router6, podaddr.RouterLinkLocal)
	}
	for _, a := range append([]netip.Addr{e.nodeAddr}, e.hostAddrs...) {
		if a.IsValid() && !slices.Contains(ips, a) {
			ips = append(ips, a)
		}
	}
	return ips
}

// hostStatus is host policy's part of status; a.mu must be held.
func (a *Agent) hostStatus() *api.HostStatus {
	h := a.hostDevs
	if h == nil {
		return nil
	}
	pol := a.cur.state.Endpoints[mapstate.HostEndpointID]
	st := &api.HostStatus{Devices: h.devices, Labels: a.model.nodeLabels, EnforceIngress: pol.EnforceIngress, EnforceEgress: pol.EnforceEgress}
	for _, s := range h.safe {
		st.Safe = append(st.Safe, s.Addr.String())
	}
	return st
}

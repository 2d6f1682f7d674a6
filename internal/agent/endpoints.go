package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"sort"
	"strings"

	"github.com/rampartnet/rampart/internal/agent/taps"
	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/podaddr"
)

// EndpointTables attach the tc programs to endpoints and hold each endpoint's info and
// policy (also used by agent.go).
type EndpointTables interface {
	// Attach loads (or replaces in place) the tc programs on the host-side veth ifname in
	// the network namespace at netnsPath and returns its ifindex.
	Attach(netnsPath, ifname string) (uint32, error)
	// ReleaseLinks forgets the programs of interface ifindex once the interface is deleted
	// (deleting it removed them).
	ReleaseLinks(ifindex uint32) error
	ApplyEndpoint(ifindex uint32, info datapath.EndpointInfo, pol mapstate.EndpointPolicy) error
	RemoveEndpoint(ifindex, epID uint32) error
	// InstalledEndpoints returns the endpoints in the dataplane by ifindex, so a restarted
	// agent can remove the ones it no longer has (e.g. deleted while it crashed).
	InstalledEndpoints() map[uint32]datapath.InstalledEndpoint
	// Counters returns endpoint epID's counters; its host-side interface ifindex in the
	// node namespace netnsPath counts its forwarded packets.
	Counters(netnsPath string, ifindex, epID uint32) (datapath.Counters, error)
}

// AddEndpoint creates an endpoint: namespace, veth, address, programs, identity, policy.
func (a *Agent) AddEndpoint(ctx context.Context, spec api.EndpointSpec) (api.Endpoint, error) {
	if err := validateNamespace(spec.Namespace); err != nil {
		return api.Endpoint{}, err
	}
	if err := validateName(spec.Name); err != nil {
		return api.Endpoint{}, err
	}
	lbls, err := validateLabels(spec.Labels)
	if err != nil {
		return api.Endpoint{}, err
	}
	ports, err := validatePorts(spec.Ports)
	if err != nil {
		return api.Endpoint{}, err
	}
	if spec.ServiceAccount != "" && (len(spec.ServiceAccount) > 253 || !dnsSubdomainRE.MatchString(spec.ServiceAccount)) {
		return api.Endpoint{}, api.BadRequest("service account %q: want a DNS subdomain", spec.ServiceAccount)
	}

	a.mu.Lock()
	defer a.mu.Unlock()
	rec := &EndpointRecord{
		Namespace:      spec.Namespace,
		Name:           spec.Name,
		Labels:         lbls,
		Ports:          ports,
		ServiceAccount: spec.ServiceAccount,
		Monitor:        spec.Monitor,
		Audit:          spec.Audit,
	}
	rec, _, err = a.addRecord(rec, spec.IP)
	if err != nil {
		return api.Endpoint{}, err
	}
	return a.endpointView(rec, false), nil
}

// addRecord adds the endpoint rec describes (its address and endpoint id chosen here; an
// address wantIP if not ""): in a namespace of its own, or with rec.CNI in the runtime's.
// It returns the record as committed. a.mu must be held.
func (a *Agent) addRecord(spec *EndpointRecord, wantIP string) (*EndpointRecord, endpoint.Endpoint, error) {
	key := spec.Key()
	if _, ok := a.model.endpoints[key]; ok {
		return nil, endpoint.Endpoint{}, api.Conflict("endpoint %s already exists", key)
	}
	m := a.model.clone()
	ip, err := a.chooseIP(m, wantIP)
	if err != nil {
		return nil, endpoint.Endpoint{}, err
	}
	epID, err := m.allocEpID()
	if err != nil {
		return nil, endpoint.Endpoint{}, api.Conflict("%v", err)
	}
	r := *spec
	rec := &r
	rec.IP, rec.EpID = ip, epID
	if rec.IP6, _, err = podaddr.Addrs(a.cfg.PodCIDR, a.cfg.PodCIDR6, ip); err != nil {
		return nil, endpoint.Endpoint{}, err
	}
	m.ensureNamespace(rec.Namespace)
	m.endpoints[key] = rec
	alloc, err := cloneAllocator(a.cur.alloc)
	if err != nil {
		return nil, endpoint.Endpoint{}, err
	}
	d, err := a.eng.compute(m, alloc, a.net.Router(), a.cur)
	if err != nil {
		return nil, endpoint.Endpoint{}, err
	}

	// Kernel side. The programs drop everything until the endpoint's info is in the map,
	// so the endpoint is never reachable without policy.
	// Leftovers under this endpoint's names can only be this instance's, from an add or
	// delete cut short by a crash: clear them so the add does not fail on them.
	if err := a.deleteLinks(rec); err != nil {
		return nil, endpoint.Endpoint{}, fmt.Errorf("clearing leftovers of endpoint %s: %w", key, err)
	}
	// The programs go on the veth before it can carry a packet, and drop everything
	// until the endpoint's info is in the map (applyState below).
	var ifindex uint32
	ep, err := a.create(rec, func(hostIf string) error {
		var aerr error
		ifindex, aerr = a.dp.Attach(a.net.NetnsPath(), hostIf)
		return aerr
	})
	if err != nil {
		if ifindex != 0 {
			a.releaseLinks(key, ifindex)
		}
		return nil, endpoint.Endpoint{}, fmt.Errorf("creating endpoint %s: %w", key, err)
	}
	rec.HostInterface = ep.HostIfName
	undo := func() {
		delete(a.ifindex, epID)
		if err := a.deleteNetwork(rec, ifindex); err != nil {
			a.log.Warn("deleting after failed add", "endpoint", key, "error", err)
		}
	}
	a.ifindex[epID] = ifindex
	if err := a.applyState(a.cur, d, m, false); err != nil {
		a.dp.RemoveEndpoint(ifindex, epID)
		undo()
		return nil, endpoint.Endpoint{}, err
	}
	if err := a.commit(m, d); err != nil {
		a.dp.RemoveEndpoint(ifindex, epID)
		undo()
		return nil, endpoint.Endpoint{}, err
	}
	a.log.Info("endpoint added", "endpoint", key, "ip", ip, "ip6", rec.IP6, "identity", d.identities[key], "interface", ep.HostIfName)
	return rec, ep, nil
}

// create makes an endpoint's network: its own namespace, or its veth in the runtime's.
func (a *Agent) create(rec *EndpointRecord, attach func(hostIf string) error) (endpoint.Endpoint, error) {
	var ep endpoint.Endpoint
	var err error
	if rec.CNI != nil {
		ep, err = a.net.CreateIn(rec.Namespace, rec.Name, rec.IP, rec.CNI.attachment(), attach)
	} else {
		ep, err = a.net.CreateAttached(rec.Namespace, rec.Name, rec.IP, attach)
	}
	if err != nil || !rec.Monitor {
		return ep, err
	}
	return ep, a.monitorLinks(rec, ep)
}

// monitorLinks gives monitor endpoint rec its receive and return interfaces, registered
// with the dataplane before they can carry a packet (existing ones are kept, as after a
// restart).
func (a *Agent) monitorLinks(rec *EndpointRecord, ep endpoint.Endpoint) error {
	if a.dp.Monitors == nil {
		return taps.ErrNoTaps
	}
	_, err := a.net.CreateMonitorLinks(ep, func(rx, tx string) error {
		return a.dp.Monitors.AttachMonitor(a.net.NetnsPath(), rx, tx, rec.EpID, rec.IP)
	})
	if err != nil {
		return fmt.Errorf("monitor interfaces of endpoint %s: %w", rec.Key(), err)
	}
	return nil
}

// deleteLinks deletes an endpoint's veth and, unless the namespace is a runtime's (CNI),
// its namespace. Missing parts are no error.
func (a *Agent) deleteLinks(rec *EndpointRecord) error {
	if rec.Monitor {
		if a.dp.Monitors != nil {
			if err := a.dp.Monitors.DetachMonitor(rec.EpID); err != nil {
				a.log.Warn("detaching a monitor's interfaces", "endpoint", rec.Key(), "error", err)
			}
		}
		if err := a.net.DeleteMonitorLinks(rec.Namespace, rec.Name); err != nil {
			return err
		}
	}
	if rec.CNI != nil {
		return a.net.DeleteLink(rec.Namespace, rec.Name)
	}
	return a.net.Delete(rec.Namespace, rec.Name)
}

// deleteNetwork deletes an endpoint's veth and namespace (only the veth in a runtime's
// namespace), and then the pins of the links of
// its programs on interface ifindex (0: unknown). If the veth could not be deleted its
// programs stay attached, dropping everything.
func (a *Agent) deleteNetwork(rec *EndpointRecord, ifindex uint32) error {
	if err := a.deleteLinks(rec); err != nil {
		return err
	}
	if ifindex != 0 {
		a.releaseLinks(rec.Key(), ifindex)
	}
	return nil
}

// releaseLinks forgets the programs of a deleted interface; a pin left behind holds a
// detached link only, which a later attach to the same index replaces.
func (a *Agent) releaseLinks(key string, ifindex uint32) {
	if err := a.dp.ReleaseLinks(ifindex); err != nil {
		a.log.Warn("releasing the links of a deleted endpoint", "endpoint", key, "error", err)
	}
}

// chooseIP validates a requested address or picks the lowest free one of the pod range;
// a quarantined address (quarantine.go) is not free.
func (a *Agent) chooseIP(m *model, want string) (netip.Addr, error) {
	used := make(map[netip.Addr]string, len(m.endpoints))
	for k, e := range m.endpoints {
		used[e.IP] = k
	}
	router := a.net.Router()
	cidr := a.cfg.PodCIDR
	last := podaddr.Last(cidr)
	if want != "" {
		ip, err := netip.ParseAddr(want)
		if err != nil {
			return netip.Addr{}, api.BadRequest("address %q: %v", want, err)
		}
		if !cidr.Contains(ip) || ip == cidr.Addr() || ip == router || ip == last {
			return netip.Addr{}, api.BadRequest("address %v: not a usable address of the pod range %v (router %v)", ip, cidr, router)
		}
		if k, ok := used[ip]; ok {
			return netip.Addr{}, api.Conflict("address %v is used by endpoint %s", ip, k)
		}
		if q, ok := m.quarantine[ip]; ok {
			return netip.Addr{}, api.Conflict("address %v was pod %s's and is not reused until every node has dropped it", ip, q.Pod)
		}
		return ip, nil
	}
	for ip := router.Next(); ip.IsValid() && ip != last && cidr.Contains(ip); ip = ip.Next() {
		if _, ok := used[ip]; ok {
			continue
		}
		if _, ok := m.quarantine[ip]; !ok {
			return ip, nil
		}
	}
	if len(m.quarantine) > 0 {
		return netip.Addr{}, a.quarantineExhausted(cidr)
	}
	return netip.Addr{}, api.Conflict("no free address left in %v", cidr)
}

// DeleteEndpoint removes an endpoint and everything the agent created for it.
func (a *Agent) DeleteEndpoint(ctx context.Context, namespace, name string) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	key := namespace + "/" + name
	rec, ok := a.model.endpoints[key]
	if !ok {
		return api.NotFound("endpoint %s not found", key)
	}
	return a.deleteRecord(rec)
}

// deleteRecord deletes an endpoint of the model; a.mu must be held.
func (a *Agent) deleteRecord(rec *EndpointRecord) error {
	key := rec.Key()
	m := a.model.clone()
	delete(m.endpoints, key)
	a.quarantine(m, rec)
	alloc, err := cloneAllocator(a.cur.alloc)
	if err != nil {
		return err
	}
	d, err := a.eng.compute(m, alloc, a.net.Router(), a.cur)
	if err != nil {
		return err
	}
	// The endpoint goes first (its policy entries, programs, veth and namespace), then
	// the others are updated and its address leaves the ipcache.
	var errs []error
	ifindex, attached := a.ifindex[rec.EpID]
	if attached {
		if err := a.dp.RemoveEndpoint(ifindex, rec.EpID); err != nil {
			errs = append(errs, err)
		}
		delete(a.ifindex, rec.EpID)
	}
	// Deleting the veth removes the programs on it (the endpoint already drops
	// everything: its info is gone).
	if err := a.deleteNetwork(rec, ifindex); err != nil {
		errs = append(errs, err)
	}
	if err := a.applyState(a.cur, d, m, false); err != nil {
		errs = append(errs, err)
	}
	// The endpoint is gone from the kernel whatever happened: record that.
	if err := a.commit(m, d); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("deleting endpoint %s: %w", key, errors.Join(errs...))
	}
	a.log.Info("endpoint deleted", "endpoint", key)
	return nil
}

// LabelEndpoint changes an endpoint's labels (its identity, and with it policy, follows).
func (a *Agent) LabelEndpoint(ctx context.Context, namespace, name string, change api.LabelChange) (api.Endpoint, error) {
	set, err := validateLabels(change.Set)
	if err != nil {
		return api.Endpoint{}, err
	}
	return a.changeEndpoint(namespace+"/"+name, func(c *EndpointRecord) error {
		if c.Identity != 0 && a.cfg.Kubernetes != nil {
			// The cluster's number belongs to the labels the Kubernetes API gave.
			return a.errManaged("the labels of pod " + c.Key())
		}
		c.Labels = applyLabelChange(c.Labels, set, change.Remove)
		c.Identity = 0 // a number pinned for other labels (an earlier Kubernetes mode) is not theirs
		return nil
	})
}

// AuditEndpoint puts an endpoint in audit mode (its policies reported, not enforced) or
// takes it out. A pod's mode is its annotation's in Kubernetes mode.
func (a *Agent) AuditEndpoint(ctx context.Context, namespace, name string, mode api.AuditMode) (api.Endpoint, error) {
	return a.changeEndpoint(namespace+"/"+name, func(c *EndpointRecord) error {
		if c.CNI != nil && a.cfg.Kubernetes != nil {
			return a.errManaged("the audit mode of pod " + c.Key() + " (annotation " + AuditAnnotation + ")")
		}
		c.Audit = mode.Audit
		return nil
	})
}

// changeEndpoint applies edit to a copy of endpoint key's record and commits the change.
func (a *Agent) changeEndpoint(key string, edit func(*EndpointRecord) error) (api.Endpoint, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var nrec *EndpointRecord
	_, _, err := a.change(func(m *model) error {
		rec, ok := m.endpoints[key]
		if !ok {
			return api.NotFound("endpoint %s not found", key)
		}
		c := *rec
		if err := edit(&c); err != nil {
			return err
		}
		nrec = &c
		m.endpoints[key] = nrec
		return nil
	})
	if err != nil {
		return api.Endpoint{}, err
	}
	return a.endpointView(nrec, false), nil
}

func applyLabelChange(old labels.Labels, set labels.Labels, remove []string) labels.Labels {
	l := maps.Clone(old)
	if l == nil {
		l = labels.Labels{}
	}
	for _, k := range remove {
		delete(l, labels.NormalizeKey(k))
	}
	maps.Copy(l, set)
	return l
}

// ListEndpoints lists endpoints sorted by namespace/name.
func (a *Agent) ListEndpoints(ctx context.Context) ([]api.Endpoint, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := []api.Endpoint{}
	for _, key := range sortedKeys(a.model.endpoints) {
		out = append(out, a.endpointView(a.model.endpoints[key], false))
	}
	return out, nil
}

// GetEndpoint returns one endpoint with its counters.
func (a *Agent) GetEndpoint(ctx context.Context, namespace, name string) (api.Endpoint, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	rec, ok := a.model.endpoints[namespace+"/"+name]
	if !ok {
		return api.Endpoint{}, api.NotFound("endpoint %s/%s not found", namespace, name)
	}
	return a.endpointView(rec, true), nil
}

// endpointView renders a record; a.mu must be held.
func (a *Agent) endpointView(rec *EndpointRecord, counters bool) api.Endpoint {
	key := rec.Key()
	id := a.cur.identities[key]
	pol := a.cur.state.Endpoints[rec.EpID]
	ep := api.Endpoint{
		Namespace:      rec.Namespace,
		Name:           rec.Name,
		Labels:         map[string]string(maps.Clone(rec.Labels)),
		IP:             rec.IP.String(),
		IP6:            addrOrEmpty(rec.IP6),
		ServiceAccount: rec.ServiceAccount,
		EpID:           rec.EpID,
		Identity:       id,
		HostInterface:  rec.HostInterface,
		Monitor:        rec.Monitor,
		Audit:          rec.Audit,
		Netns:          endpointNetnsPath(a.net, rec),
		EnforceIngress: pol.EnforceIngress,
		EnforceEgress:  pol.EnforceEgress,
	}
	if ep.Labels == nil {
		ep.Labels = map[string]string{}
	}
	if rec.CNI != nil {
		ep.CNI = &api.CNIAttachment{ContainerID: rec.CNI.ContainerID, IfName: rec.CNI.IfName}
	}
	ep.Ports = apiPorts(rec.Ports)
	if l, ok := a.cur.alloc.Labels(id); ok {
		ep.IdentityLabels = labelList(l)
	}
	if ifindex, ok := a.ifindex[rec.EpID]; counters && ok {
		if c, err := a.dp.Counters(a.net.NetnsPath(), ifindex, rec.EpID); err == nil {
			ac := api.Counters(c)
			ep.Counters = &ac
		} else {
			a.log.Warn("reading counters", "endpoint", key, "error", err)
		}
	}
	return ep
}

// addrOrEmpty renders a, or "" when it is zero.
func addrOrEmpty(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

// endpointNetnsPath is the path of an endpoint's network namespace: its own, or the
// runtime's.
func endpointNetnsPath(net Network, rec *EndpointRecord) string {
	if rec.CNI != nil {
		return rec.CNI.Netns
	}
	return endpoint.NetnsPath(net.EndpointNetns(rec.Namespace, rec.Name))
}

// labelList renders labels as sorted k=v strings (a bare key for reserved labels).
func labelList(l labels.Labels) []string {
	out := make([]string, 0, len(l))
	for k, v := range l {
		if v == "" && strings.HasPrefix(k, "reserved:") {
			out = append(out, k)
		} else {
			out = append(out, k+"="+v)
		}
	}
	sort.Strings(out)
	return out
}

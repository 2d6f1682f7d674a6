package datapath

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/policy"
)

// Endpoints is the endpoints' side of the dataplane: the programs on each endpoint's
// veth (attach.go), its info and policy in the maps (endpoint.go, ipv6.go) and its
// counters (counters.go).
type Endpoints struct{ *handle }

// EndpointInfo is what the dataplane knows of an endpoint besides its policy.
type EndpointInfo struct {
	EpID     uint32            // 1 .. MaxEndpoints()-1, unique per agent
	Identity identity.Identity // the endpoint's security identity
	// Addr is the endpoint's IPv4 address: the only source address its packets and ARP
	// frames may carry (anything else is dropped, ReasonSpoofedSource). Required.
	Addr netip.Addr
	// Addr6 is the endpoint's IPv6 address, and LinkLocal6 the link-local address of its
	// interface: the only IPv6 sources its packets may carry, and the only targets its
	// neighbour advertisements may claim. Without Addr6 every IPv6 packet to or from the
	// endpoint is dropped (ReasonUnsupportedL3). Both or neither.
	Addr6, LinkLocal6 netip.Addr
	// Host marks the node's own endpoint (mapstate.HostEndpointID) on a host device
	// (AttachHost): its packets' addresses are the host's, which host_traffic checks.
	Host bool
	// Monitor marks a monitor endpoint (flow taps): no new flow may enter it except from
	// the node itself (flow.ReasonTapMonitorDestination).
	Monitor bool
}

// InstalledEndpoint is an endpoint as found in the endpoints map.
type InstalledEndpoint struct {
	EndpointInfo
	EnforceIngress bool
	EnforceEgress  bool
}

// Steps of ApplyEndpoint, in order (see docs/architecture.md, "Applying changes without a
// window"). Exposed to tests through handle.steps.
const (
	stepTightenFlags = "tighten-flags"
	stepWriteDenies  = "write-denies"
	stepDeleteAllows = "delete-allows"
	stepWriteAllows  = "write-allows"
	stepDeleteDenies = "delete-denies"
	stepFinalFlags   = "final-flags"
)

// MaxEndpoints is the size of the endpoint maps; endpoint IDs must be below it.
func (d *Endpoints) MaxEndpoints() uint32 { return d.objs.EndpointCounters.MaxEntries() }

// InstalledEndpoints returns the endpoints map by ifindex, as last written (or read back on
// Open), so a restarted agent can remove endpoints that no longer exist.
func (d *Endpoints) InstalledEndpoints() map[uint32]InstalledEndpoint {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[uint32]InstalledEndpoint, len(d.endpoints))
	for ifindex, info := range d.endpoints {
		addr6, ll6 := d.addrs6Of(info.EpId)
		out[ifindex] = InstalledEndpoint{
			EndpointInfo: EndpointInfo{EpID: info.EpId, Identity: info.Identity, Addr: infoAddr(info),
				Addr6: addr6, LinkLocal6: ll6, Monitor: info.Flags&epMonitor != 0, Host: info.Flags&epHost != 0},
			EnforceIngress: info.Flags&enforceIngress != 0,
			EnforceEgress:  info.Flags&enforceEgress != 0,
		}
	}
	return out
}

// InstalledPolicy returns the policy entries in the map for endpoint epID.
func (d *Endpoints) InstalledPolicy(epID uint32) map[mapstate.Key]mapstate.Value {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[mapstate.Key]mapstate.Value, len(d.policies[epID]))
	for k, v := range d.policies[epID] {
		_, key, ok := mapstateKey(k)
		if !ok || k.EpId&auditEpFlag != 0 {
			continue
		}
		out[key] = mapstateValue(v)
	}
	return out
}

// ApplyEndpoint makes the dataplane state of the endpoint on ifindex (the host-side veth in
// the node namespace) equal to desired. Entries are changed in the order of
// docs/architecture.md so that, at every moment, a packet passes only if the old or the new
// policy lets it: enforcement flags are first widened to old|new, then new deny entries are
// written, stale allow entries deleted, new allow entries written, stale deny entries
// deleted, and finally the flags set to the new ones. A new endpoint gets its endpoint_info
// (and so any traffic at all) only at the end.
//
// Redirect entries (mapstate.Value.Redirect: allowed only through the L7 proxy) are
// written and deleted with the allow entries: they admit traffic, though only checked.
// Changing an entry between allow and redirect is a single overwrite.
//
// When the entries or the flags changed (or the endpoint is new on ifindex), the final
// endpoint_info carries the next policy revision. Conntrack entries record the revision
// their flow was last checked against, so the dataplane checks each established flow of
// the endpoint against the new policy on its next packet (bpf/README.md, "Policy changes
// and established flows"): a deny or an L7 rule that the flow does not pass through the
// proxy ends it; a plain allow removed stops only new flows. Bumping the revision only
// after all entries are written means a flow created or checked meanwhile is checked
// again against the complete policy.
//
// On error (map full, write failure) it stops where it is and returns the error: the
// endpoint is then at most as permissive as the old or the new policy, never more; calling
// it again with the same arguments resumes.
func (d *Endpoints) ApplyEndpoint(ifindex uint32, ep EndpointInfo, desired mapstate.EndpointPolicy) error {
	d.mu.Lock()
	defer d.mu.Unlock()

	if ep.EpID == 0 || ep.EpID >= d.MaxEndpoints() {
		return fmt.Errorf("applying endpoint %d: endpoint ID out of range 1..%d", ep.EpID, d.MaxEndpoints()-1)
	}
	addr, err := endpointAddr(ep.Addr)
	if err != nil {
		return fmt.Errorf("applying endpoint %d: %w", ep.EpID, err)
	}
	addr6, has6, err := endpoint6Of(ep)
	if err != nil {
		return fmt.Errorf("applying endpoint %d: %w", ep.EpID, err)
	}
	want, newFlags, err := wantedEntries(ep, desired)
	if err != nil {
		return err
	}

	// Its IPv6 addresses first: until they are there its IPv6 drops (fail closed).
	if err := d.putEndpoint6(ep.EpID, addr6, has6); err != nil {
		return fmt.Errorf("applying endpoint %d: %w", ep.EpID, err)
	}

	// Step 0: make the endpoint at least as strict as both policies while entries change.
	old, known := d.endpoints[ifindex]
	if known && old.EpId == ep.EpID {
		// The tap bits are ReplaceTaps's: kept as they are.
		newFlags |= old.Flags & epTapMask
	}
	switch {
	case known && old.EpId == ep.EpID:
		if tightened := old.Flags | newFlags; tightened != old.Flags {
			info := old
			info.Flags = tightened
			if err := d.putEndpoint(ifindex, info); err != nil {
				return fmt.Errorf("applying endpoint %d: %w", ep.EpID, err)
			}
		}
	case known:
		// The ifindex belonged to another endpoint (stale): drop its traffic until the
		// new endpoint's policy is complete.
		if err := d.deleteEndpoint(ifindex); err != nil {
			return fmt.Errorf("applying endpoint %d: %w", ep.EpID, err)
		}
	}
	d.step(stepTightenFlags)

	have := d.policies[ep.EpID]
	if have == nil {
		have = make(map[rampartPolicyKey]rampartPolicyValue)
		d.policies[ep.EpID] = have
	}
	w := &policyWrite{d: d, epID: ep.EpID, pm: d.writer(d.objs.Policy), have: have, want: want}
	if err := w.run(); err != nil {
		return err
	}
	if len(have) == 0 {
		delete(d.policies, ep.EpID)
	}
	d.step(stepDeleteDenies)
	changed := w.changed

	// Step 5: the final endpoint_info; for a new endpoint this is what lets traffic in.
	// The revision stays the endpoint's highest one on any interface (its conntrack
	// entries are keyed by ep_id, not by interface) unless something changed; then it is
	// the next of one counter for all endpoints, so that no revision is handed out twice
	// (the flow cache relies on that, bpf/include/flowcache.h).
	rev := uint32(0)
	for _, oi := range d.endpoints {
		if oi.EpId == ep.EpID && oi.Revision > rev {
			rev = oi.Revision
		}
	}
	if changed || !known || old.EpId != ep.EpID || old.Flags != newFlags || old.Identity != uint32(ep.Identity) || old.Addr != addr || rev == 0 {
		rev = d.nextRevision()
	}
	info := rampartEndpointInfo{EpId: ep.EpID, Identity: ep.Identity, Flags: newFlags, Revision: rev, Addr: addr}
	if err := d.putEndpoint(ifindex, info); err != nil {
		return fmt.Errorf("applying endpoint %d: %w", ep.EpID, err)
	}
	// The same endpoint on another ifindex (its veth was recreated) is stale.
	for other, oi := range d.endpoints {
		if other != ifindex && oi.EpId == ep.EpID {
			if err := d.deleteEndpoint(other); err != nil {
				return fmt.Errorf("applying endpoint %d: %w", ep.EpID, err)
			}
		}
	}
	// Newly installed on an interface this process attached to: its forwarded packets
	// count from here (Counters). Interfaces attached by an earlier run keep their base.
	if netns, ok := d.netns[ifindex]; ok && (!known || old.EpId != ep.EpID) {
		if err := d.recordBase(netns, ifindex); err != nil {
			return fmt.Errorf("applying endpoint %d: %w", ep.EpID, err)
		}
	}
	d.step(stepFinalFlags)
	return nil
}

// wantedEntries are the policy map entries and the endpoint_info flags of desired for ep
// (the tap bits, ReplaceTaps's, not included).
func wantedEntries(ep EndpointInfo, desired mapstate.EndpointPolicy) (map[rampartPolicyKey]rampartPolicyValue, uint32, error) {
	want := make(map[rampartPolicyKey]rampartPolicyValue, len(desired.Entries))
	var newFlags uint32
	for k, v := range desired.Entries {
		switch {
		case k.Admin && k.Direction == policy.Ingress:
			newFlags |= epAdminIngress
		case k.Admin && k.Direction == policy.Egress:
			newFlags |= epAdminEgress
		}
		pk, err := policyKey(ep.EpID, k)
		if err != nil {
			return nil, 0, fmt.Errorf("applying endpoint %d: %w", ep.EpID, err)
		}
		want[pk] = policyValue(v)
	}
	if a := desired.Audit; a != nil {
		// The policy with the audited rules too, looked up for new flows the policy
		// above lets through, under the endpoint's id with the audit flag.
		newFlags |= epAuditIngress | epAuditEgress
		if a.EnforceIngress {
			newFlags |= epAuditEnforceIngress
		}
		if a.EnforceEgress {
			newFlags |= epAuditEnforceEgress
		}
		for k, v := range a.Entries {
			pk, err := policyKey(ep.EpID|auditEpFlag, k)
			if err != nil {
				return nil, 0, fmt.Errorf("applying endpoint %d: audit entries: %w", ep.EpID, err)
			}
			want[pk] = policyValue(v)
		}
	}
	if desired.DNSObserve {
		newFlags |= epDNSObserve
	}
	if desired.EnforceIngress {
		newFlags |= enforceIngress
	}
	if desired.EnforceEgress {
		newFlags |= enforceEgress
	}
	if ep.Monitor {
		newFlags |= epMonitor
	}
	if ep.Host {
		newFlags |= epHost
	}

	return want, newFlags, nil
}

// policyWrite moves an endpoint's entries in the policy map from have (what the map holds,
// kept up to date as the kernel completes each write) to want, in the order that keeps
// the endpoint at most as permissive as either: new denies, stale allows out, new allows,
// stale denies out. Each step is one batch (batch.go): on failure exactly a prefix of it
// is done, which have records before the error is returned, so a retry writes the rest.
type policyWrite struct {
	d          *Endpoints
	epID       uint32
	pm         batchWriter
	have, want map[rampartPolicyKey]rampartPolicyValue
	// changed: something was written or deleted (also a write that failed half-way in an
	// earlier call: have then differs from want).
	changed bool
	keys    []rampartPolicyKey
	vals    []rampartPolicyValue
}

func (w *policyWrite) run() error {
	// Step 1: new and changed deny entries.
	if err := w.put("deny", w.writes(true)); err != nil {
		return err
	}
	w.d.step(stepWriteDenies)
	// Step 2: allow and redirect entries no longer wanted (changed ones were overwritten
	// by step 1 if they became denies, or are rewritten by step 3).
	if err := w.del("allow", w.stale(false)); err != nil {
		return err
	}
	w.d.step(stepDeleteAllows)
	// Step 3: new and changed allow and redirect entries.
	if err := w.put("allow", w.writes(false)); err != nil {
		return err
	}
	w.d.step(stepWriteAllows)
	// Step 4: deny entries no longer wanted.
	return w.del("deny", w.stale(true))
}

func (w *policyWrite) put(kind string, kv batch) error {
	keys, vals := kv.keys, kv.vals
	if len(keys) == 0 {
		return nil
	}
	w.changed = true
	n, err := batchPut(w.pm, keys, vals)
	for i := range n {
		w.have[keys[i]] = vals[i]
	}
	if err != nil {
		return fmt.Errorf("applying endpoint %d: writing %s entry %s: %w", w.epID, kind, keyString(keys[min(n, len(keys)-1)]), err)
	}
	return nil
}

func (w *policyWrite) del(kind string, keys []rampartPolicyKey) error {
	if len(keys) == 0 {
		return nil
	}
	w.changed = true
	n, err := batchDelete(w.pm, keys)
	for _, k := range keys[:n] {
		delete(w.have, k)
	}
	if err != nil {
		return fmt.Errorf("applying endpoint %d: deleting %s entry %s: %w", w.epID, kind, keyString(keys[min(n, len(keys)-1)]), err)
	}
	return nil
}

// writes collects the entries of want that have lacks or holds otherwise, denies or the
// others.
func (w *policyWrite) writes(denies bool) batch {
	w.keys, w.vals = w.keys[:0], w.vals[:0]
	for k, v := range w.want {
		if (v.Action == policyDeny) == denies && w.have[k] != v {
			w.keys = append(w.keys, k)
			w.vals = append(w.vals, v)
		}
	}
	return batch{w.keys, w.vals}
}

// stale collects the entries of have that want lacks, denies or the others.
func (w *policyWrite) stale(denies bool) []rampartPolicyKey {
	w.keys = w.keys[:0]
	for k, v := range w.have {
		if _, ok := w.want[k]; !ok && (v.Action == policyDeny) == denies {
			w.keys = append(w.keys, k)
		}
	}
	return w.keys
}

// endpointAddr is an endpoint's address as endpoint_info.addr holds it (network order in
// memory). Only an IPv4 address will do: the programs drop every packet whose source is
// not it, so an endpoint without one could send nothing, and IPv6 is not enforced yet.
func endpointAddr(a netip.Addr) (uint32, error) {
	a = a.Unmap()
	if !a.Is4() || a.IsUnspecified() {
		return 0, fmt.Errorf("endpoint address %v: want the endpoint's IPv4 address", a)
	}
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:]), nil
}

// infoAddr is the address in an endpoint_info (invalid when it has none).
func infoAddr(info rampartEndpointInfo) netip.Addr {
	if info.Addr == 0 {
		return netip.Addr{}
	}
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], info.Addr)
	return netip.AddrFrom4(b)
}

// RemoveEndpoint removes the endpoint: first its endpoint_info on ifindex and on any other
// interface it was installed on (from then on its interfaces drop everything, fail closed),
// then its policy entries, counters, conntrack and fragment entries and tap rules (so a
// later endpoint reusing the ID starts clean). Pass ifindex 0 to clean up an endpoint ID whose interface is
// unknown.
func (d *Endpoints) RemoveEndpoint(ifindex, epID uint32) error {
	d.mu.Lock()
	defer d.mu.Unlock()

	var errs []error
	for idx, info := range d.endpoints {
		if info.EpId == epID && idx != ifindex {
			if err := d.deleteEndpoint(idx); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if ifindex != 0 {
		// Also when not tracked: the map is what the programs see.
		if err := d.deleteEndpoint(ifindex); err != nil {
			errs = append(errs, err)
		}
	}
	if err := d.syncByID(epID); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		// With an endpoint_info left, its entries still protect it: do not remove them.
		return fmt.Errorf("removing endpoint %d: %w", epID, errors.Join(errs...))
	}

	have := d.policies[epID]
	for k := range have {
		if err := d.objs.Policy.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("deleting policy entry %s: %w", keyString(k), err))
			continue
		}
		delete(have, k)
	}
	if len(have) == 0 {
		delete(d.policies, epID)
	}
	if epID < d.MaxEndpoints() {
		zero := make([]rampartEpCounters, ebpf.MustPossibleCPU())
		if err := d.objs.EndpointCounters.Update(&epID, zero, ebpf.UpdateAny); err != nil {
			errs = append(errs, fmt.Errorf("resetting counters: %w", err))
		}
	}
	if ifindex != 0 {
		if err := d.objs.IfaceBase.Delete(&ifindex); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("deleting interface statistics base: %w", err))
		}
		delete(d.netns, ifindex)
	}
	if err := purgeByEndpoint[rampartCt4Key, rampartCtValue](d.objs.Conntrack4Peer, epID, func(k *rampartCt4Key) uint32 { return k.EpId }); err != nil {
		errs = append(errs, fmt.Errorf("purging conntrack: %w", err))
	}
	if err := purgeByEndpoint[rampartCt6Key, rampartCtValue](d.objs.Conntrack6, epID, func(k *rampartCt6Key) uint32 { return k.EpId }); err != nil {
		errs = append(errs, fmt.Errorf("purging IPv6 conntrack: %w", err))
	}
	if err := d.deleteEndpoint6(epID); err != nil {
		errs = append(errs, err)
	}
	if err := purgeByEndpoint[rampartFragKey, rampartFragValue](d.objs.FragsPeer, epID, func(k *rampartFragKey) uint32 { return k.EpId }); err != nil {
		errs = append(errs, fmt.Errorf("purging fragments: %w", err))
	}
	if err := purgeByEndpoint[rampartFragKey, rampartTapFragValue](d.objs.TapFrags, epID, func(k *rampartFragKey) uint32 { return k.EpId }); err != nil {
		errs = append(errs, fmt.Errorf("purging fragment taps: %w", err))
	}
	// Its tap rules: an endpoint reusing the ID must not find them (ReplaceTaps gives it
	// its own).
	for _, m := range []*ebpf.Map{d.objs.TapSets, d.objs.TapSets6} {
		if err := m.Delete(&epID); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			errs = append(errs, fmt.Errorf("deleting tap rules: %w", err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("removing endpoint %d: %w", epID, errors.Join(errs...))
	}
	return nil
}

// purgeBatch is how many entries purgeByEndpoint reads per system call.
const purgeBatch = 4096

// purgeByEndpoint deletes every entry of m whose key belongs to epID. It reads the map in
// batches: the conntrack map holds up to 65,536 entries, and reading them one by one costs
// two system calls each, on every endpoint delete. Where the kernel cannot batch (or a
// batch does not fit a hash bucket) it reads them one by one.
func purgeByEndpoint[K, V any](m *ebpf.Map, epID uint32, ep func(*K) uint32) error {
	keys, err := batchKeysOf[K, V](m, epID, ep)
	if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.ENOSPC) {
		keys, err = iterKeysOf[K, V](m, epID, ep)
	}
	if err != nil {
		return fmt.Errorf("listing %s: %w", m, err)
	}
	for i := range keys {
		if err := m.Delete(&keys[i]); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("deleting from %s: %w", m, err)
		}
	}
	return nil
}

// batchKeysOf returns the keys of m that belong to epID, read in batches.
func batchKeysOf[K, V any](m *ebpf.Map, epID uint32, ep func(*K) uint32) ([]K, error) {
	var (
		out    []K
		cursor ebpf.MapBatchCursor
		keys   = make([]K, purgeBatch)
		vals   = make([]V, purgeBatch)
	)
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := range n {
			if ep(&keys[i]) == epID {
				out = append(out, keys[i])
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return out, nil // the end
		}
		if err != nil {
			return nil, err
		}
	}
}

// iterKeysOf returns the keys of m that belong to epID, read one by one.
func iterKeysOf[K, V any](m *ebpf.Map, epID uint32, ep func(*K) uint32) ([]K, error) {
	return keysWhere[K, V](m, func(k *K) bool { return ep(k) == epID })
}

// keysWhere returns the keys of m for which want holds, read one by one.
func keysWhere[K, V any](m *ebpf.Map, want func(*K) bool) ([]K, error) {
	var (
		k   K
		v   V
		out []K
	)
	it := m.Iterate()
	for it.Next(&k, &v) {
		if want(&k) {
			out = append(out, k)
		}
	}
	return out, it.Err()
}

// batch is the policy map entries of one step of ApplyEndpoint.
type batch struct {
	keys []rampartPolicyKey
	vals []rampartPolicyValue
}

func keyString(k rampartPolicyKey) string {
	return fmt.Sprintf("{ep %d identity %d dir %d proto %d port %d/%d}",
		k.EpId, k.Identity, k.Direction, k.Protocol, ntohs(k.Dport), int(k.Prefixlen)-policyProtoLen)
}

// nextRevision hands out the next policy revision, never 0 (what the conntrack entries of
// an endpoint never checked hold). It starts above every revision in the pinned endpoints
// map, so a restarted agent does not hand out one in use either.
func (d *Endpoints) nextRevision() uint32 {
	d.revision++
	if d.revision == 0 {
		d.revision = 1
	}
	return d.revision
}

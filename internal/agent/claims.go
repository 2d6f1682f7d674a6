package agent

import (
	"fmt"
	"maps"
	"net/netip"
	"sort"

	"github.com/rampartnet/rampart/internal/identity"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/mapstate"
	"github.com/rampartnet/rampart/internal/overlay"
)

// unresolved says, for one computation, which local endpoints and remote pods have no
// identity this node can trust, and why. A local endpoint in it is denied everything (its
// policy cannot be computed); a remote pod in it is left out of the ipcache. The rest of
// the model is computed and applied as usual, so one such record never holds back the
// others.
type unresolved struct {
	endpoints map[string]string // endpoint key -> reason
	remotes   map[string]string // remote pod key -> reason
}

// identityClaim is one record's claim of a cluster identity for its full label set.
type identityClaim struct {
	remote bool
	key    string
	full   labels.Labels
	lkey   string // identity.LabelsKey(full)
	id     identity.Identity
}

func (c identityClaim) String() string {
	if c.remote {
		return "remote pod " + c.key
	}
	return "endpoint " + c.key
}

// claimIdentities gives alloc the cluster's numbers of m's records (local endpoints, whose
// derived labels are in derived, and remote pods): each record's number is the one the
// cluster allocator gave its full label set. What alloc held from earlier computations
// yields (identity.Allocator.Claim): an earlier model may have seen a pod with other
// namespace labels, and that must not keep the node from converging.
//
// Records of this model that disagree among themselves (one number for two label sets,
// or two numbers for one) cannot all be right. If one of them agrees with what alloc held
// (what this node applied before), it stays and the others are unresolved; otherwise all
// of them are. The answer is the same whatever order the records come in.
func claimIdentities(m *model, keys []string, derived map[*EndpointRecord]derivedEndpoint, alloc *identity.Allocator) unresolved {
	var claims []identityClaim
	for _, key := range keys {
		rec := m.endpoints[key]
		if rec.Identity == 0 {
			continue
		}
		de := derived[rec]
		claims = append(claims, identityClaim{key: key, full: de.full, lkey: de.key, id: rec.Identity})
	}
	for _, key := range sortedKeys(m.remotes) {
		r := m.remotes[key]
		if _, ok := m.nodes[r.Node]; !ok || r.Identity == 0 {
			continue
		}
		full := r.fullLabels(m.namespaces[r.Namespace])
		claims = append(claims, identityClaim{remote: true, key: key, full: full, lkey: identity.LabelsKey(full), id: r.Identity})
	}
	byID := map[identity.Identity][]int{}
	byLabels := map[string][]int{}
	for i, c := range claims {
		byID[c.id] = append(byID[c.id], i)
		byLabels[c.lkey] = append(byLabels[c.lkey], i)
	}
	bad := map[int]string{}
	// held says whether alloc already maps claim c's labels to its number.
	held := func(c identityClaim) bool {
		l, ok := alloc.Labels(c.id)
		return ok && identity.LabelsKey(l) == c.lkey
	}
	judge := func(group []int, differ func(a, b identityClaim) bool) {
		split := false
		for _, i := range group[1:] {
			split = split || differ(claims[group[0]], claims[i])
		}
		if !split {
			return
		}
		var keep []int
		for _, i := range group {
			if held(claims[i]) {
				keep = append(keep, i)
			}
		}
		for _, i := range group {
			if len(keep) > 0 && !differ(claims[keep[0]], claims[i]) {
				continue
			}
			other := claims[group[0]]
			for _, j := range group {
				if differ(claims[i], claims[j]) {
					other = claims[j]
					break
				}
			}
			c := claims[i]
			bad[i] = fmt.Sprintf("identity %d of labels %s disagrees with %s (identity %d, labels %s): the cluster's identities and this node's view of the pods and namespaces differ",
				c.id, c.full, other, other.id, other.full)
		}
	}
	for _, id := range sortedIDs(byID) {
		judge(byID[id], func(a, b identityClaim) bool { return a.lkey != b.lkey })
	}
	for _, lkey := range sortedKeys(byLabels) {
		judge(byLabels[lkey], func(a, b identityClaim) bool { return a.id != b.id })
	}
	u := unresolved{endpoints: map[string]string{}, remotes: map[string]string{}}
	for i, c := range claims {
		if why, ok := bad[i]; ok {
			if c.remote {
				u.remotes[c.key] = why
			} else {
				u.endpoints[c.key] = why
			}
			continue
		}
		if err := alloc.Claim(c.full, c.id); err != nil {
			if c.remote {
				u.remotes[c.key] = err.Error()
			} else {
				u.endpoints[c.key] = err.Error()
			}
		}
	}
	return u
}

func sortedIDs[V any](m map[identity.Identity]V) []identity.Identity {
	ids := make([]identity.Identity, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// denyUnresolved fails d closed for its unresolved records, after the computation: an
// endpoint whose identity cannot be trusted has no policy that could be computed, so it is
// enforced both ways with no entry; its addresses, and a left-out remote pod's (its IPv6
// one where mode carries IPv6 to its node), map to the reserved init identity (an endpoint
// whose identity is not known yet), which no selector and no CIDR rule admits, rather than
// to world. The maps are copied: the memo may hold the computed ones.
func denyUnresolved(m *model, d *desired, mode overlay.Mode) {
	if len(d.unresolved.endpoints)+len(d.unresolved.remotes) == 0 {
		return
	}
	d.state.Endpoints = maps.Clone(d.state.Endpoints)
	d.state.IPCache = maps.Clone(d.state.IPCache)
	if d.state.IPCache == nil {
		d.state.IPCache = map[netip.Prefix]mapstate.IPCacheEntry{}
	}
	for key := range d.unresolved.endpoints {
		rec := m.endpoints[key]
		d.state.Endpoints[rec.EpID] = mapstate.EndpointPolicy{EnforceIngress: true, EnforceEgress: true, Entries: map[mapstate.Key]mapstate.Value{}}
		for _, a := range []netip.Addr{rec.IP, rec.IP6} {
			if a.IsValid() {
				d.state.IPCache[netip.PrefixFrom(a, a.BitLen())] = mapstate.IPCacheEntry{Identity: identity.Init, EndpointID: rec.EpID}
			}
		}
	}
	for key := range d.unresolved.remotes {
		r := m.remotes[key]
		n, ok := m.nodes[r.Node]
		if !ok {
			continue
		}
		addrs := []netip.Addr{r.IP}
		if overlay.CarriesIPv6(mode, n.Address6) {
			addrs = append(addrs, remoteIP6(n, r.IP))
		}
		for _, a := range addrs {
			if a.IsValid() {
				d.state.IPCache[netip.PrefixFrom(a, a.BitLen())] = mapstate.IPCacheEntry{Identity: identity.Init, TunnelEndpoint: n.Address}
			}
		}
	}
}

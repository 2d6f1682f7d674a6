package agent

// Address quarantine (Kubernetes mode; docs/cluster.md, "Pod addresses"). Other nodes map
// a pod's address to its identity (ipcache) from their view of the API. A node whose agent
// is down or slow keeps mapping the address of a deleted pod to that pod's identity; an
// address handed to a new pod at once would carry the old pod's identity there, as
// source (native routing, IP-in-IP) and as destination (every mode). So the address of a
// deleted pod is quarantined: not handed out again until every other node has
// acknowledged a view of the pods in which no pod has it.
//
// Each agent, once a view is applied, may publish on its own Node object the pods
// resourceVersion the view reflected (PodsAckAnnotation); resourceVersions are
// comparable integers. An address is released once the API shows no pod of this node
// with it (at pods resourceVersion Since, or before) and every other Node object's
// acknowledgement is at least Since. A Node without an acknowledgement holds every
// address; a deleted Node no longer counts.

import (
	"net/http"
	"net/netip"
	"sort"
	"strings"

	"github.com/rampartnet/rampart/internal/api"
)

// Node annotations of the quarantine, written by each node's watcher on its own Node.
const (
	// PodsAckAnnotation is the pods resourceVersion the node's last applied view reflected.
	PodsAckAnnotation = "rampart.io/pods-acknowledged"
	// PodsWantAnnotation is the acknowledgement the node's quarantined addresses wait for
	// (absent: none waits); the others publish theirs when it is behind it.
	PodsWantAnnotation = "rampart.io/pods-wanted"
)

// QuarantineRecord is an address of a deleted pod, not handed out again yet.
type QuarantineRecord struct {
	IP  netip.Addr `json:"ip"`
	Pod string     `json:"pod"` // namespace/name of the pod that had it
	// Since is a pods resourceVersion at which the API showed no pod of this node with
	// the address ("" until a view has shown that).
	Since string `json:"since,omitempty"`
}

// quarantine adds the address of CNI endpoint rec, deleted from m, to m's quarantine (in
// Kubernetes mode: only there do other nodes map this node's pods' addresses).
func (a *Agent) quarantine(m *model, rec *EndpointRecord) {
	if a.k8s == nil || rec.CNI == nil {
		return
	}
	if m.quarantine == nil {
		m.quarantine = map[netip.Addr]*QuarantineRecord{}
	}
	m.quarantine[rec.IP] = &QuarantineRecord{IP: rec.IP, Pod: rec.Key()}
}

// syncQuarantine moves m's quarantined addresses on with view v: an address no pod of this
// node has in v gets its Since; one whose Since every other node has acknowledged is free.
// It returns the acknowledgement the remaining ones wait for ("" none).
func syncQuarantine(m *model, v ClusterView) string {
	if len(m.quarantine) == 0 {
		return ""
	}
	q := make(map[netip.Addr]*QuarantineRecord, len(m.quarantine))
	want := ""
	for ip, r := range m.quarantine {
		if r.Since == "" {
			if _, used := v.LocalAddresses[ip]; !used && v.PodsRVListed != "" {
				c := *r
				c.Since = v.PodsRVListed
				r = &c
			}
		}
		if r.Since != "" && len(waitingFor(r, v.Acks)) == 0 {
			continue // released
		}
		q[ip] = r
		if r.Since != "" && (want == "" || rvLess(want, r.Since)) {
			want = r.Since
		}
	}
	m.quarantine = q
	return want
}

// waitingFor is the nodes whose acknowledgement does not cover r yet, sorted.
func waitingFor(r *QuarantineRecord, acks map[string]string) []string {
	var out []string
	for node, ack := range acks {
		if r.Since == "" || ack == "" || rvLess(ack, r.Since) {
			out = append(out, node)
		}
	}
	sort.Strings(out)
	return out
}

// rvLess says whether resourceVersion a is before b. Both are decimal integers without
// leading zeros (Kubernetes' resourceVersions are comparable so); anything else compares
// as before everything, so a malformed acknowledgement releases nothing.
func rvLess(a, b string) bool {
	if !isRV(a) {
		return true
	}
	if !isRV(b) {
		return false
	}
	if len(a) != len(b) {
		return len(a) < len(b)
	}
	return a < b
}

func isRV(s string) bool {
	if s == "" || len(s) > 1 && s[0] == '0' {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// quarantineStatus is the quarantined addresses for status; a.mu must be held.
func (a *Agent) quarantineStatus() []api.QuarantinedAddress {
	var out []api.QuarantinedAddress
	for _, ip := range sortedAddrs(a.model.quarantine) {
		r := a.model.quarantine[ip]
		q := api.QuarantinedAddress{Address: ip.String(), Pod: r.Pod, Since: r.Since}
		if r.Since != "" {
			q.WaitingFor = waitingFor(r, a.k8s.acks)
		}
		out = append(out, q)
	}
	return out
}

// quarantineExhausted is the error of an address allocation that found only quarantined
// addresses free; a.mu must be held. 503: the runtime retries, and the addresses come
// free as the other nodes catch up.
func (a *Agent) quarantineExhausted(cidr netip.Prefix) error {
	nodes := map[string]bool{}
	pending := 0
	for _, r := range a.model.quarantine {
		if r.Since == "" {
			pending++
		}
		for _, n := range waitingFor(r, a.k8s.acks) {
			nodes[n] = true
		}
	}
	why := "the API still shows their pods"
	if len(nodes) > 0 {
		why = "waiting for node(s) " + strings.Join(sortedKeys(nodes), ", ") + " to acknowledge their deletion"
	}
	return api.Errorf(http.StatusServiceUnavailable, "no free address in %v: %d addresses belong to deleted pods and are not reused until every node has dropped them (%s; %d of them not yet gone from the API)",
		cidr, len(a.model.quarantine), why, pending)
}

func sortedAddrs[V any](m map[netip.Addr]V) []netip.Addr {
	out := make([]netip.Addr, 0, len(m))
	for ip := range m {
		out = append(out, ip)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Less(out[j]) })
	return out
}

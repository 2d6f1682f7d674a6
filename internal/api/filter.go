package api

import "strings"

// FlowTypeL7 is the type of flows that are HTTP requests the L7 proxy handled.
const FlowTypeL7 = "l7"

// Match reports whether a flow passes the filter. Endpoint, namespace, labels and port match
// either side of the flow.
func (f FlowFilter) Match(fl Flow) bool {
	sides := [2]FlowPeer{fl.Source, fl.Dest}
	if f.Endpoint != "" && !anySide(sides, func(p FlowPeer) bool { return p.Namespace+"/"+p.Name == f.Endpoint }) {
		return false
	}
	if f.Namespace != "" && !anySide(sides, func(p FlowPeer) bool { return p.Namespace == f.Namespace }) {
		return false
	}
	if len(f.Labels) > 0 && !anySide(sides, func(p FlowPeer) bool { return hasLabels(p.Labels, f.Labels) }) {
		return false
	}
	if f.Verdict != "" && !strings.EqualFold(f.Verdict, fl.Verdict) {
		return false
	}
	if f.Port != 0 && fl.Source.Port != f.Port && fl.Dest.Port != f.Port {
		return false
	}
	if f.Protocol != "" && !strings.EqualFold(f.Protocol, fl.Protocol) {
		return false
	}
	if f.From != "" && !podMatch(f.From, fl.Source) || f.To != "" && !podMatch(f.To, fl.Dest) {
		return false
	}
	if !f.Since.IsZero() && fl.Time.Before(f.Since) || !f.Until.IsZero() && fl.Time.After(f.Until) {
		return false
	}
	switch t := strings.ToLower(f.Type); t {
	case "":
		return true
	case "l3l4":
		return fl.Type != FlowTypeL7
	default:
		return fl.Type == t
	}
}

// podMatch is hubble's pod filter: NS/PREFIX, NS/ or PREFIX (in namespace default, as
// hubble reads it). A peer that is no pod (no name) never matches.
func podMatch(filter string, p FlowPeer) bool {
	if p.Name == "" {
		return false
	}
	ns, prefix, ok := strings.Cut(filter, "/")
	if !ok {
		ns, prefix = "default", filter
	}
	return (ns == "" || ns == p.Namespace) && strings.HasPrefix(p.Name, prefix)
}

func anySide(sides [2]FlowPeer, fn func(FlowPeer) bool) bool { return fn(sides[0]) || fn(sides[1]) }

func hasLabels(have []string, want map[string]string) bool {
	for k, v := range want {
		found := false
		for _, l := range have {
			if l == k+"="+v {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

package hubble

import (
	"fmt"
	"net/netip"
	"path"
	"regexp"
	"strconv"
	"strings"

	"google.golang.org/protobuf/reflect/protoreflect"
	k8slabels "k8s.io/apimachinery/pkg/labels"

	"github.com/rampartnet/rampart/internal/hubble/flowpb"
)

// match is one compiled condition on a mapped flow.
type match func(*flowpb.Flow) bool

// supported are the FlowFilter fields this server evaluates. Any other field set is an
// error: a filter silently ignored would show flows the user excluded.
var supported = map[protoreflect.Name]bool{
	"source_ip": true, "destination_ip": true,
	"source_pod": true, "destination_pod": true,
	"source_label": true, "destination_label": true,
	"source_identity": true, "destination_identity": true,
	"traffic_direction": true, "verdict": true, "drop_reason_desc": true, "event_type": true,
	"http_status_code": true, "http_method": true, "http_path": true, "http_url": true,
	"protocol": true, "source_port": true, "destination_port": true, "reply": true,
	"node_name": true, "ip_version": true,
}

// Filters is a request's whitelist and blacklist, compiled: a flow passes when it matches
// one whitelist filter (or there is none) and no blacklist filter. Within a filter every
// field set must match, and a field matches when one of its values does, as in Hubble.
type Filters struct {
	white, black [][]match
}

// CompileFilters compiles a GetFlowsRequest's whitelist and blacklist.
func CompileFilters(white, black []*flowpb.FlowFilter) (*Filters, error) {
	var fs Filters
	for _, l := range []struct {
		in  []*flowpb.FlowFilter
		out *[][]match
		nm  string
	}{{white, &fs.white, "whitelist"}, {black, &fs.black, "blacklist"}} {
		for i, f := range l.in {
			m, err := compile(f)
			if err != nil {
				return nil, fmt.Errorf("%s filter %d: %w", l.nm, i, err)
			}
			*l.out = append(*l.out, m)
		}
	}
	return &fs, nil
}

// Match reports whether f passes.
func (fs *Filters) Match(f *flowpb.Flow) bool {
	if len(fs.white) > 0 && !anyFilter(fs.white, f) {
		return false
	}
	return !anyFilter(fs.black, f)
}

func anyFilter(filters [][]match, f *flowpb.Flow) bool {
	for _, ms := range filters {
		all := true
		for _, m := range ms {
			if !m(f) {
				all = false
				break
			}
		}
		if all {
			return true
		}
	}
	return false
}

func compile(ff *flowpb.FlowFilter) ([]match, error) {
	var err error
	ff.ProtoReflect().Range(func(fd protoreflect.FieldDescriptor, _ protoreflect.Value) bool {
		if !supported[fd.Name()] {
			err = fmt.Errorf("field %s is not supported by Rampart's Hubble server", fd.Name())
			return false
		}
		return true
	})
	if err != nil {
		return nil, err
	}
	var ms []match
	add := func(m match, e error) {
		if e != nil && err == nil {
			err = e
		}
		if m != nil {
			ms = append(ms, m)
		}
	}
	add(ipMatch(ff.SourceIp, func(f *flowpb.Flow) string { return f.GetIP().GetSource() }))
	add(ipMatch(ff.DestinationIp, func(f *flowpb.Flow) string { return f.GetIP().GetDestination() }))
	add(podMatch(ff.SourcePod, (*flowpb.Flow).GetSource))
	add(podMatch(ff.DestinationPod, (*flowpb.Flow).GetDestination))
	add(labelMatch(ff.SourceLabel, (*flowpb.Flow).GetSource))
	add(labelMatch(ff.DestinationLabel, (*flowpb.Flow).GetDestination))
	add(oneOf(ff.SourceIdentity, func(f *flowpb.Flow) uint32 { return f.GetSource().GetIdentity() }), nil)
	add(oneOf(ff.DestinationIdentity, func(f *flowpb.Flow) uint32 { return f.GetDestination().GetIdentity() }), nil)
	add(oneOf(ff.TrafficDirection, (*flowpb.Flow).GetTrafficDirection), nil)
	add(oneOf(ff.Verdict, (*flowpb.Flow).GetVerdict), nil)
	add(oneOf(ff.DropReasonDesc, (*flowpb.Flow).GetDropReasonDesc), nil)
	add(oneOf(ff.IpVersion, func(f *flowpb.Flow) flowpb.IPVersion { return f.GetIP().GetIpVersion() }), nil)
	add(eventTypeMatch(ff.EventType), nil)
	add(statusMatch(ff.HttpStatusCode))
	add(oneOf(upper(ff.HttpMethod), func(f *flowpb.Flow) string { return strings.ToUpper(f.GetL7().GetHttp().GetMethod()) }), nil)
	add(regexpMatch(ff.HttpPath, func(f *flowpb.Flow) (string, bool) {
		return urlPath(f.GetL7().GetHttp().GetUrl()), f.GetL7().GetHttp() != nil
	}))
	add(regexpMatch(ff.HttpUrl, func(f *flowpb.Flow) (string, bool) { return f.GetL7().GetHttp().GetUrl(), f.GetL7().GetHttp() != nil }))
	add(protocolMatch(ff.Protocol))
	add(portMatch(ff.SourcePort, true))
	add(portMatch(ff.DestinationPort, false))
	add(replyMatch(ff.Reply), nil)
	add(nodeMatch(ff.NodeName))
	return ms, err
}

func oneOf[T comparable](want []T, get func(*flowpb.Flow) T) match {
	if len(want) == 0 {
		return nil
	}
	return func(f *flowpb.Flow) bool {
		v := get(f)
		for _, w := range want {
			if v == w {
				return true
			}
		}
		return false
	}
}

func upper(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[i] = strings.ToUpper(v)
	}
	return out
}

// ipMatch matches an address or a prefix.
func ipMatch(want []string, get func(*flowpb.Flow) string) (match, error) {
	if len(want) == 0 {
		return nil, nil
	}
	var prefixes []netip.Prefix
	for _, w := range want {
		if p, err := netip.ParsePrefix(w); err == nil {
			prefixes = append(prefixes, p.Masked())
			continue
		}
		a, err := netip.ParseAddr(w)
		if err != nil {
			return nil, fmt.Errorf("ip %q: not an address or a prefix", w)
		}
		prefixes = append(prefixes, netip.PrefixFrom(a, a.BitLen()))
	}
	return func(f *flowpb.Flow) bool {
		a, err := netip.ParseAddr(get(f))
		if err != nil {
			return false
		}
		for _, p := range prefixes {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}, nil
}

// podMatch is Hubble's pod filter: NAMESPACE/PREFIX, NAMESPACE/ or PREFIX (namespace
// default, as Hubble reads it).
func podMatch(want []string, get func(*flowpb.Flow) *flowpb.Endpoint) (match, error) {
	if len(want) == 0 {
		return nil, nil
	}
	type nsName struct{ ns, prefix string }
	var ws []nsName
	for _, w := range want {
		if w == "" {
			return nil, fmt.Errorf("pod: empty name")
		}
		ns, prefix, ok := strings.Cut(w, "/")
		if !ok {
			ns, prefix = "default", w
		}
		ws = append(ws, nsName{ns, prefix})
	}
	return func(f *flowpb.Flow) bool {
		ep := get(f)
		if ep.GetPodName() == "" && ep.GetNamespace() == "" {
			return false
		}
		for _, w := range ws {
			if (w.ns == "" || w.ns == ep.GetNamespace()) && strings.HasPrefix(ep.GetPodName(), w.prefix) {
				return true
			}
		}
		return false
	}, nil
}

// sourcePrefix is a Cilium label source in a selector ("k8s:app=x"): Rampart's labels
// have no source, so k8s: and any: are dropped and the others (reserved:host) kept in
// the key as Cilium's parser keeps them ("reserved.host").
var sourcePrefix = regexp.MustCompile(`(^|[,!(]\s*|^\s*)([A-Za-z0-9-]+):`)

// labelMatch matches Kubernetes label selectors against an endpoint's labels.
func labelMatch(want []string, get func(*flowpb.Flow) *flowpb.Endpoint) (match, error) {
	if len(want) == 0 {
		return nil, nil
	}
	var sels []k8slabels.Selector
	for _, w := range want {
		tr := sourcePrefix.ReplaceAllStringFunc(w, func(m string) string {
			sub := sourcePrefix.FindStringSubmatch(m)
			if sub[2] == "k8s" || sub[2] == "any" {
				return sub[1]
			}
			return sub[1] + sub[2] + "."
		})
		s, err := k8slabels.Parse(tr)
		if err != nil {
			return nil, fmt.Errorf("label selector %q: %w", w, err)
		}
		sels = append(sels, s)
	}
	return func(f *flowpb.Flow) bool {
		set := k8slabels.Set{}
		for _, l := range get(f).GetLabels() {
			k, v, _ := strings.Cut(l, "=")
			if src, name, ok := strings.Cut(k, ":"); ok {
				k = src + "." + name // reserved:host
			}
			set[k] = v
		}
		for _, s := range sels {
			if s.Matches(set) {
				return true
			}
		}
		return false
	}, nil
}

func eventTypeMatch(want []*flowpb.EventTypeFilter) match {
	if len(want) == 0 {
		return nil
	}
	return func(f *flowpb.Flow) bool {
		et := f.GetEventType()
		for _, w := range want {
			if w.GetType() == et.GetType() && (!w.GetMatchSubType() || w.GetSubType() == et.GetSubType()) {
				return true
			}
		}
		return false
	}
}

// statusMatch is Hubble's status filter: a code ("404") or a prefix and "+" ("5+", "40+").
func statusMatch(want []string) (match, error) {
	if len(want) == 0 {
		return nil, nil
	}
	for _, w := range want {
		d := strings.TrimSuffix(w, "+")
		if _, err := strconv.ParseUint(d, 10, 16); err != nil || len(d) > 3 || len(d) < 3 && d == w {
			return nil, fmt.Errorf("http status code %q: want a 3-digit code or a prefix and +", w)
		}
	}
	return func(f *flowpb.Flow) bool {
		h := f.GetL7().GetHttp()
		if h == nil || h.GetCode() == 0 {
			return false
		}
		code := strconv.Itoa(int(h.GetCode()))
		for _, w := range want {
			if d, ok := strings.CutSuffix(w, "+"); ok && strings.HasPrefix(code, d) || code == w {
				return true
			}
		}
		return false
	}, nil
}

func regexpMatch(want []string, get func(*flowpb.Flow) (string, bool)) (match, error) {
	if len(want) == 0 {
		return nil, nil
	}
	var res []*regexp.Regexp
	for _, w := range want {
		re, err := regexp.Compile(w)
		if err != nil {
			return nil, fmt.Errorf("regular expression %q: %w", w, err)
		}
		res = append(res, re)
	}
	return func(f *flowpb.Flow) bool {
		s, ok := get(f)
		if !ok {
			return false
		}
		for _, re := range res {
			if re.MatchString(s) {
				return true
			}
		}
		return false
	}, nil
}

// urlPath is the path of an L7 flow's URL ("http://host/p" or "/p").
func urlPath(u string) string {
	if rest, ok := strings.CutPrefix(u, "http://"); ok {
		if i := strings.IndexByte(rest, '/'); i >= 0 {
			return rest[i:]
		}
		return "/"
	}
	return u
}

func protocolMatch(want []string) (match, error) {
	if len(want) == 0 {
		return nil, nil
	}
	for _, w := range want {
		switch strings.ToLower(w) {
		case "tcp", "udp", "sctp", "icmp", "icmpv4", "icmpv6", "http":
		default:
			return nil, fmt.Errorf("protocol %q: want tcp, udp, sctp, icmp, icmpv4, icmpv6 or http", w)
		}
	}
	return func(f *flowpb.Flow) bool {
		l4 := f.GetL4()
		for _, w := range want {
			switch strings.ToLower(w) {
			case "tcp":
				if l4.GetTCP() != nil {
					return true
				}
			case "udp":
				if l4.GetUDP() != nil {
					return true
				}
			case "sctp":
				if l4.GetSCTP() != nil {
					return true
				}
			case "icmp":
				if l4.GetICMPv4() != nil || l4.GetICMPv6() != nil {
					return true
				}
			case "icmpv4":
				if l4.GetICMPv4() != nil {
					return true
				}
			case "icmpv6":
				if l4.GetICMPv6() != nil {
					return true
				}
			case "http":
				if f.GetL7().GetHttp() != nil {
					return true
				}
			}
		}
		return false
	}, nil
}

// portMatch matches a port or a range LOW-HIGH.
func portMatch(want []string, source bool) (match, error) {
	if len(want) == 0 {
		return nil, nil
	}
	type span struct{ lo, hi uint64 }
	var spans []span
	for _, w := range want {
		lo, hi, isRange := strings.Cut(w, "-")
		l, err1 := strconv.ParseUint(lo, 10, 16)
		h := l
		var err2 error
		if isRange {
			h, err2 = strconv.ParseUint(hi, 10, 16)
		}
		if err1 != nil || err2 != nil || h < l {
			return nil, fmt.Errorf("port %q: want a port or a range LOW-HIGH", w)
		}
		spans = append(spans, span{l, h})
	}
	return func(f *flowpb.Flow) bool {
		sp, dp, ok := ports(f.GetL4())
		if !ok {
			return false
		}
		p := uint64(dp)
		if source {
			p = uint64(sp)
		}
		for _, s := range spans {
			if s.lo <= p && p <= s.hi {
				return true
			}
		}
		return false
	}, nil
}

func ports(l4 *flowpb.Layer4) (src, dst uint32, ok bool) {
	switch {
	case l4.GetTCP() != nil:
		return l4.GetTCP().GetSourcePort(), l4.GetTCP().GetDestinationPort(), true
	case l4.GetUDP() != nil:
		return l4.GetUDP().GetSourcePort(), l4.GetUDP().GetDestinationPort(), true
	case l4.GetSCTP() != nil:
		return l4.GetSCTP().GetSourcePort(), l4.GetSCTP().GetDestinationPort(), true
	}
	return 0, 0, false
}

// replyMatch: a flow whose is_reply is unknown matches neither true nor false, as in
// Hubble.
func replyMatch(want []bool) match {
	if len(want) == 0 {
		return nil
	}
	return func(f *flowpb.Flow) bool {
		if f.GetIsReply() == nil {
			return false
		}
		for _, w := range want {
			if f.GetIsReply().GetValue() == w {
				return true
			}
		}
		return false
	}
}

// nodeMatch matches node names against shell patterns ("node-*"); a pattern's
// CLUSTER/ part, which Rampart's flows do not have, is ignored.
func nodeMatch(want []string) (match, error) {
	if len(want) == 0 {
		return nil, nil
	}
	var pats []string
	for _, w := range want {
		if i := strings.LastIndexByte(w, '/'); i >= 0 {
			w = w[i+1:]
		}
		if _, err := path.Match(w, ""); err != nil {
			return nil, fmt.Errorf("node name pattern %q: %w", w, err)
		}
		pats = append(pats, w)
	}
	return func(f *flowpb.Flow) bool {
		for _, p := range pats {
			if ok, _ := path.Match(p, f.GetNodeName()); ok {
				return true
			}
		}
		return false
	}, nil
}

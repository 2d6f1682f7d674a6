package taps

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"strings"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/labels"
	"github.com/rampartnet/rampart/internal/policy"
	"github.com/rampartnet/rampart/internal/tap"
)

// ErrNoTaps is the answer to a tap contract on a dataplane without taps.
var ErrNoTaps = api.Errorf(http.StatusNotImplemented, "the dataplane has no taps yet: tap contracts cannot be enforced on this node, so none is accepted")

// Record is a tap contract as persisted: the document as read (compact JSON) and where it
// came from; it is parsed again at start.
type Record struct {
	Kind   string          `json:"kind"`
	Name   string          `json:"name"`
	Source string          `json:"source"`
	Raw    json.RawMessage `json:"raw"`
	// Cluster: the contract is an object of the Kubernetes API, which every sync replaces;
	// the local API cannot change or delete it.
	Cluster bool `json:"cluster,omitempty"`
}

// Stored is a contract of the model: its record and the contract parsed from it. Both are
// immutable once in a model.
type Stored struct {
	Rec      *Record
	Contract *tap.Contract
}

// Config is the subsystem's part of the model: the user's contracts by name, the tap
// policy (nil: none) and why local monitors are down, by namespace/name (what the agent
// last saw of them, never persisted). It is copied with the model: maps copied, records
// shared.
type Config struct {
	Contracts map[string]*Stored
	Policy    *PolicyRecord
	Down      map[string]string
}

// Clone copies c's maps.
func (c Config) Clone() Config {
	return Config{Contracts: maps.Clone(c.Contracts), Policy: c.Policy, Down: maps.Clone(c.Down)}
}

// Endpoint is an endpoint as the subsystem reads it: a local one (Node "") with its
// endpoint id, or a pod on another node.
type Endpoint struct {
	Key             string // namespace/name
	Namespace, Name string
	Node            string     // "": this node
	NodeAddr        netip.Addr // the other node's address
	ID              uint32     // local: the endpoint id
	Monitor         bool
	Labels          labels.Labels // its own labels (the tap policy's label facts)
	Full            labels.Labels // the full label set contracts select by (labels.ForPod)
	IP              netip.Addr
	Ports           []Port
}

// Port is a named port of an endpoint.
type Port struct {
	Name     string
	Port     uint16
	Protocol string
}

// Node is another node.
type Node struct {
	Name    string
	PodCIDR netip.Prefix
}

// World is what the subsystem reads of the model beyond its own part: the endpoints and
// the other nodes. The core builds it only when the subsystem has something to resolve.
type World struct {
	Local  []Endpoint // sorted by key
	Remote []Endpoint // sorted by key
	Nodes  []Node     // sorted by name
}

// byKey indexes w's endpoints by key; a local endpoint wins over a remote one of the same
// key.
func (w World) byKey() map[string]Endpoint {
	out := make(map[string]Endpoint, len(w.Local)+len(w.Remote))
	for _, e := range w.Remote {
		out[e.Key] = e
	}
	for _, e := range w.Local {
		out[e.Key] = e
	}
	return out
}

// Endpoints is w as tap resolution sees it: local endpoints (node "") with their ids and
// whether their monitor reads (down), and remote ones with their nodes.
func (w World) Endpoints(down map[string]string) []tap.Endpoint {
	out := make([]tap.Endpoint, 0, len(w.Local)+len(w.Remote))
	for _, e := range w.Local {
		out = append(out, tap.Endpoint{
			Namespace: e.Namespace, Name: e.Name, ID: e.ID, Monitor: e.Monitor, Down: down[e.Key],
			Labels: e.Full, Addrs: []netip.Addr{e.IP},
		})
	}
	for _, e := range w.Remote {
		out = append(out, tap.Endpoint{
			Namespace: e.Namespace, Name: e.Name, Node: e.Node, NodeAddr: e.NodeAddr, Monitor: e.Monitor,
			Labels: e.Full, Addrs: []netip.Addr{e.IP},
		})
	}
	return out
}

// resolve resolves c's contracts and the tap policy's (compiled) against w's endpoints;
// nothing when there is no contract, so that nodes without taps pay nothing for them.
func resolve(c Config, compiled []*tap.Contract, w World) tap.Resolution {
	if len(c.Contracts)+len(compiled) == 0 {
		return tap.Resolution{}
	}
	return tap.Resolve(append(userContracts(c), compiled...), w.Endpoints(c.Down), "")
}

func userContracts(c Config) []*tap.Contract {
	cs := make([]*tap.Contract, 0, len(c.Contracts))
	for _, st := range c.Contracts {
		cs = append(cs, st.Contract)
	}
	return cs
}

// Put creates or replaces contracts in c (the new model's part, which it changes), and
// checks them as one: a dataplane with taps, monitors that are monitors, no overlap with
// another contract on any endpoint. cur is the live state (the tap policy's contracts as
// they stand); managed, when not nil, refuses a change of a contract of the Kubernetes
// API. It returns the changes, one per contract.
func (s *Subsystem) Put(c Config, cur *State, w World, contracts []*tap.Contract, managed func(what string) error) ([]api.PolicyChange, error) {
	if len(contracts) == 0 {
		return nil, nil
	}
	if s.table == nil {
		return nil, ErrNoTaps
	}
	var changed []string
	var out []api.PolicyChange
	eps := w.byKey()
	for _, k := range contracts {
		action := "created"
		if prev, ok := c.Contracts[k.Name]; ok {
			if prev.Rec.Cluster {
				if err := managed(k.Kind + " " + k.Name); err != nil {
					return nil, err
				}
			}
			if prev.Rec.Kind != k.Kind {
				return nil, api.Conflict("%s %s: a %s of that name exists (tap contracts of both kinds share one space of names)", k.Kind, k.Name, prev.Rec.Kind)
			}
			action = "configured"
			if bytes.Equal(prev.Rec.Raw, k.Raw) {
				action = "unchanged"
			}
		}
		if err := checkMonitor(eps, k); err != nil {
			return nil, err
		}
		c.Contracts[k.Name] = &Stored{Rec: &Record{Kind: k.Kind, Name: k.Name, Source: k.Origin, Raw: json.RawMessage(k.Raw)}, Contract: k}
		changed = append(changed, k.Name)
		out = append(out, api.PolicyChange{Kind: k.Kind, Name: k.Name, Action: action})
	}
	// The tap policy's contracts as they stand: a user contract that overlaps one is
	// refused, naming both (the policy is compiled again after this change, and a
	// compilation that would overlap keeps these).
	compiled := cur.Compiled()
	for _, k := range compiled {
		if _, ok := c.Contracts[k.Name]; ok {
			return nil, api.Conflict("%s %s: the tap policy derives a contract of that name", k.Kind, k.Name)
		}
	}
	all := append(userContracts(c), compiled...)
	if err := tap.CheckChanged(resolve(c, compiled, w), all, changed); err != nil {
		return nil, api.Conflict("%v", err)
	}
	return out, nil
}

// MonitorHint says how a monitor is made, in CheckMonitor's refusal (Kubernetes mode puts
// its way in its place).
const MonitorHint = "create it with --monitor"

// CheckMonitor refuses a contract whose monitor is an endpoint that is not a monitor. A
// monitor that does not exist (yet) is accepted: the contract then resolves as "monitor
// unavailable", and a redirect drops what it matches until the monitor is there.
func CheckMonitor(w World, c *tap.Contract) error { return checkMonitor(w.byKey(), c) }

// checkMonitor is CheckMonitor over World.byKey.
func checkMonitor(eps map[string]Endpoint, c *tap.Contract) error {
	if e, ok := eps[c.Monitor]; ok && !e.Monitor {
		return api.BadRequest("%s %s (%s): spec.monitor: endpoint %s is not a monitor (%s)", c.Kind, c.Name, c.Origin, c.Monitor, MonitorHint)
	}
	// Monitors are never tapped: a contract naming one as its source would tap nothing.
	if e, ok := eps[c.Source.Endpoint]; ok && e.Node == "" && e.Monitor {
		return api.BadRequest("%s %s (%s): spec.source.endpoint: %s is a monitor, and monitors are not tapped", c.Kind, c.Name, c.Origin, c.Source.Endpoint)
	}
	return nil
}

// Delete removes contracts by name from c; one that does not exist fails unless
// ignoreNotFound. kinds[i] is the kind names[i] was asked as ("": any).
func Delete(c Config, names []string, kinds []string, ignoreNotFound bool) ([]api.PolicyChange, error) {
	var out []api.PolicyChange
	for i, name := range names {
		ch := api.PolicyChange{Kind: kinds[i], Name: name, Action: "deleted"}
		st, ok := c.Contracts[name]
		switch {
		case ok && st.Rec.Cluster:
			return nil, api.Conflict("%s %s: managed by the Kubernetes API (delete the object there)", st.Rec.Kind, name)
		case ok && kinds[i] != "" && st.Rec.Kind != kinds[i]:
			return nil, api.NotFound("%s %q not found (%q is a %s)", kinds[i], name, name, st.Rec.Kind)
		case ok:
			ch.Kind = st.Rec.Kind
		case !ignoreNotFound && compiledName(name):
			return nil, api.NotFound("tap contract %q not found among the contracts you added (names tp-... are the tap policy's: change or delete the policy)", name)
		case !ignoreNotFound:
			kind := kinds[i]
			if kind == "" {
				kind = "tap contract"
			}
			return nil, api.NotFound("%s %q not found", kind, name)
		default:
			ch.Action = "not found"
		}
		delete(c.Contracts, name)
		out = append(out, ch)
	}
	return out, nil
}

// ParseRecord parses a stored contract (at start) with parse, the agent's parser.
func ParseRecord(parse func(source string, data []byte) (*policy.Documents, error), rec *Record) (*tap.Contract, error) {
	docs, err := parse(rec.Source, rec.Raw)
	if err != nil {
		return nil, fmt.Errorf("re-parsing stored tap contract %s: %w", rec.Name, err)
	}
	if len(docs.Taps) != 1 || len(docs.Policies)+len(docs.CIDRGroups) != 0 || docs.Taps[0].Name != rec.Name || docs.Taps[0].Kind != rec.Kind {
		return nil, fmt.Errorf("re-parsing stored tap contract %s: not one %s of that name", rec.Name, rec.Kind)
	}
	k := docs.Taps[0]
	k.Origin = rec.Source
	return k, nil
}

// compiledName says whether name has the form of a tap policy's contracts.
func compiledName(name string) bool { return strings.HasPrefix(name, "tp-") }

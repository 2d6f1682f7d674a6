package tappolicy

import (
	"fmt"
	"sort"
	"strings"

	"github.com/google/mangle/ast"
	"github.com/google/mangle/factstore"
)

// Facts are what Rampart knows of the system, as the policy sees it.
type Facts struct {
	Endpoints []Endpoint
	Nodes     []Node
	// Talks lists who may open connections to whom, as policy allows it (from the policy
	// computation): the flows a request-integrity policy follows across services.
	Talks []Talk
}

// Endpoint is an endpoint (a pod) of the model.
type Endpoint struct {
	Namespace, Name string
	Node            string
	Labels          map[string]string
	Ports           []Port // the ports it serves
	// Exposed says that policy admits traffic from outside the cluster (world, or a CIDR
	// that is not the cluster's) to it.
	Exposed bool
	// Monitor is set on a monitor endpoint: what it inspects and how loaded it is.
	Monitor *Monitor
}

// Key is the endpoint's name in the facts: namespace/name.
func (e Endpoint) Key() string { return e.Namespace + "/" + e.Name }

// Port is a port an endpoint serves.
type Port struct {
	Protocol string // TCP, UDP
	Port     uint16
}

// Monitor says what a monitor endpoint does.
type Monitor struct {
	// Inspects are the traffic kinds it understands: application protocols of its parsers
	// ("http", "pgsql", "amqp", ...) or "tcp", "udp", "any".
	Inspects []string
	// Load is its current load in any unit the placement compares (e.g. flows or Mbit/s).
	Load int64
}

// Node is a node and its load.
type Node struct {
	Name string
	Load int64
}

// Talk is one allowed connection: From may open connections to To on Protocol/Port.
type Talk struct {
	From, To string // endpoint keys (namespace/name)
	Protocol string
	Port     uint16
}

// schema declares the facts a policy reads (extensional: a policy may not define them) and
// documents them; `rampart tap compile --explain` and docs/taps.md show the same list.
const schema = `
Decl endpoint(Endpoint, Namespace, Node) descr [extensional(), doc("an endpoint, named namespace/name, on a node")].
Decl label(Endpoint, Key, Value) descr [extensional(), doc("a label of an endpoint")].
Decl port(Endpoint, Protocol, Port) descr [extensional(), doc("a port the endpoint serves; Protocol \"TCP\" or \"UDP\"")].
Decl exposed(Endpoint) descr [extensional(), doc("policy admits traffic from outside the cluster to the endpoint")].
Decl talks(From, To, Protocol, Port) descr [extensional(), doc("policy allows From to open connections to To on Protocol/Port")].
Decl monitor(Monitor, Node) descr [extensional(), doc("a monitor endpoint and its node")].
Decl inspects(Monitor, What) descr [extensional(), doc("what a monitor understands: \"http\", \"pgsql\", \"tcp\", \"any\", ...")].
Decl monitor_load(Monitor, Load) descr [extensional(), doc("a monitor's load")].
Decl node(Node, Load) descr [extensional(), doc("a node and its load")].
`

// schemaLines is how many lines the schema takes before the policy's own text, so that
// errors name the policy's line numbers.
var schemaLines = strings.Count(schema, "\n")

// store puts the facts into a fact store, in a deterministic order.
func (f Facts) store() (factstore.SimpleInMemoryStore, error) {
	st := factstore.NewSimpleInMemoryStore()
	add := func(pred string, args ...ast.BaseTerm) { st.Add(ast.NewAtom(pred, args...)) }
	s, n := ast.String, func(v int64) ast.BaseTerm { return ast.Number(v) }
	seen := map[string]bool{}
	for _, e := range f.Endpoints {
		k := e.Key()
		if e.Namespace == "" || e.Name == "" {
			return st, fmt.Errorf("facts: endpoint %q: namespace and name required", k)
		}
		if seen[k] {
			return st, fmt.Errorf("facts: endpoint %s listed twice", k)
		}
		seen[k] = true
		add("endpoint", s(k), s(e.Namespace), s(e.Node))
		keys := make([]string, 0, len(e.Labels))
		for key := range e.Labels {
			keys = append(keys, key)
		}
		sort.Strings(keys)
		for _, key := range keys {
			add("label", s(k), s(key), s(e.Labels[key]))
		}
		for _, p := range e.Ports {
			add("port", s(k), s(strings.ToUpper(p.Protocol)), n(int64(p.Port)))
		}
		if e.Exposed {
			add("exposed", s(k))
		}
		if m := e.Monitor; m != nil {
			add("monitor", s(k), s(e.Node))
			for _, w := range m.Inspects {
				add("inspects", s(k), s(strings.ToLower(w)))
			}
			add("monitor_load", s(k), n(m.Load))
		}
	}
	for _, nd := range f.Nodes {
		add("node", s(nd.Name), n(nd.Load))
	}
	for _, t := range f.Talks {
		add("talks", s(t.From), s(t.To), s(strings.ToUpper(t.Protocol)), n(int64(t.Port)))
	}
	return st, nil
}

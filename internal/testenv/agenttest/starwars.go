package agenttest

import "github.com/rampartnet/rampart/internal/api"

// StarWars are the Star Wars scenario's ships and their labels
// (examples/starwars/README.md), in the order they are added.
var StarWars = []struct {
	Name   string
	Labels map[string]string
}{
	{"tiefighter", map[string]string{"org": "empire", "class": "tiefighter"}},
	{"deathstar", map[string]string{"org": "empire", "class": "deathstar"}},
	{"xwing", map[string]string{"org": "alliance", "class": "xwing"}},
}

// AddStarWars adds the Star Wars scenario's endpoints to namespace ns and returns them by
// name.
func (e *Env) AddStarWars(ns string) map[string]api.Endpoint {
	e.T.Helper()
	out := map[string]api.Endpoint{}
	for _, s := range StarWars {
		out[s.Name] = e.AddEndpoint(ns, s.Name, s.Labels)
	}
	return out
}

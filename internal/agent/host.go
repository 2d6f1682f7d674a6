package agent

import (
	"net/http"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/policy"
)

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
func (a *Agent) hostFirewall() bool { return false }

package agent

import (
	"context"

	"github.com/rampartnet/rampart/internal/api"
)

// ListCIDRSets lists the CIDR sets.
func (a *Agent) ListCIDRSets(ctx context.Context) ([]api.CIDRSet, error) {
	return []api.CIDRSet{}, nil
}

// GetCIDRSet describes a CIDR set.
func (a *Agent) GetCIDRSet(ctx context.Context, name string) (api.CIDRSet, error) {
	return api.CIDRSet{}, api.NotFound("CIDR set %q not found", name)
}

// LoadCIDRSet creates or replaces a CIDR set.
func (a *Agent) LoadCIDRSet(ctx context.Context, req api.CIDRSetRequest) (api.CIDRSetChange, error) {
	return api.CIDRSetChange{}, api.Errorf(501, "CIDR sets are not implemented yet")
}

// AddCIDRs adds prefixes to a CIDR set.
func (a *Agent) AddCIDRs(ctx context.Context, req api.CIDRSetRequest) (api.CIDRSetChange, error) {
	return api.CIDRSetChange{}, api.Errorf(501, "CIDR sets are not implemented yet")
}

// RemoveCIDRs removes prefixes from a CIDR set.
func (a *Agent) RemoveCIDRs(ctx context.Context, req api.CIDRSetRequest) (api.CIDRSetChange, error) {
	return api.CIDRSetChange{}, api.Errorf(501, "CIDR sets are not implemented yet")
}

// DeleteCIDRSet deletes a CIDR set.
func (a *Agent) DeleteCIDRSet(ctx context.Context, name string, force bool) (api.CIDRSetChange, error) {
	return api.CIDRSetChange{}, api.NotFound("CIDR set %q not found", name)
}

package policyoverhead

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os/exec"

	"github.com/rampartnet/rampart/bench/internal/benchkit"
	"github.com/rampartnet/rampart/internal/endpoint"
)

// topology is a client and a server endpoint (and, with the agent, a bystander) joined
// through a node network namespace.
type topology struct {
	Name                      string
	Client, Server, Bystander *benchkit.Endpoint
	IPv6                      bool // traffic to the server's IPv6 address
}

// serverAddr is where the client's traffic goes: the server's address of the run's family.
func (t *topology) serverAddr() netip.Addr {
	if t.IPv6 {
		return t.Server.IP6
	}
	return t.Server.IP
}

// nsenterCommand runs argv in the network namespace at path. Only the network namespace is
// switched (never `ip netns exec`, which remounts /sys).
func nsenterCommand(path string) func(ctx context.Context, argv ...string) *exec.Cmd {
	return func(ctx context.Context, argv ...string) *exec.Cmd {
		args := append([]string{"--net=" + path, "--"}, argv...)
		return benchkit.OwnGroup(exec.CommandContext(ctx, "nsenter", args...))
	}
}

// buildBaseline creates the no-agent topology with the endpoint package, the same code
// the agent uses to create endpoints, so the path differs from the agent's only by the
// dataplane: node namespace with forwarding and the router address on lo, a veth pair per
// endpoint, /32 addresses and routes (and with podCIDR6 the IPv6 ones, as a dual-stack
// agent makes them). It returns a clean-up function that removes
// everything it created (also after a partial failure).
func buildBaseline(instance string, podCIDR, podCIDR6 netip.Prefix) (*topology, func() error, error) {
	node := endpoint.Node{Instance: instance, Netns: instance + "-node", PodCIDR: podCIDR, PodCIDR6: podCIDR6}
	var created []string
	cleanup := func() error {
		var errs []error
		for i := len(created) - 1; i >= 0; i-- {
			if err := node.Delete(benchNamespace, created[i]); err != nil {
				errs = append(errs, fmt.Errorf("deleting baseline endpoint %s: %w", created[i], err))
			}
		}
		if err := node.Teardown(); err != nil {
			errs = append(errs, fmt.Errorf("removing baseline node namespace: %w", err))
		}
		return errors.Join(errs...)
	}
	if err := node.Setup(); err != nil {
		return nil, cleanup, fmt.Errorf("setting up baseline node namespace: %w", err)
	}
	mk := func(name string, ip netip.Addr) (*benchkit.Endpoint, error) {
		created = append(created, name) // Delete copes with half-created endpoints
		ep, err := node.Create(benchNamespace, name, ip)
		if err != nil {
			return nil, fmt.Errorf("creating baseline endpoint %s: %w", name, err)
		}
		return &benchkit.Endpoint{Name: benchNamespace + "/" + name, IP: ip, IP6: ep.IP6, Command: nsenterCommand(ep.NetnsPath)}, nil
	}
	client, err := mk("client", benchkit.HostAddr(podCIDR, 10))
	if err != nil {
		return nil, cleanup, err
	}
	server, err := mk("server", benchkit.HostAddr(podCIDR, 11))
	if err != nil {
		return nil, cleanup, err
	}
	return &topology{Name: "no-agent", Client: client, Server: server}, cleanup, nil
}

package agent

import (
	"errors"
	"fmt"
	"os"

	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/endpoint"
)

// Uninstall removes everything an agent with this configuration created: every endpoint's
// veth and network namespace, the BPF pins, the state directory, the socket and the node
// namespace (or, for the root namespace, the router address). The agent must not be
// running.
func Uninstall(cfg Config) error {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	netw := cfg.Network
	if netw == nil {
		netw = endpoint.Node{Instance: cfg.Instance, Netns: cfg.NodeNetns, PodCIDR: cfg.PodCIDR}
	}
	var errs []error
	// Refuse while an agent answers: it would recreate what we remove.
	if l, err := listenProbe(cfg.Socket); err != nil {
		return err
	} else if l != nil {
		l()
	}
	unlock, err := lockInstance(cfg.StateDir)
	if err != nil {
		return err
	}
	defer unlock()
	st, err := loadState(cfg.StateDir)
	if err != nil {
		errs = append(errs, err)
		st = &stateFile{}
	}
	for _, e := range st.Endpoints {
		if err := netw.Delete(e.Namespace, e.Name); err != nil {
			errs = append(errs, fmt.Errorf("deleting endpoint %s: %w", e.Key(), err))
		}
	}
	open := cfg.OpenDatapath
	if open == nil {
		open = openDatapath
	}
	if dp, err := open(cfg); err == nil {
		if err := dp.Remove(); err != nil {
			errs = append(errs, fmt.Errorf("removing BPF pins: %w", err))
		}
		dp.Close()
	}
	// Whatever the datapath left (or could not open) goes too.
	if err := os.RemoveAll(cfg.BPFDir); err != nil {
		errs = append(errs, fmt.Errorf("removing %s: %w", cfg.BPFDir, err))
	}
	if cfg.Network == nil && cfg.NodeNetns == "" {
		// The root namespace stays: take the proxy's policy routing out of it (a named node
		// namespace goes as a whole).
		if err := datapath.TeardownProxyRouting(""); err != nil {
			errs = append(errs, err)
		}
	}
	if err := netw.Teardown(); err != nil {
		errs = append(errs, fmt.Errorf("removing node network setup: %w", err))
	}
	if err := removeProxyRunDir(cfg); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(cfg.StateDir); err != nil {
		errs = append(errs, fmt.Errorf("removing state: %w", err))
	}
	return errors.Join(errs...)
}

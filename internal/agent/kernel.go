package agent

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"

	"github.com/rampartnet/rampart/internal/agent/taps"
	"github.com/rampartnet/rampart/internal/cidrtable"
	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/overlay"
	"github.com/rampartnet/rampart/internal/service"
	"github.com/rampartnet/rampart/internal/sockverdict"
)

// The agent's kernel edge is one small interface per concern, declared in the file that
// uses it (EndpointTables in endpoints.go, IPCache in agent.go, ProxyRouting in proxy.go,
// FlowEvents in flows.go, CIDRSets in cidrsets.go, SendSide in sendside.go, MapMemories in
// memory.go; the taps subsystem declares its own, taps.Table and taps.Monitors) and satisfied directly by the kernel package that owns the concept; Kernel
// gathers them, and openKernel wires the real ones. They are interfaces so that the
// agent's transactions can be tested without the kernel (the fake*_test.go files).

// Kernel is what the agent needs below it. Its interfaces are embedded so that the agent
// calls their methods directly (a.dp.Attach, a.dp.ReplaceCIDRSets...).
type Kernel struct {
	EndpointTables // *datapath.Endpoints
	IPCache        // *datapath.IPCache
	ProxyRouting   // *datapath.Proxy
	FlowEvents     // *datapath.EventReader
	CIDRSets       // *cidrtable.Tables
	SendSide       // *sockverdict.Manager
	MapMemories    // *datapath.Pins
	Overlay        // overlayKernel: internal/overlay and *datapath.Tunnel
	// Taps is the dataplane's tap rules (internal/agent/taps over *datapath.Taps); nil
	// while the dataplane has none, and then tap contracts are refused.
	Taps taps.Table
	// Monitors attaches monitor endpoints' interfaces (internal/agent/taps); nil with Taps.
	Monitors taps.Monitors
	// Services is the Service translation (services.go); nil: none, and Services are
	// refused.
	Services ServiceTable
	// DNS is the DNS proxy's place in the dataplane (dns.go; dnsKernel); nil: DNS rules
	// steer to no proxy, so their queries are dropped.
	DNS DNSKernel
	// Host is host policy's place in the dataplane (host.go; *datapath.Host); nil: the
	// host firewall is refused.
	Host HostDevices
	// Close releases the agent's handles; pinned maps and attached programs stay.
	Close func() error
}

// openKernel opens the kernel packages and wires them as the agent's Kernel: the tc
// dataplane, the CIDR set tables over its maps, the send-side verdict (loaded on first
// use) and the flow event reader.
func openKernel(cfg Config) (Kernel, error) {
	dp, err := datapath.Open(datapath.Config{PinDir: cfg.BPFDir, Attach: cfg.Attach})
	if err != nil {
		return Kernel{}, err
	}
	tables, err := cidrtable.Open(cidrtable.Maps(dp.Pins.CIDRMaps()), cfg.CIDRHostSlots)
	if err != nil {
		dp.Close()
		return Kernel{}, err
	}
	side, err := sockverdict.NewManager(dp.Pins.PinDir(), dp.Pins.SockPairsMap())
	if err != nil {
		tables.Close()
		dp.Close()
		return Kernel{}, err
	}
	// Open the reader now so that events emitted from here on are not lost to nobody.
	events, err := dp.Events.Reader()
	if err != nil {
		tables.Close()
		dp.Close()
		return Kernel{}, err
	}
	var once sync.Once
	var closeErr error
	tapKernel := taps.NewKernel(dp.Taps)
	services := &lazyServices{cgroup: cfg.ServiceCgroup}
	return Kernel{
		EndpointTables: dp.Endpoints,
		IPCache:        dp.IPCache,
		ProxyRouting:   dp.Proxy,
		MapMemories:    dp.Pins,
		Overlay:        overlayKernel{dp: dp.Tunnel, underlay: cfg.VXLANUnderlay},
		Taps:           tapKernel,
		Monitors:       tapKernel,
		Services:       services,
		DNS:            dnsKernel{dp.Proxy, dp.Conntrack},
		Host:           dp.Host,
		CIDRSets:       tables,
		SendSide:       side,
		FlowEvents:     events,
		Close: func() error {
			once.Do(func() {
				events.Close()
				tables.Close()
				// The send-side verdict's programs stay (pinned), like the tc programs; the
				// Service translation's go with the process (docs/services.md).
				closeErr = errors.Join(side.Close(), services.Close(), dp.Close())
			})
			return closeErr
		},
	}, nil
}

// FindPins returns the paths of the dataplane's pins in the pin directory dir: the tc
// object's and those of the send-side verdict, which shares the directory.
func FindPins(dir string) ([]string, error) {
	sv, err := sockverdict.PinNames()
	if err != nil {
		return nil, err
	}
	return datapath.FindPins(dir, sv...)
}

// lazyServices is ServiceTable over datapath.Services, whose programs are attached to
// the cgroup only when the first Service is declared: an agent without Services leaves
// the host's sockets alone.
type lazyServices struct {
	cgroup string
	s      *datapath.Services
}

func (l *lazyServices) Replace(t service.Table) error {
	if l.s == nil {
		if len(t) == 0 {
			return nil
		}
		s, err := datapath.OpenServices(l.cgroup)
		if err != nil {
			return err
		}
		l.s = s
	}
	return l.s.Replace(t)
}

func (l *lazyServices) Close() error {
	if l.s == nil {
		return nil
	}
	return l.s.Close()
}

// dnsKernel is DNSKernel over the datapath's two concepts it spans: the proxy steering
// (SetDNSProxy) and the conntrack maps (ConntrackPeers).
type dnsKernel struct {
	*datapath.Proxy
	*datapath.Conntrack
}

// overlayKernel is Overlay over internal/overlay (the device, the routes) and the
// datapath's tunnel programs, whose VXLAN packets leave over underlay.
type overlayKernel struct {
	dp       *datapath.Tunnel
	underlay overlay.Underlay
}

func (k overlayKernel) SetupOverlay(netnsPath string, mode overlay.Mode) error {
	if err := k.setupOverlay(netnsPath, mode); err != nil {
		return err
	}
	// In every mode: copies for monitors on other nodes travel in a tunnel of their own.
	if _, err := overlay.EnsureTapDevice(netnsPath); err != nil {
		return fmt.Errorf("setting up the tap tunnel: %w", err)
	}
	if _, err := k.dp.AttachTapTunnel(netnsPath, overlay.TapDeviceName); err != nil {
		return err
	}
	return nil
}

func (k overlayKernel) setupOverlay(netnsPath string, mode overlay.Mode) error {
	if mode != overlay.IPIP {
		// Programs left on the fabric by an IP-in-IP run of this node.
		if err := k.dp.StopIPIP(netnsPath); err != nil {
			return err
		}
	}
	if mode != overlay.VXLAN {
		// No device: a mark left on a packet means nothing (rampart_to_ep). IP-in-IP
		// keeps its node address until SyncNodeRoutes writes it again, so that a restart
		// does not drop the remote pods' packets meanwhile.
		if idx, err := k.dp.TunnelIfindex(); err != nil {
			return err
		} else if idx != 0 {
			if err := k.dp.ClearTunnel(); err != nil {
				return err
			}
		}
		return overlay.DeleteDevice(netnsPath)
	}
	if _, err := overlay.EnsureDevice(netnsPath, k.underlay); err != nil {
		return fmt.Errorf("setting up the overlay: %w", err)
	}
	if _, err := k.dp.AttachTunnel(netnsPath, overlay.DeviceName); err != nil {
		return err
	}
	return nil
}

func (k overlayKernel) SyncNodeRoutes(netnsPath string, mode overlay.Mode, src netip.Addr, nodes []overlay.Node) error {
	if err := overlay.SyncRoutes(netnsPath, mode, src, nodes); err != nil {
		return fmt.Errorf("routes to the other nodes: %w", err)
	}
	// In every mode: the tap tunnel's copies use the map too.
	if err := k.dp.SetTunnelRemote6(overlay.Remote6(k.underlay, nodes)); err != nil {
		return fmt.Errorf("the nodes reached over the IPv6 fabric: %w", err)
	}
	if mode != overlay.IPIP {
		return nil
	}
	// IP-in-IP: the programs go on the interfaces the routes to the nodes leave through.
	fabric, local, err := overlay.Fabric(netnsPath, nodes)
	if err != nil {
		return fmt.Errorf("the IP-in-IP overlay's interfaces: %w", err)
	}
	if len(fabric) == 0 {
		return k.dp.StopIPIP(netnsPath)
	}
	return k.dp.AttachIPIP(netnsPath, local, fabric)
}

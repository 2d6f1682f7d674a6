package datapath

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// BPFFSRoot is where bpffs is mounted when it is not already.
const BPFFSRoot = "/sys/fs/bpf"

// Config configures Open.
type Config struct {
	// PinDir is the directory on a bpffs where the maps are pinned, for example
	// /sys/fs/bpf/rampart/<instance>. Required. Created if missing.
	PinDir string
	// Attach is how Attach puts the programs on an endpoint's veth ("": AttachTC).
	Attach AttachMode
	// CTTimeouts overrides the conntrack idle timeouts; zero fields keep the defaults.
	CTTimeouts CTTimeouts
	// CIDR6MaxEntries is the capacity of the IPv6 CIDR set trie (0:
	// DefaultCIDR6MaxEntries); a reload needs room for the old and new prefixes together.
	CIDR6MaxEntries uint32

	// maxEntries overrides map sizes by map name (tests: a tiny policy map to fill).
	maxEntries map[string]uint32
}

// CTTimeouts are conntrack idle timeouts (time since a flow's last packet).
type CTTimeouts struct {
	TCPSyn         time.Duration // TCP before the peer answered (default 60s)
	TCPEstablished time.Duration // TCP after a reply (default 6h)
	TCPClosing     time.Duration // TCP after RST, or FIN both ways (default 10s)
	Other          time.Duration // UDP, SCTP, ICMP echo, other protocols (default 60s)
}

// Datapath is the loaded dataplane of one agent instance, by kernel concept: each field is
// one concept's type, whose methods are safe for concurrent use, and which satisfies the
// agent's interface for that concept directly (see doc.go). They share the loaded objects
// and the record of what the maps hold through one handle.
type Datapath struct {
	// Endpoints attaches the programs to endpoint veths and holds each endpoint's info
	// and policy (the agent's EndpointTables).
	Endpoints *Endpoints
	// IPCache holds the identities of addresses and prefixes (the agent's IPCache).
	IPCache *IPCache
	// Events opens readers on the flow event ring buffer (the reader is the agent's
	// FlowEvents).
	Events *Events
	// Taps holds tap rules, their counters and the monitors' interfaces (the agent's
	// tap kernel).
	Taps *Taps
	// Tunnel attaches the VXLAN, IP-in-IP and tap tunnel programs (the agent's Overlay,
	// with internal/overlay).
	Tunnel *Tunnel
	// Proxy steers flows to the L7 and DNS proxies (the agent's ProxyRouting, and with
	// Conntrack its DNSKernel).
	Proxy *Proxy
	// Conntrack reads the conntrack maps.
	Conntrack *Conntrack
	// Host attaches host policy's programs to the node's devices (the agent's
	// HostDevices).
	Host *Host
	// Pins is the pinned maps: their directory, their memory, and the maps other packages
	// fill (the agent's MapMemories).
	Pins *Pins

	*handle
}

// newDatapath gives each concept its view of h.
func newDatapath(h *handle) *Datapath {
	return &Datapath{
		Endpoints: &Endpoints{h},
		IPCache:   &IPCache{h},
		Events:    &Events{h},
		Taps:      &Taps{h},
		Tunnel:    &Tunnel{h},
		Proxy:     &Proxy{h},
		Conntrack: &Conntrack{h},
		Host:      &Host{h},
		Pins:      &Pins{h},
		handle:    h,
	}
}

// Open mounts bpffs at /sys/fs/bpf if needed, loads the programs and maps (reusing maps
// already pinned under cfg.PinDir, pinning new ones there) and reads back the state the
// maps hold.
func Open(cfg Config) (*Datapath, error) {
	if cfg.PinDir == "" {
		return nil, errors.New("opening datapath: no pin directory")
	}
	attach, err := ParseAttachMode(string(cfg.Attach))
	if err != nil {
		return nil, fmt.Errorf("opening datapath: %w", err)
	}
	if err := ensureBPFFS(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.PinDir, 0o700); err != nil {
		return nil, fmt.Errorf("creating pin directory: %w", err)
	}
	if ok, err := isBPFFS(cfg.PinDir); err != nil {
		return nil, fmt.Errorf("checking pin directory: %w", err)
	} else if !ok {
		return nil, fmt.Errorf("pin directory %s is not on a bpf filesystem", cfg.PinDir)
	}

	spec, err := loadRampart()
	if err != nil {
		return nil, fmt.Errorf("loading dataplane spec: %w", err)
	}
	tick, err := kernelTick()
	if err != nil {
		return nil, fmt.Errorf("opening datapath: %w", err)
	}
	if err := setTimeouts(spec, cfg.CTTimeouts, tick); err != nil {
		return nil, err
	}
	if err := setFlowCache(spec, tick); err != nil {
		return nil, err
	}
	cidrInner, err := sizeCIDRMaps(spec, cfg)
	if err != nil {
		return nil, err
	}
	for name, n := range cfg.maxEntries {
		ms, ok := spec.Maps[name]
		if !ok {
			return nil, fmt.Errorf("sizing map %s: not in the BPF object", name)
		}
		ms.MaxEntries = n
	}
	legacyEndpoints, err := takeLegacyEndpoints(cfg.PinDir)
	if err != nil {
		return nil, err
	}
	d := newDatapath(&handle{pinDir: cfg.PinDir, attach: attach, cidrInner: cidrInner})
	if err := d.objs.loadCore(spec, cfg.PinDir); err != nil {
		if errors.Is(err, ebpf.ErrMapIncompatible) {
			return nil, fmt.Errorf("loading dataplane: a map pinned in %s has another layout "+
				"(left by an incompatible version; remove the pins to start afresh): %w", cfg.PinDir, err)
		}
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("loading dataplane: %+v", ve)
		}
		return nil, fmt.Errorf("loading dataplane: %w", err)
	}
	if _, err := migrateConntrack(cfg.PinDir, d.objs.Conntrack4Peer, d.objs.Ipcache, tick); err != nil {
		d.objs.Close()
		return nil, err
	}
	if err := migrateCounters(cfg.PinDir, d.objs.EndpointCounters); err != nil {
		d.objs.Close()
		return nil, err
	}
	if err := removeLegacyPins(cfg.PinDir); err != nil {
		d.objs.Close()
		return nil, err
	}
	if err := d.restoreEndpoints(legacyEndpoints); err != nil {
		d.objs.Close()
		return nil, err
	}
	if err := d.readState(); err != nil {
		d.objs.Close()
		return nil, err
	}
	if err := d.Proxy.initProxy(); err != nil {
		d.objs.Close()
		return nil, err
	}
	return d, nil
}

func setTimeouts(spec *ebpf.CollectionSpec, t CTTimeouts, tick time.Duration) error {
	for name, v := range map[string]time.Duration{
		rampartVarCtTimeoutTcpSyn:         t.TCPSyn,
		rampartVarCtTimeoutTcpEstablished: t.TCPEstablished,
		rampartVarCtTimeoutTcpClosing:     t.TCPClosing,
		rampartVarCtTimeoutOther:          t.Other,
	} {
		if v < 0 {
			return fmt.Errorf("conntrack timeout %s: negative", name)
		}
		vs, ok := spec.Variables[name]
		if !ok {
			return fmt.Errorf("conntrack timeout %s: not in the BPF object", name)
		}
		if v == 0 {
			// The default, compiled in as jiffies at RAMPART_DEFAULT_HZ: set it again at
			// the running kernel's rate.
			var j uint64
			if err := vs.Get(&j); err != nil {
				return fmt.Errorf("reading conntrack timeout %s: %w", name, err)
			}
			v = time.Duration(j) * time.Second / defaultHZ
		}
		if err := vs.Set(toJiffies(v, tick)); err != nil {
			return fmt.Errorf("setting conntrack timeout %s: %w", name, err)
		}
	}
	return nil
}

// defaultHZ is RAMPART_DEFAULT_HZ (common.h): the rate the compiled-in timeouts assume.
const defaultHZ = 100

// Close releases the datapath's file descriptors. Pinned maps and attached (pinned) links stay,
// so enforcement continues.
func (d *Datapath) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if err := d.objs.Close(); err != nil {
		return fmt.Errorf("closing datapath: %w", err)
	}
	return nil
}

// Remove unpins every map, removes the pin directory and closes the datapath. Filters still
// attached keep their programs (and through them the maps) alive until detached; Detach
// them first for a complete uninstall.
func (d *Datapath) Remove() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	var errs []error
	for _, m := range d.allMaps() {
		if err := m.Unpin(); err != nil {
			errs = append(errs, fmt.Errorf("unpinning map %s: %w", m, err))
		}
	}
	if err := d.objs.Close(); err != nil {
		errs = append(errs, fmt.Errorf("closing datapath: %w", err))
	}
	// RemoveAll: pins an older version left behind (maps it no longer has, such as the
	// conntrack maps of earlier versions) go too.
	if err := os.RemoveAll(d.pinDir); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("removing pin directory: %w", err))
	}
	return errors.Join(errs...)
}

// ensureBPFFS mounts bpffs at /sys/fs/bpf unless one is mounted there already.
func ensureBPFFS() error {
	ok, err := isBPFFS(BPFFSRoot)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("checking %s: %w", BPFFSRoot, err)
	}
	if ok {
		return nil
	}
	if err := os.MkdirAll(BPFFSRoot, 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", BPFFSRoot, err)
	}
	if err := unix.Mount("bpf", BPFFSRoot, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mounting bpffs at %s: %w", BPFFSRoot, err)
	}
	return nil
}

func isBPFFS(path string) (bool, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return false, err
	}
	return uint32(st.Type) == unix.BPF_FS_MAGIC, nil
}

package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/endpoint"
)

// ownedFileName is the instance's ownership record in its state directory.
const ownedFileName = "owned.json"

const ownedVersion = 1

// owned records what an instance made on the host that uninstall cannot find by name:
// the directories it created, the node namespace if it created it, addresses it put on
// the node's lo, the proxy's policy routing, and the previous value of each sysctl it
// changed. Each is recorded before it is made (a crash in between leaves a record of
// something missing, which uninstall skips, never something made and not recorded).
// Endpoint namespaces and veths follow from the endpoint records, pins from the BPF
// objects' pin names (FindPins) and state files from their names, so none of
// those are listed. Uninstall removes what is recorded and nothing else.
type owned struct {
	Version  int    `json:"version"`
	Instance string `json:"instance"`
	// StateDir, BPFDir and NodeNetns are where the instance lives; uninstall refuses
	// other places, and an agent refuses to move the instance.
	StateDir  string `json:"stateDir"`
	BPFDir    string `json:"bpfDir"`
	NodeNetns string `json:"nodeNetns,omitempty"`
	// Dirs are the directories the instance created, parents first; each is removed at
	// uninstall if it is empty once the instance's own files are gone.
	Dirs []string `json:"dirs,omitempty"`
	// NodeNetnsCreated: the instance created its (named) node namespace; uninstall
	// deletes it, and with it the node's addresses, routes, rules and sysctls.
	NodeNetnsCreated bool `json:"nodeNetnsCreated,omitempty"`
	// LoAddresses are the router addresses the instance added to the node's lo.
	LoAddresses []netip.Addr `json:"loAddresses,omitempty"`
	// ProxyRouting: the instance added the proxy's fwmark rule and local route
	// (datapath.SetupProxyRouting).
	ProxyRouting bool `json:"proxyRouting,omitempty"`
	// OverlayDevice and OverlayRoutes: the instance ran an overlay (made the VXLAN
	// device, or put the IP-in-IP programs on the fabric interfaces), and routes to
	// other nodes' pod CIDRs (internal/overlay, recognised by their route protocol).
	OverlayDevice bool `json:"overlayDevice,omitempty"`
	OverlayRoutes bool `json:"overlayRoutes,omitempty"`
	// TapDevice: the instance made the tap tunnel device (copies for monitors on other
	// nodes).
	TapDevice bool `json:"tapDevice,omitempty"`
	// HostDevices: the instance put the host programs on the node's interfaces (host
	// policy, Config.HostFirewall).
	HostDevices bool `json:"hostDevices,omitempty"`
	// Sysctls are the node namespace's settings the instance changed, in the order it
	// changed them, with the values they had before.
	Sysctls []sysctlChange `json:"sysctls,omitempty"`

	legacy bool // built for state an earlier version made, without a record
}

// sysctlChange is a setting under /proc/sys (net/ipv4/ip_forward) and its value before
// the instance changed it.
type sysctlChange struct {
	Key      string `json:"key"`
	Previous string `json:"previous"`
}

func ownedPath(stateDir string) string { return filepath.Join(stateDir, ownedFileName) }

// loadOwned reads the ownership record; nil if there is none.
func loadOwned(stateDir string) (*owned, error) {
	b, err := os.ReadFile(ownedPath(stateDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading ownership record: %w", err)
	}
	var o owned
	if err := json.Unmarshal(b, &o); err != nil {
		return nil, fmt.Errorf("decoding ownership record %s: %w", ownedPath(stateDir), err)
	}
	if o.Version != ownedVersion {
		return nil, fmt.Errorf("ownership record %s: version %d, want %d", ownedPath(stateDir), o.Version, ownedVersion)
	}
	return &o, nil
}

// save writes the record atomically (writeFileAtomic).
func (o *owned) save() error {
	b, err := json.MarshalIndent(o, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding ownership record: %w", err)
	}
	if err := writeFileAtomic(ownedPath(o.StateDir), append(b, '\n')); err != nil {
		return fmt.Errorf("saving ownership record: %w", err)
	}
	if err := syncDir(o.StateDir); err != nil {
		return fmt.Errorf("saving ownership record: %w", err)
	}
	return nil
}

// missingDirs returns path and those of its parents that do not exist, parents first:
// the directories creating path will create.
func missingDirs(path string) []string {
	var out []string
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); err == nil || p == filepath.Dir(p) {
			break
		}
		out = append(out, p)
	}
	slices.Reverse(out)
	return out
}

// addDirs records directories the instance created (or is about to create).
func (o *owned) addDirs(dirs ...string) {
	for _, d := range dirs {
		if d = absPath(d); !slices.Contains(o.Dirs, d) {
			o.Dirs = append(o.Dirs, d)
		}
	}
}

// absPath makes a configured path absolute and clean, so records compare equal
// whatever form the flags took.
func absPath(p string) string {
	if a, err := filepath.Abs(p); err == nil {
		return a
	}
	return filepath.Clean(p)
}

// subdirs are the instance's own subdirectories (and the proxy's run directory), made
// when first needed; with host, the pin directory's too.
func (cfg Config) subdirs(host bool) []string {
	d := []string{endpointDir(cfg.StateDir), setDir(cfg.StateDir), cfg.proxyRunDir()}
	if host {
		d = append(d, filepath.Join(cfg.BPFDir, datapath.LinkPinDir))
	}
	return d
}

// openOwned loads the instance's ownership record, or starts one, and checks that cfg
// places the instance where the record says it lives. missing are the directories that
// did not exist before the agent started creating its own (missingDirs). A state
// directory with an earlier version's state and no record is taken as that version's:
// what it would have made and exists now is recorded as the instance's (see legacyOwned).
func openOwned(cfg Config, missing []string, host bool) (*owned, error) {
	o, err := loadOwned(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	if o == nil {
		st, err := loadState(cfg.StateDir)
		if err != nil {
			return nil, err
		}
		if _, serr := os.Stat(statePath(cfg.StateDir)); serr == nil && st.Instance == cfg.Instance {
			if o, err = legacyOwned(cfg, host); err != nil {
				return nil, err
			}
		} else {
			o = newOwned(cfg)
		}
	} else if err := o.matches(cfg); err != nil {
		return nil, err
	}
	o.addDirs(missing...)
	for _, d := range cfg.subdirs(host) {
		o.addDirs(missingDirs(d)...)
	}
	return o, nil
}

func newOwned(cfg Config) *owned {
	return &owned{Version: ownedVersion, Instance: cfg.Instance, StateDir: absPath(cfg.StateDir),
		BPFDir: absPath(cfg.BPFDir), NodeNetns: cfg.NodeNetns}
}

// matches checks that cfg names the place the record describes.
func (o *owned) matches(cfg Config) error {
	where := ownedPath(cfg.StateDir)
	switch {
	case o.Instance != cfg.Instance:
		return fmt.Errorf("--state-dir %s: holds Rampart instance %q, not %q (%s)", cfg.StateDir, o.Instance, cfg.Instance, where)
	case absPath(cfg.BPFDir) != o.BPFDir:
		return fmt.Errorf("--bpf-dir %s: instance %q pins its dataplane in %s, not here (%s)", cfg.BPFDir, cfg.Instance, o.BPFDir, where)
	case cfg.NodeNetns != o.NodeNetns:
		return fmt.Errorf("--node-netns %q: instance %q runs in node namespace %q (%s)", cfg.NodeNetns, cfg.Instance, o.NodeNetns, where)
	}
	return nil
}

// legacyOwned builds the record of an instance an earlier version made (state, no
// record). That version made its state and pin directories, their subdirectories, the
// named node namespace, the router address and the proxy routing, and removed them all
// at uninstall: what of it exists now is the instance's. It did not record sysctls, which
// therefore cannot be restored.
func legacyOwned(cfg Config, host bool) (*owned, error) {
	o := newOwned(cfg)
	o.legacy = true
	exists := func(p string) bool { _, err := os.Lstat(p); return err == nil }
	o.addDirs(o.StateDir)
	for _, d := range cfg.subdirs(false) {
		if exists(d) {
			o.addDirs(d)
		}
	}
	if !host {
		return o, nil
	}
	if pins, err := FindPins(cfg.BPFDir); err != nil {
		return nil, err
	} else if len(pins) > 0 {
		o.addDirs(o.BPFDir)
		if d := filepath.Join(o.BPFDir, datapath.LinkPinDir); exists(d) {
			o.addDirs(d)
		}
	}
	node := endpoint.Node{Instance: cfg.Instance, Netns: cfg.NodeNetns, PodCIDR: cfg.PodCIDR, PodCIDR6: cfg.PodCIDR6}
	if cfg.NodeNetns != "" {
		o.NodeNetnsCreated = endpoint.NetnsExists(cfg.NodeNetns)
		return o, nil
	}
	for _, addr := range routerAddrs(node) {
		if has, err := node.HasLoAddress(addr); err != nil {
			return nil, err
		} else if has {
			o.LoAddresses = append(o.LoAddresses, addr)
		}
	}
	present, err := datapath.ProxyRouting(node.NetnsPath())
	if err != nil {
		return nil, err
	}
	o.ProxyRouting = present
	return o, nil
}

// recordNode records, before Node.Setup runs, what it will make: the node namespace
// if it is named and missing, the router address if lo lacks it, the previous value
// of each sysctl it changes (not in a namespace the instance made: that goes whole).
func (o *owned) recordNode(node endpoint.Node) error {
	if node.Netns != "" && !o.NodeNetnsCreated && !endpoint.NetnsExists(node.Netns) {
		o.NodeNetnsCreated = true
	}
	if o.NodeNetnsCreated {
		return o.save()
	}
	for _, addr := range routerAddrs(node) {
		if slices.Contains(o.LoAddresses, addr) {
			continue
		}
		has, err := node.HasLoAddress(addr)
		if err != nil {
			return err
		}
		if !has {
			o.LoAddresses = append(o.LoAddresses, addr)
		}
	}
	sysctls := node.Sysctls()
	for _, k := range slices.Sorted(maps.Keys(sysctls)) {
		if err := o.recordSysctl(node.NetnsPath(), k, sysctls[k]); err != nil {
			return err
		}
	}
	return o.save()
}

// routerAddrs are the addresses Node.Setup puts on the node's lo: the router's, and on a
// dual-stack node its IPv6 one.
func routerAddrs(node endpoint.Node) []netip.Addr {
	if node.DualStack() {
		return []netip.Addr{node.Router(), node.Router6()}
	}
	return []netip.Addr{node.Router()}
}

// recordProxyNamespace records the previous values of the sysctls
// datapath.PrepareProxyNamespace changes.
func (o *owned) recordProxyNamespace(netnsPath string) error {
	if o.NodeNetnsCreated {
		return nil
	}
	for _, s := range datapath.ProxySysctls() {
		if err := o.recordSysctl(netnsPath, s.Key, s.Value); err != nil {
			return err
		}
	}
	return o.save()
}

// recordProxyRouting records, before datapath.SetupProxyRouting runs, whether it will add
// the proxy's rule and route (not if they are there already: someone else's).
func (o *owned) recordProxyRouting(netnsPath string) error {
	if o.NodeNetnsCreated || o.ProxyRouting {
		return nil
	}
	present, err := datapath.ProxyRouting(netnsPath)
	if err != nil {
		return err
	}
	if present {
		return nil
	}
	o.ProxyRouting = true
	return o.save()
}

// recordSysctl records key's current value if it differs from want and the key is not
// recorded yet (the first value recorded is the one from before the instance).
func (o *owned) recordSysctl(netnsPath, key, want string) error {
	for _, s := range o.Sysctls {
		if s.Key == key {
			return nil
		}
	}
	cur, err := endpoint.ReadSysctl(netnsPath, key)
	if err != nil {
		return err
	}
	if cur != want {
		o.Sysctls = append(o.Sysctls, sysctlChange{Key: key, Previous: cur})
	}
	return nil
}

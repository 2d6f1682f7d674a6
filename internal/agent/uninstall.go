package agent

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/rampartnet/rampart/internal/api"
	"github.com/rampartnet/rampart/internal/datapath"
	"github.com/rampartnet/rampart/internal/endpoint"
	"github.com/rampartnet/rampart/internal/monitor/suricata"
	"github.com/rampartnet/rampart/internal/overlay"
	"golang.org/x/sys/unix"
)

// ErrNotInstalled is Uninstall's error when the state directory holds no record and no
// state of the instance: nothing says anything there is the instance's, so nothing is
// removed. An uninstall run on every node (rampartd --uninstall --if-installed) takes it
// as "nothing to do".
var ErrNotInstalled = errors.New("no Rampart instance")

// Uninstall removes what an agent with this configuration made, and nothing else: every
// endpoint's veth and network namespace, the dataplane's pins, the state files, the proxy's
// run files, the monitors' directories that `rampart monitor run` wrote, and what its ownership record (owned.go) lists: the node namespace or the
// router address, the proxy's policy routing, the sysctls it changed (restored to their
// previous values) and the directories it created (each only if empty once the
// instance's own files are gone). It refuses, before removing anything, a state
// directory that holds no state of this instance, and a pin directory other than the one
// the instance uses or that holds none of its pins. The agent must not be running.
func Uninstall(cfg Config) error {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return err
	}
	o, st, err := findInstance(cfg)
	if err != nil {
		return err
	}
	pins, err := instancePins(cfg, o)
	if err != nil {
		return err
	}
	// Refuse while an agent answers: it would recreate what we remove. A stale socket
	// goes with the probe.
	if fi, err := os.Lstat(cfg.Socket); err == nil && fi.Mode()&os.ModeSocket != 0 {
		release, err := listenProbe(cfg.Socket)
		if err != nil {
			return err
		}
		release()
	}
	unlock, err := lockInstance(cfg.StateDir)
	if err != nil {
		return err
	}
	defer unlock()

	var errs []error
	netw := cfg.Network
	if netw == nil {
		netw = endpoint.Node{Instance: cfg.Instance, Netns: cfg.NodeNetns, PodCIDR: cfg.PodCIDR}
	}
	// A named node namespace that is gone (a reboot) took the host-side veths with it:
	// only the endpoints' namespaces are left to delete.
	nodeGone := cfg.Network == nil && cfg.NodeNetns != "" && !endpoint.NetnsExists(cfg.NodeNetns)
	for _, e := range st.Endpoints {
		var err error
		switch {
		case e.CNI != nil && nodeGone:
			// The runtime's namespace is the runtime's; its veth went with the node.
		case e.CNI != nil:
			err = netw.DeleteLink(e.Namespace, e.Name)
		case nodeGone:
			err = endpoint.DeleteNetns(netw.EndpointNetns(e.Namespace, e.Name))
		default:
			err = netw.Delete(e.Namespace, e.Name)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("deleting endpoint %s: %w", e.Key(), err))
		}
	}
	// Removing a link's pin detaches it (nothing else holds it once the agent is gone);
	// a map goes with the last pin and program that use it.
	for _, p := range pins {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing pin: %w", err))
		}
	}
	if cfg.Network != nil {
		// A test's stand-in network.
		if err := netw.Teardown(); err != nil {
			errs = append(errs, fmt.Errorf("removing node network setup: %w", err))
		}
	} else {
		errs = append(errs, undoNode(cfg, o)...)
	}
	if len(errs) > 0 {
		// The state and the record stay, so that uninstall can be run again.
		return errors.Join(errs...)
	}
	errs = append(errs, removeStateFiles(cfg)...)
	// The record last: what it lists is gone.
	if err := os.Remove(ownedPath(cfg.StateDir)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("removing ownership record: %w", err))
	}
	if err := os.Remove(filepath.Join(cfg.StateDir, lockName)); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, fmt.Errorf("removing instance lock: %w", err))
	}
	// Children before parents; a directory that still holds something (not the
	// instance's) stays.
	dirs := slices.Clone(o.Dirs)
	slices.SortFunc(dirs, func(a, b string) int { return len(b) - len(a) })
	for _, d := range dirs {
		if err := os.Remove(d); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.ENOTEMPTY) {
			errs = append(errs, fmt.Errorf("removing directory %s: %w", d, err))
		} else if err != nil && errors.Is(err, unix.ENOTEMPTY) {
			cfg.Logger.Info("directory kept: it holds files the instance did not make", "dir", d)
		}
	}
	return errors.Join(errs...)
}

// findInstance reads the instance's ownership record and state from its state directory,
// refusing a directory that holds neither for this instance.
func findInstance(cfg Config) (*owned, *stateFile, error) {
	fi, err := os.Stat(cfg.StateDir)
	if err != nil {
		return nil, nil, fmt.Errorf("--state-dir %s: %w %q here (%w)", cfg.StateDir, ErrNotInstalled, cfg.Instance, err)
	}
	if !fi.IsDir() {
		return nil, nil, fmt.Errorf("--state-dir %s: not a directory", cfg.StateDir)
	}
	o, err := loadOwned(cfg.StateDir)
	if err != nil {
		return nil, nil, err
	}
	st, err := loadState(cfg.StateDir)
	if err != nil {
		return nil, nil, err
	}
	_, serr := os.Stat(statePath(cfg.StateDir))
	hasState := serr == nil
	if hasState && st.Instance != cfg.Instance {
		return nil, nil, fmt.Errorf("--state-dir %s: holds Rampart instance %q, not %q (%s)", cfg.StateDir, st.Instance, cfg.Instance, statePath(cfg.StateDir))
	}
	if o == nil {
		if !hasState {
			return nil, nil, fmt.Errorf("--state-dir %s: %w %q here (no %s or %s of instance %s)",
				cfg.StateDir, ErrNotInstalled, cfg.Instance, ownedFileName, stateFileName, cfg.Instance)
		}
		// An earlier version's instance.
		if o, err = legacyOwned(cfg, cfg.Network == nil); err != nil {
			return nil, nil, err
		}
	} else if err := o.matches(cfg); err != nil {
		return nil, nil, err
	}
	return o, st, nil
}

// instancePins returns the instance's pins in its pin directory. It refuses a pin
// directory that is not on a bpffs, or that holds none of the dataplane's pins when the
// record does not name it (an earlier version's instance): nothing says it is the
// instance's.
func instancePins(cfg Config, o *owned) ([]string, error) {
	if cfg.Network != nil || cfg.OpenKernel != nil {
		return nil, nil // tests standing in for the dataplane: no pins
	}
	if _, err := os.Stat(cfg.BPFDir); errors.Is(err, os.ErrNotExist) {
		return nil, nil // never made, or gone (a reboot empties bpffs)
	}
	ok, err := datapath.IsBPFFS(cfg.BPFDir)
	if err != nil {
		return nil, fmt.Errorf("--bpf-dir %s: %w", cfg.BPFDir, err)
	}
	if !ok {
		return nil, fmt.Errorf("--bpf-dir %s: not on a bpf filesystem, so no Rampart pins", cfg.BPFDir)
	}
	pins, err := FindPins(cfg.BPFDir)
	if err != nil {
		return nil, fmt.Errorf("--bpf-dir %s: %w", cfg.BPFDir, err)
	}
	if len(pins) == 0 && o.legacy {
		return nil, fmt.Errorf("--bpf-dir %s: holds none of the pins of Rampart instance %q", cfg.BPFDir, cfg.Instance)
	}
	return pins, nil
}

// undoNode undoes what the record says the instance did to the node: the proxy's routing,
// the router addresses and the sysctls in a node namespace it did not create, or the
// whole namespace it did.
func undoNode(cfg Config, o *owned) []error {
	node := endpoint.Node{Instance: cfg.Instance, Netns: cfg.NodeNetns, PodCIDR: cfg.PodCIDR}
	if o.NodeNetnsCreated {
		if err := endpoint.DeleteNetns(cfg.NodeNetns); err != nil {
			return []error{fmt.Errorf("removing node network namespace: %w", err)}
		}
		return nil
	}
	if cfg.NodeNetns != "" && !endpoint.NetnsExists(cfg.NodeNetns) {
		return nil // someone else's namespace, gone with what the instance did in it
	}
	var errs []error
	if o.OverlayRoutes {
		if err := overlay.RemoveRoutes(node.NetnsPath()); err != nil {
			errs = append(errs, err)
		}
	}
	if o.OverlayDevice {
		if err := overlay.DeleteDevice(node.NetnsPath()); err != nil {
			errs = append(errs, err)
		}
		// The IP-in-IP programs on the fabric interfaces, which are not the instance's.
		if _, err := datapath.DetachIPIP(node.NetnsPath()); err != nil {
			errs = append(errs, err)
		}
	}
	if o.HostDevices {
		// The host programs on the node's interfaces, which are not the instance's.
		if _, err := datapath.DetachHost(node.NetnsPath()); err != nil {
			errs = append(errs, err)
		}
	}
	if o.TapDevice {
		if err := overlay.DeleteTapDevice(node.NetnsPath()); err != nil {
			errs = append(errs, err)
		}
	}
	if o.ProxyRouting {
		if err := datapath.TeardownProxyRouting(node.NetnsPath()); err != nil {
			errs = append(errs, err)
		}
	}
	for _, a := range o.LoAddresses {
		if err := node.RemoveLoAddress(a); err != nil {
			errs = append(errs, err)
		}
	}
	for i := len(o.Sysctls) - 1; i >= 0; i-- {
		s := o.Sysctls[i]
		if err := endpoint.WriteSysctl(node.NetnsPath(), s.Key, s.Previous); err != nil {
			errs = append(errs, fmt.Errorf("restoring %s: %w", s.Key, err))
		}
	}
	return errs
}

// Files of the instance in its state directory, besides the record and the lock.
var (
	// A temporary file of an atomic write (stateStore.save, owned.save, setStore.write).
	tmpFileRE = regexp.MustCompile(`^(` + regexp.QuoteMeta(stateFileName) + `|` + regexp.QuoteMeta(ownedFileName) + `)\.tmp[0-9]+$`)
	// An endpoint's state file (endpointFile), or a temporary file of its atomic write.
	endpointFileRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?_[a-z0-9]([-a-z0-9.]*[a-z0-9])?\.json(\.tmp[0-9]+)?$`)
	// A CIDR set's base, journal or temporary base (cidrsetfile.go).
	setFileRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?(\.set|\.log|\.set\.tmp[0-9]+)$`)
	// The proxy's run files (internal/proxy: sockets, bootstrap, log and its rotation).
	proxyRunFiles = []string{"xds.sock", "admin.sock", "envoy.json", "envoy.log", "envoy.log.1"}
)

// removeStateFiles removes the instance's files from its state directory: the state, the
// endpoint files, temporary files of its atomic writes, the CIDR set files (recognised by
// name and magic, so a file of someone else's that happens to end in .log stays) and the
// proxy's run files.
func removeStateFiles(cfg Config) []error {
	var errs []error
	rm := func(p string) {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing %s: %w", p, err))
		}
	}
	rm(statePath(cfg.StateDir))
	if ents, err := os.ReadDir(cfg.StateDir); err == nil {
		for _, e := range ents {
			if e.Type().IsRegular() && tmpFileRE.MatchString(e.Name()) {
				rm(filepath.Join(cfg.StateDir, e.Name()))
			}
		}
	}
	if ents, err := os.ReadDir(endpointDir(cfg.StateDir)); err == nil {
		for _, e := range ents {
			if e.Type().IsRegular() && endpointFileRE.MatchString(e.Name()) {
				rm(filepath.Join(endpointDir(cfg.StateDir), e.Name()))
			}
		}
	}
	if ents, err := os.ReadDir(setDir(cfg.StateDir)); err == nil {
		for _, e := range ents {
			p := filepath.Join(setDir(cfg.StateDir), e.Name())
			if e.Type().IsRegular() && setFileRE.MatchString(e.Name()) && isSetFile(p) {
				rm(p)
			}
		}
	}
	for _, f := range proxyRunFiles {
		rm(filepath.Join(cfg.proxyRunDir(), f))
	}
	errs = append(errs, removeMonitorDirs(cfg)...)
	return errs
}

// removeMonitorDirs removes the monitors' directories that `rampart monitor run` made
// in the state directory (api.MonitorsDirName/NAMESPACE/NAME): what Suricata and the
// command wrote there, then each directory once empty. A file that is not a monitor's
// keeps its directory.
func removeMonitorDirs(cfg Config) []error {
	var errs []error
	top := filepath.Join(cfg.StateDir, api.MonitorsDirName)
	nss, err := os.ReadDir(top)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return []error{fmt.Errorf("reading monitor directories: %w", err)}
	}
	for _, ns := range nss {
		if !ns.IsDir() {
			continue
		}
		nsDir := filepath.Join(top, ns.Name())
		names, err := os.ReadDir(nsDir)
		if err != nil {
			errs = append(errs, fmt.Errorf("reading monitor directories: %w", err))
			continue
		}
		for _, n := range names {
			if !n.IsDir() {
				continue
			}
			dir := filepath.Join(nsDir, n.Name())
			if gone, err := suricata.RemoveDir(dir); err != nil {
				errs = append(errs, fmt.Errorf("monitor directory %s: %w", dir, err))
			} else if !gone {
				cfg.Logger.Info("directory kept: it holds files the instance did not make", "dir", dir)
			}
		}
		removeIfEmpty(cfg, nsDir, &errs)
	}
	removeIfEmpty(cfg, top, &errs)
	return errs
}

// removeIfEmpty removes dir unless it holds something.
func removeIfEmpty(cfg Config, dir string, errs *[]error) {
	err := os.Remove(dir)
	switch {
	case err == nil, errors.Is(err, os.ErrNotExist):
	case errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST):
		cfg.Logger.Info("directory kept: it holds files the instance did not make", "dir", dir)
	default:
		*errs = append(*errs, fmt.Errorf("removing directory %s: %w", dir, err))
	}
}

// isSetFile reports whether the file at p is a CIDR set base or journal (by its magic),
// or empty (a temporary base a crash left before its first write).
func isSetFile(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	b := make([]byte, len(setFileMagic))
	n, err := io.ReadFull(f, b)
	if n == 0 && (err == io.EOF) {
		return strings.Contains(filepath.Base(p), setFileExt+".tmp")
	}
	return bytes.Equal(b[:n], []byte(setFileMagic)) || bytes.Equal(b[:n], []byte(setLogMagic))
}

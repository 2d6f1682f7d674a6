package datapath

import (
	"errors"
	"fmt"

	"github.com/cilium/ebpf"
)

// The dataplane's programs load in groups. Open loads the maps and the programs every node
// runs: the endpoint programs with the IPv6 path they tail-call into, and the monitor's
// return program. The host firewall's, each overlay's and the tap tunnel's programs load
// the first time they are attached. The verifier is most of what opening costs (about a
// second of CPU for each program of 800k instructions), and a node runs at most one
// overlay and the host firewall only when asked.
//
// A group loads from the same specification as the core (map sizes, timeouts and flow
// cache settings applied), sharing every map: the pinned ones by their pins, the unpinned
// ones (the flow cache and the tail call arrays) by replacement. The tail call arrays get
// their entries from the group whose programs fill them, so no program is verified twice.

// corePrograms are the programs Open loads.
type corePrograms struct {
	RampartFromEp      *ebpf.Program `ebpf:"rampart_from_ep"`
	RampartToEp        *ebpf.Program `ebpf:"rampart_to_ep"`
	RampartFromMonitor *ebpf.Program `ebpf:"rampart_from_monitor"`
}

func (p *corePrograms) Close() error {
	return closeAll(p.RampartFromEp, p.RampartToEp, p.RampartFromMonitor)
}

// hostPrograms are host policy's (AttachHost); their IPv6 path is ipv6_path's host entries.
type hostPrograms struct {
	tailCalls
	RampartFromHost *ebpf.Program `ebpf:"rampart_from_host"`
	RampartToHost   *ebpf.Program `ebpf:"rampart_to_host"`
}

// vxlanPrograms are the VXLAN overlay's (AttachTunnel); their IPv6 path is tunnel6_path.
type vxlanPrograms struct {
	tailCalls
	RampartFromTunnel *ebpf.Program `ebpf:"rampart_from_tunnel"`
	RampartToTunnel   *ebpf.Program `ebpf:"rampart_to_tunnel"`
}

// ipipPrograms are the IP-in-IP overlay's (AttachIPIP).
type ipipPrograms struct {
	tailCalls
	RampartFromIpip *ebpf.Program `ebpf:"rampart_from_ipip"`
	RampartToIpip   *ebpf.Program `ebpf:"rampart_to_ipip"`
}

// tapTunnelPrograms are the tap tunnel device's (AttachTapTunnel).
type tapTunnelPrograms struct {
	tailCalls
	RampartFromTapTunnel *ebpf.Program `ebpf:"rampart_from_tap_tunnel"`
}

// tailCalls are a group's handles on the shared tail call arrays: the loader wants them
// taken (an array it closed would lose its entries), and they are closed with the group.
type tailCalls struct {
	Ipv6Path    *ebpf.Map `ebpf:"ipv6_path"`
	Tunnel6Path *ebpf.Map `ebpf:"tunnel6_path"`
}

func (t tailCalls) close() error {
	var errs []error
	for _, m := range []*ebpf.Map{t.Ipv6Path, t.Tunnel6Path} {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}

// tailCallsOf says which programs fill which tail call array's entries: the core's
// ipv6_path entries, the host group's, the VXLAN group's tunnel6_path.
var tailCallsOf = map[string]map[string][]string{
	"core":  {"ipv6_path": {"rampart_from_ep6", "rampart_to_ep6"}},
	"host":  {"ipv6_path": {"rampart_from_host6", "rampart_to_host6"}},
	"vxlan": {"tunnel6_path": {"rampart_from_tunnel6", "rampart_to_tunnel6"}},
}

// dataplaneObjects are the loaded maps and programs.
type dataplaneObjects struct {
	rampartMaps
	rampartVariables
	corePrograms

	spec   *ebpf.CollectionSpec // what Open loaded from, for the groups loaded later
	pinDir string
	// The groups loaded later (nil until then); guarded by the Datapath's mu.
	host      *hostPrograms
	vxlan     *vxlanPrograms
	ipip      *ipipPrograms
	tapTunnel *tapTunnelPrograms
}

// loadCore loads the maps and the core programs from spec.
func (o *dataplaneObjects) loadCore(spec *ebpf.CollectionSpec, pinDir string) error {
	o.spec, o.pinDir = spec, pinDir
	core := withTailCalls(spec, "core")
	var loaded struct {
		rampartMaps
		rampartVariables
		corePrograms
	}
	if err := core.LoadAndAssign(&loaded, &ebpf.CollectionOptions{Maps: ebpf.MapOptions{PinPath: pinDir}}); err != nil {
		return err
	}
	o.rampartMaps, o.rampartVariables, o.corePrograms = loaded.rampartMaps, loaded.rampartVariables, loaded.corePrograms
	return nil
}

// withTailCalls is a copy of spec whose tail call arrays hold only the entries of group.
func withTailCalls(spec *ebpf.CollectionSpec, group string) *ebpf.CollectionSpec {
	s := spec.Copy()
	for _, name := range []string{"ipv6_path", "tunnel6_path"} {
		ms := s.Maps[name]
		keep := tailCallsOf[group][name]
		var contents []ebpf.MapKV
		for _, kv := range ms.Contents {
			if prog, ok := kv.Value.(string); ok && contains(keep, prog) {
				contents = append(contents, kv)
			}
		}
		ms.Contents = contents
	}
	return s
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// loadGroup loads a group's programs into into (a *hostPrograms, ...), sharing the core's
// maps.
func (o *dataplaneObjects) loadGroup(group string, into any) error {
	s := withTailCalls(o.spec, group)
	opts := &ebpf.CollectionOptions{
		Maps: ebpf.MapOptions{PinPath: o.pinDir},
		MapReplacements: map[string]*ebpf.Map{
			"flow_cache":   o.FlowCache,
			"flow_cache6":  o.FlowCache6,
			"ipv6_path":    o.Ipv6Path,
			"tunnel6_path": o.Tunnel6Path,
		},
	}
	if err := s.LoadAndAssign(into, opts); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return fmt.Errorf("loading the %s programs: %+v", group, ve)
		}
		return fmt.Errorf("loading the %s programs: %w", group, err)
	}
	return nil
}

// hostProgs returns host policy's programs, loading them the first time. The caller holds
// the handle's mu (programs).
func (o *dataplaneObjects) hostProgs() (*hostPrograms, error) { return loadOnce(o, &o.host, "host") }

// vxlanProgs returns the VXLAN overlay's programs (hostProgs).
func (o *dataplaneObjects) vxlanProgs() (*vxlanPrograms, error) {
	return loadOnce(o, &o.vxlan, "vxlan")
}

// ipipProgs returns the IP-in-IP overlay's programs (hostProgs).
func (o *dataplaneObjects) ipipProgs() (*ipipPrograms, error) { return loadOnce(o, &o.ipip, "ipip") }

// tapTunnelProgs returns the tap tunnel's program (hostProgs).
func (o *dataplaneObjects) tapTunnelProgs() (*tapTunnelPrograms, error) {
	return loadOnce(o, &o.tapTunnel, "tap tunnel")
}

// loadOnce returns *slot, loading group into it first if it is not loaded.
func loadOnce[P any](o *dataplaneObjects, slot **P, group string) (*P, error) {
	if *slot == nil {
		var p P
		if err := o.loadGroup(group, &p); err != nil {
			return nil, err
		}
		*slot = &p
	}
	return *slot, nil
}

// Close closes the maps and every loaded program.
func (o *dataplaneObjects) Close() error {
	var ps []*ebpf.Program
	var errs []error
	if o.host != nil {
		ps = append(ps, o.host.RampartFromHost, o.host.RampartToHost)
		errs = append(errs, o.host.close())
	}
	if o.vxlan != nil {
		ps = append(ps, o.vxlan.RampartFromTunnel, o.vxlan.RampartToTunnel)
		errs = append(errs, o.vxlan.close())
	}
	if o.ipip != nil {
		ps = append(ps, o.ipip.RampartFromIpip, o.ipip.RampartToIpip)
		errs = append(errs, o.ipip.close())
	}
	if o.tapTunnel != nil {
		ps = append(ps, o.tapTunnel.RampartFromTapTunnel)
		errs = append(errs, o.tapTunnel.close())
	}
	errs = append(errs, o.corePrograms.Close(), closeAll(ps...), o.rampartMaps.Close())
	return errors.Join(errs...)
}

func closeAll(ps ...*ebpf.Program) error {
	var errs []error
	for _, p := range ps {
		if p != nil {
			errs = append(errs, p.Close())
		}
	}
	return errors.Join(errs...)
}

// programs runs load (one of dataplaneObjects' group accessors) under d.mu.
func programs[P any](d *handle, load func(*dataplaneObjects) (*P, error)) (*P, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return load(&d.objs)
}
